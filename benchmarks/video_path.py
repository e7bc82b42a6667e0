"""Seconds per video of the Nemotron 3 Omni video path against a minimal inline PyAV floor.

Ours, per video: ``video_metadata`` (headers) + ``plan_video`` (``sampling: midpoints``, ``resize: pil``,
the path this floor mirrors; otherwise default options: 2 fps, 8..32 frames, ~1024 patches per frame)
+ ``process_video`` (Energon ``AVDecoder.get_video_clips`` of the chosen frames only, PIL bicubic
resize, ``/255``, CLIP mean/std, patchify to ``float32 [patches, 768]``, last tubelet padded). The
default ``hf`` sampling decodes forward by frame index instead and resizes in float32
(``image_processor.py`` measures that resize against the processor itself).

The floor, on the same bytes and the same planned times (given, not planned), in the same run: open
with PyAV (codec threads off, as Energon does), one seek to the first time, decode forward taking
the frame that covers each planned time (``to_ndarray("rgb24")``), PIL bicubic resize, in-place numpy
``/255 - mean / std``, one transpose copy into patch order, the last frame repeated for an odd count,
``torch.from_numpy``. (A single forward pass from the first keyframe is the least decoding possible
when the chosen frames lie in one or few GOPs, as in these libx264/libvpx clips.)

Videos (``make_video``, cached in ``benchmarks/.cache/video``): H.264 MP4, VP8 WebM and H.264 MKV at
several sizes and lengths; ``--quick`` uses smaller, shorter ones. Rounds alternate which side runs
first; each side's time is the median over rounds of the round's total. ``ratio`` = ours / floor
seconds (goal <= 1.25, lower is better); also per-video medians in ms and ``max_abs_diff`` of the
two outputs (the same frames must come out).

The cost of NeMo-RL's augmentation, in the same run: the ``nemo_rl`` sampling without it and with
production's (a scale drawn from 1 … 4 applied to the resolution only, ``augment_frames_up: 4,
augment_resolution_only: true``) plus the temporal jitter, each round drawing anew (the draw key
names the round as its pass). ``augment_fps`` / ``plain_fps``: frames decoded and patchified per
second (frames planned ÷ seconds); ``augment_ratio`` = augmented ÷ plain frames per second.
"""

from __future__ import annotations

import argparse
import io
import sys

import _common as C

GOAL = 1.25
# (container, codec, width, height, seconds, fps)
FULL = (("mp4", "libx264", 640, 360, 8.0, 30), ("webm", "libvpx", 480, 270, 6.0, 25),
        ("matroska", "libx264", 1280, 720, 4.0, 30), ("mp4", "libx264", 360, 640, 20.0, 30))
QUICK = (("mp4", "libx264", 320, 180, 5.0, 30), ("webm", "libvpx", 240, 136, 4.0, 25),
         ("matroska", "libx264", 640, 360, 3.0, 30))


def cached_video(spec) -> bytes:
    """``make_video`` bytes for ``spec``, generated once into ``benchmarks/.cache/video``."""
    from energon_nemotron.demo.media import make_video

    container, codec, w, h, seconds, fps = spec
    path = C.CACHE_DIR / "video" / f"{container}_{codec}_{w}x{h}_{seconds:g}s_{fps}fps.bin"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(make_video(w, h, seconds, fps, seed=1, container=container, codec=codec))
    return path.read_bytes()


def floor_process(data: bytes, times, grid_h: int, grid_w: int, patch: int, av, np, torch, Image,
                  mean, std):
    """Minimal PyAV path: one seek, decode forward picking the frames at ``times``, resize, normalise,
    patchify, repeat the last frame for an odd count (frame size given, not planned)."""
    frames = []
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        stream.codec_context.thread_type = "NONE"
        step = 1.0 / float(stream.average_rate)
        container.seek(int(times[0] / stream.time_base), stream=stream)
        pending = list(times)
        for frame in container.decode(stream):
            while pending and frame.time + step > pending[0]:
                frames.append(frame.to_ndarray(format="rgb24"))
                pending.pop(0)
            if not pending:
                break
    size = (grid_w * patch, grid_h * patch)
    rows = []
    for arr in frames:
        img = Image.fromarray(arr)
        if img.size != size:
            img = img.resize(size, Image.Resampling.BICUBIC)
        x = np.asarray(img, dtype=np.float32)
        x /= 255.0
        x -= mean
        x /= std
        rows.append(x.reshape(grid_h, patch, grid_w, patch, 3).transpose(0, 2, 4, 1, 3)
                    .reshape(grid_h * grid_w, 3 * patch * patch))
    if len(rows) % 2:
        rows.append(rows[-1])
    return torch.from_numpy(np.concatenate(rows))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller, shorter videos and fewer rounds")
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds (default 7, quick 3)")
    args = ap.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 7)
    specs = QUICK if args.quick else FULL

    C.limit_threads()
    import time

    import av
    import numpy as np
    import torch
    from PIL import Image

    from energon_nemotron.media.video import VideoOptions, plan_video, video_metadata
    from energon_nemotron.media.video_frames import process_video

    mean = np.array((0.48145466, 0.4578275, 0.40821073), np.float32)
    std = np.array((0.26862954, 0.26130258, 0.27577711), np.float32)
    options = VideoOptions(sampling="midpoints", resize="pil")
    videos = [(spec, cached_video(spec)) for spec in specs]

    def ours(data):
        plan = plan_video(video_metadata(data), options)
        return plan, process_video(data, plan, options)

    plans, max_diff = [], 0.0
    for _, data in videos:                                   # warm-up and output check
        plan, out = ours(data)
        ref = floor_process(data, plan.frame_times, plan.grid_h, plan.grid_w, 16, av, np, torch, Image,
                            mean, std)
        if ref.shape != out.shape:
            raise AssertionError(f"floor shape {tuple(ref.shape)} != ours {tuple(out.shape)}")
        max_diff = max(max_diff, float((ref - out).abs().max()))
        plans.append(plan)

    per = {"ours": [[] for _ in videos], "floor": [[] for _ in videos]}
    for r in range(rounds):
        for side in (("ours", "floor") if r % 2 == 0 else ("floor", "ours")):
            for i, ((_, data), plan) in enumerate(zip(videos, plans)):
                t = time.perf_counter()
                if side == "ours":
                    ours(data)
                else:
                    floor_process(data, plan.frame_times, plan.grid_h, plan.grid_w, 16, av, np, torch,
                                  Image, mean, std)
                per[side][i].append(time.perf_counter() - t)
    totals = {side: C.median([sum(v[r] for v in per[side]) for r in range(rounds)]) for side in per}

    result = {"name": "video_path", "ratio": round(totals["ours"] / totals["floor"], 4), "goal": GOAL,
              "better": "lower", "ours_seconds": round(totals["ours"], 5),
              "floor_seconds": round(totals["floor"], 5)}
    print(f"{'video':<34}{'frames':>7}{'grid':>8}{'ours ms':>10}{'floor ms':>10}")
    for i, ((spec, _), plan) in enumerate(zip(videos, plans)):
        container, codec, w, h, seconds, fps = spec
        label = f"{container}/{codec} {w}x{h} {seconds:g}s@{fps}"
        o, f = C.median(per["ours"][i]) * 1e3, C.median(per["floor"][i]) * 1e3
        print(f"{label:<34}{plan.num_frames:>7}{plan.grid_h:>4}x{plan.grid_w:<3}{o:>10.1f}{f:>10.1f}")
        key = f"{container}_{w}x{h}_{seconds:g}s"
        result[f"ours_ms_{key}"], result[f"floor_ms_{key}"] = round(o, 2), round(f, 2)
        result[f"frames_{key}"] = plan.num_frames
    result.update(augmentation_cost(videos, rounds, plan_video, video_metadata, process_video, VideoOptions))
    result.update({"max_abs_diff": max_diff, "videos": len(videos), "rounds": rounds,
                   "quick": bool(args.quick)})
    C.emit(result)
    return 0


def augmentation_cost(videos, rounds: int, plan_video, video_metadata, process_video, VideoOptions) -> dict:
    """Frames per second of the ``nemo_rl`` path without and with production's augmentation (see the
    module docs), rounds alternating which runs first."""
    import time

    sides = {"plain": VideoOptions(sampling="nemo_rl", resize="pil"),
             "augment": VideoOptions(sampling="nemo_rl", resize="pil", augment_frames_up=4,
                                     augment_resolution_only=True, temporal_jitter=True)}
    frames = {side: 0 for side in sides}
    seconds = {side: [] for side in sides}
    for r in range(rounds + 1):                              # round 0: warm-up
        for side in (("plain", "augment") if r % 2 == 0 else ("augment", "plain")):
            t, n = time.perf_counter(), 0
            for i, (_, data) in enumerate(videos):
                plan = plan_video(video_metadata(data), sides[side], (1, f"video{i}", r, 0))
                process_video(data, plan, sides[side])
                n += plan.num_frames
            if r:
                seconds[side].append(time.perf_counter() - t)
                frames[side] += n
    fps = {side: frames[side] / sum(seconds[side]) for side in sides}
    print(f"nemo_rl sampling: {fps['plain']:.1f} frames/s plain, {fps['augment']:.1f} with production's "
          f"augmentation and the jitter ({fps['augment'] / fps['plain']:.2f}x)")
    return {"plain_fps": round(fps["plain"], 2), "augment_fps": round(fps["augment"], 2),
            "augment_ratio": round(fps["augment"] / fps["plain"], 4)}


if __name__ == "__main__":
    sys.exit(main())
