"""Nemotron 3 Omni video path: header metadata, plans, prompt text and decoded rows."""

from __future__ import annotations

import io
import math

import av
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from energon_nemotron.demo.media import make_audio, make_video
from energon_nemotron.errors import ConfigError, MediaError
from energon_nemotron.media.video import (VideoOptions, VideoPlan, frame_timestamps, plan_video, video_metadata,
                                          video_prompt)
from energon_nemotron.media.video_frames import process_video

MEAN = np.array((0.48145466, 0.4578275, 0.40821073), np.float32)
STD = np.array((0.26862954, 0.26130258, 0.27577711), np.float32)
CODEC = {"mp4": "libx264", "webm": "libvpx", "matroska": "libx264", "mov": "libx264"}
_CACHE: dict = {}
#: the project's earlier video path (segment midpoints decoded by time, PIL resize): kept as an option
LEGACY = {"sampling": "midpoints", "resize": "pil"}


def video(width=160, height=96, seconds=3.0, fps=10, container="mp4", codec=None) -> bytes:
    key = (width, height, seconds, fps, container, codec)
    if key not in _CACHE:
        _CACHE[key] = make_video(width, height, seconds, fps, container=container,
                                 codec=codec or CODEC[container])
    return _CACHE[key]


def video_target(w, h, target=1024, patch=16, ds=0.5, keep_ar=True):
    """The notes' Appendix A port of vLLM ``_compute_aspect_preserving_size`` (width, height, tokens)."""
    if keep_ar:
        a = w / max(h, 1)
        ph = max(round(math.sqrt(target / a)), 1)
        pw = max(round(math.sqrt(target * a)), 1)
        d = int(round(1 / ds))
        rh, rw = ph % d, pw % d
        phu, pwu = ph + (d - rh if rh else 0), pw + (d - rw if rw else 0)
        if phu * pwu <= target:
            ph, pw = phu, pwu
        else:
            ph, pw = max(d, ph - rh), max(d, pw - rw)
    else:
        d = int(round(1 / ds))
        side = max(d, (int(math.sqrt(target)) // d) * d)
        ph = pw = side
    return pw * patch, ph * patch, int(ph * ds) * int(pw * ds)


def full_decode(data: bytes) -> list[np.ndarray]:
    with av.open(io.BytesIO(data)) as c:
        return [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]


def reference_rows(frame: np.ndarray, grid_h: int, grid_w: int, p: int = 16) -> np.ndarray:
    """Independent reference: PIL bicubic, (v/255 - mean)/std, raster patches flattened (C, P, P)."""
    img = Image.fromarray(frame)
    if img.size != (grid_w * p, grid_h * p):
        img = img.resize((grid_w * p, grid_h * p), Image.BICUBIC)
    x = (np.asarray(img).astype(np.float32) / np.float32(255) - MEAN) / STD        # H, W, C
    x = x.reshape(grid_h, p, grid_w, p, 3).transpose(0, 2, 4, 1, 3)                # gh, gw, C, P, P
    return x.reshape(grid_h * grid_w, 3 * p * p)


# ---------------------------------------------------------------------------------------------
# metadata
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("container,w,h,seconds", [("mp4", 160, 96, 3.0), ("webm", 96, 160, 2.0),
                                                   ("matroska", 160, 96, 4.0), ("mov", 96, 160, 2.5)])
def test_metadata_from_headers(container, w, h, seconds):
    meta = video_metadata(video(w, h, seconds, 10, container))
    assert meta == {"width": w, "height": h, "duration": pytest.approx(seconds, abs=1e-3), "fps": 10.0,
                    "num_frames": round(seconds * 10), "rotation": 0}
    assert isinstance(meta["num_frames"], int) and isinstance(meta["duration"], float)


def test_metadata_video_duration_not_audio():
    """Matroska: the video track's DURATION tag, not the container duration (longer AAC audio)."""
    data = make_video(160, 96, 3.0, 10, container="matroska", codec="libx264", with_audio=True)
    with av.open(io.BytesIO(data)) as c:
        assert c.duration / 1e6 > 3.01
    assert video_metadata(data)["duration"] == pytest.approx(3.0) and video_metadata(data)["num_frames"] == 30


def test_metadata_from_path_and_bytearray(tmp_path):
    data = video(container="webm")
    path = tmp_path / "clip.webm"
    path.write_bytes(data)
    assert video_metadata(path) == video_metadata(str(path)) == video_metadata(bytearray(data))


def test_metadata_does_not_decode(monkeypatch):
    """Only headers: no frame goes through the decoder (VideoFrame conversions would be needed)."""
    calls = []
    real_open = av.open

    class Spy:
        def __init__(self, c):
            self.c = c

        def __getattr__(self, name):
            if name in ("decode", "demux"):
                calls.append(name)
            return getattr(self.c, name)

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return self.c.__exit__(*a)

    def spy_open(*a, **k):
        calls.append("open")
        return Spy(real_open(*a, **k))

    data = video()
    monkeypatch.setattr(av, "open", spy_open)
    assert video_metadata(data)["num_frames"] == 30
    assert calls == ["open"]


@pytest.mark.parametrize("data", [b"", b"not a video at all" * 10, None, "audio", "missing"])
def test_unreadable_data_raises_media_error(data, tmp_path):
    if data is None:
        data = video()[: len(video()) // 2]                   # MP4 cut in half: moov atom lost
    elif data == "audio":
        data = make_audio(1.0, 16000, 1, container="wav")     # no video stream
    elif data == "missing":
        data = tmp_path / "nope.mp4"
    with pytest.raises(MediaError):
        video_metadata(data)


def test_process_corrupt_bytes_raises_media_error():
    plan = plan_video(video_metadata(video()))
    with pytest.raises(MediaError):
        process_video(b"\x00garbage" * 100, plan)


# ---------------------------------------------------------------------------------------------
# plans
# ---------------------------------------------------------------------------------------------
def test_frame_timestamps_midpoints():
    assert frame_timestamps(2.5, 5) == pytest.approx((0.25, 0.75, 1.25, 1.75, 2.25))
    assert frame_timestamps(1.0, 1) == (0.5,)
    with pytest.raises(ValueError):
        frame_timestamps(0.0, 3)
    with pytest.raises(ValueError):
        frame_timestamps(3.0, 0)


meta_dicts = st.fixed_dictionaries({
    "width": st.integers(16, 4096), "height": st.integers(16, 4096),
    "duration": st.floats(0.05, 600.0), "fps": st.floats(1.0, 120.0),
}).flatmap(lambda m: st.builds(lambda n: {**m, "num_frames": n},
                               st.integers(1, max(1, int(m["duration"] * m["fps"]) + 2))))


@settings(max_examples=300, deadline=None)
@given(meta_dicts, st.booleans(), st.sampled_from([(2.0, 8, 32), (1.0, 4, 64), (0.5, 1, 8)]))
def test_plan_counts(meta, keep_ar, sampling):
    fps, lo, hi = sampling
    options = VideoOptions(fps=fps, min_frames=lo, max_frames=hi, maintain_aspect_ratio=keep_ar, **LEGACY)
    plan = plan_video(meta, options)
    n = min(max(int(fps * meta["duration"]), lo), hi, meta["num_frames"])
    assert plan.num_frames == n
    assert plan.grid_h % 2 == 0 and plan.grid_w % 2 == 0 and plan.grid_h >= 2 and plan.grid_w >= 2
    w, h, tokens = video_target(meta["width"], meta["height"], keep_ar=keep_ar)
    assert (plan.grid_w * 16, plan.grid_h * 16) == (w, h)
    assert plan.tokens_per_tubelet == tokens == plan.grid_h * plan.grid_w // 4
    assert plan.num_tubelets == math.ceil(n / 2)
    assert plan.num_tokens == plan.num_tubelets * tokens
    assert plan.num_patches == plan.num_tubelets * 2 * plan.grid_h * plan.grid_w
    t = plan.frame_times
    assert len(t) == n and 0 <= t[0] and t[-1] < meta["duration"]
    assert all(a < b for a, b in zip(t, t[1:]))
    assert (plan.width, plan.height, plan.fps, plan.num_source_frames) == (
        meta["width"], meta["height"], meta["fps"], meta["num_frames"])


@pytest.mark.parametrize("w,h,keep_ar,size,tokens", [(1920, 1080, True, (672, 384), 252),
                                                     (640, 480, True, (576, 448), 252),
                                                     (1920, 1080, False, (512, 512), 256),
                                                     (160, 96, True, (640, 384), 240)])
def test_plan_frame_size_examples(w, h, keep_ar, size, tokens):
    plan = plan_video({"width": w, "height": h, "duration": 10.0, "fps": 30.0, "num_frames": 300},
                      VideoOptions(maintain_aspect_ratio=keep_ar))
    assert (plan.grid_w * 16, plan.grid_h * 16) == size and plan.tokens_per_tubelet == tokens
    assert plan.num_frames == 20


def test_plan_limits():
    meta = {"width": 160, "height": 96, "duration": 3.0, "fps": 10.0, "num_frames": 5}
    assert plan_video(meta).num_frames == 5                          # never more than the source has
    assert plan_video({**meta, "num_frames": 300, "duration": 100.0}).num_frames == 32
    with pytest.raises(MediaError, match="too long"):
        plan_video({**meta, "duration": 600.5})
    with pytest.raises(MediaError, match="too long"):
        plan_video(video_metadata(video(seconds=3.0)), VideoOptions(max_duration=2.0))
    for bad in ({**meta, "fps": 0}, {**meta, "num_frames": 0}, {"width": 1}, {**meta, "duration": "x"}):
        with pytest.raises(MediaError):
            plan_video(bad)


def test_options_validation():
    for kwargs in ({"min_frames": 9, "max_frames": 8}, {"fps": 0}, {"backend": "opencv"},
                   {"temporal_patch": 0}, {"target_patches": 2}):
        with pytest.raises(ConfigError):
            VideoOptions(**kwargs)


def test_prompt_text_exact():
    plan = VideoPlan(width=160, height=96, duration=2.5, fps=10.0, num_source_frames=25,
                     frame_times=frame_timestamps(2.5, 5), grid_h=24, grid_w=40, tokens_per_tubelet=240)
    assert plan.num_tubelets == 3 and plan.num_tokens == 720 and plan.num_patches == 6 * 960
    assert video_prompt(plan) == [
        ("Frame 1 sampled at 0.25 seconds and frame 2 sampled at 0.75 seconds: ", 240),
        ("Frame 3 sampled at 1.25 seconds and frame 4 sampled at 1.75 seconds: ", 240),
        ("Frame 5 sampled at 2.25 seconds: ", 240),
    ]
    three = VideoPlan(**{**plan.__dict__, "temporal_patch": 3})
    assert [text for text, _ in video_prompt(three)] == [
        "Frame 1 sampled at 0.25 seconds and frame 2 sampled at 0.75 seconds and frame 3 sampled at "
        "1.25 seconds: ",
        "Frame 4 sampled at 1.75 seconds and frame 5 sampled at 2.25 seconds: "]


# ---------------------------------------------------------------------------------------------
# decoding
# ---------------------------------------------------------------------------------------------
def frame_rows(out: torch.Tensor, plan: VideoPlan, f: int) -> np.ndarray:
    per = plan.grid_h * plan.grid_w
    return out[f * per:(f + 1) * per].numpy()


@pytest.mark.parametrize("container,w,h,seconds", [("mp4", 160, 96, 2.5), ("webm", 96, 160, 2.5),
                                                   ("matroska", 160, 96, 6.0), ("mov", 96, 160, 4.0),
                                                   ("webm", 160, 96, 6.0)])
def test_frames_are_the_planned_ones(container, w, h, seconds):
    data = video(w, h, seconds, 10, container)
    options = VideoOptions(min_frames=1, **LEGACY)
    plan = plan_video(video_metadata(data), options)
    out = process_video(data, plan, options)
    assert out.dtype == torch.float32 and out.shape == (plan.num_patches, 768)
    frames = full_decode(data)
    assert len(frames) == plan.num_source_frames
    exact = 0
    for f, t in enumerate(plan.frame_times):
        got = frame_rows(out, plan, f)
        idx = int(t * plan.fps)
        errs = {j: np.abs(reference_rows(frames[j], plan.grid_h, plan.grid_w) - got).max()
                for j in (idx - 1, idx, idx + 1) if 0 <= j < len(frames)}
        best = min(errs, key=errs.get)
        assert errs[best] < 1e-5, (f, t, errs)
        exact += best == idx
        blue = got.reshape(-1, 3, 256)[:, 2].mean() * STD[2] + MEAN[2]   # generator: blue encodes index
        assert abs(blue * 255 - best * 255 // (len(frames) - 1)) < 6
    assert exact == plan.num_frames                 # regular-rate synthetic videos: the exact frame
    if plan.num_frames % 2:                          # padding: the last frame repeated
        np.testing.assert_array_equal(frame_rows(out, plan, plan.num_frames),
                                      frame_rows(out, plan, plan.num_frames - 1))


def test_rows_and_last_tubelet_padding():
    data = video(160, 96, 2.5, 10, "mp4")
    options = VideoOptions(min_frames=1)                 # int(2 * 2.5) = 5 frames -> 3 tubelets
    plan = plan_video(video_metadata(data), options)
    assert (plan.num_frames, plan.num_tubelets, plan.grid_h, plan.grid_w) == (5, 3, 24, 40)
    out = process_video(data, plan, options)
    assert out.shape == (6 * 960, 768)
    np.testing.assert_array_equal(frame_rows(out, plan, 5), frame_rows(out, plan, 4))
    assert not np.array_equal(frame_rows(out, plan, 4), frame_rows(out, plan, 3))


def test_repeated_source_frame_decoded_once():
    """Planned times inside one source frame (here the very last one) give identical rows."""
    data = video(160, 96, 3.0, 10, "mp4")
    base = plan_video(video_metadata(data), VideoOptions(**LEGACY))
    plan = VideoPlan(**{**base.__dict__, "frame_times": (0.55, 2.91, 2.95, 2.99)})
    out = process_video(data, plan, VideoOptions(**LEGACY))
    assert out.shape[0] == plan.num_patches
    for f in (2, 3):
        np.testing.assert_array_equal(frame_rows(out, plan, f), frame_rows(out, plan, 1))
    ref = reference_rows(full_decode(data)[29], plan.grid_h, plan.grid_w)
    assert np.abs(frame_rows(out, plan, 1) - ref).max() < 1e-5


def test_square_frames_and_other_patch_size():
    data = video(96, 160, 2.0, 10, "webm")
    options = VideoOptions(maintain_aspect_ratio=False, patch_size=14, target_patches=256, min_frames=2, **LEGACY)
    plan = plan_video(video_metadata(data), options)
    assert (plan.grid_h, plan.grid_w, plan.tokens_per_tubelet) == (16, 16, 64)
    out = process_video(data, plan, options)
    assert out.shape == (plan.num_patches, 3 * 14 * 14)
    ref = reference_rows(full_decode(data)[int(plan.frame_times[0] * 10)], 16, 16, 14)
    assert np.abs(out[:256].numpy() - ref).max() < 1e-5


@pytest.mark.parametrize("container", ["mp4", "webm"])
def test_metadata_longer_than_video(container):
    data = video(160, 96, 2.0, 10, container)                              # 20 frames, 0.0 .. 1.9 s
    options = VideoOptions(fps=10.0, min_frames=1, max_frames=64, **LEGACY)
    meta = {"width": 160, "height": 96, "fps": 10.0}
    one_short = plan_video({**meta, "duration": 2.1, "num_frames": 21}, options)
    assert one_short.num_frames == 21                                      # the last one does not exist
    out = process_video(data, one_short, options)
    np.testing.assert_array_equal(frame_rows(out, one_short, 20), frame_rows(out, one_short, 19))
    far = plan_video({**meta, "duration": 2.5, "num_frames": 25}, options)
    with pytest.raises(MediaError, match="metadata disagrees with the decoded video"):
        process_video(data, far, options)


def test_decodes_only_the_chosen_frames(monkeypatch):
    """60 s at 10 fps, MPEG-4 part 2 (a keyframe every 12 frames): 8 frames need at most 8 GOPs."""
    import megatron.energon.av.av_decoder as avd

    data = video(160, 96, 60.0, 10, "mp4", codec="mpeg4")
    counts = {"open": 0, "decoded": 0}
    real_open = avd.av_open

    class Counting:
        def __init__(self, c):
            self.c = c

        def __getattr__(self, name):
            return getattr(self.c, name)

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return self.c.__exit__(*a)

        def decode(self, *a, **k):
            for frame in self.c.decode(*a, **k):
                counts["decoded"] += 1
                yield frame

    def counting_open(f):
        counts["open"] += 1
        return Counting(real_open(f))

    monkeypatch.setattr(avd, "av_open", counting_open)
    options = VideoOptions(fps=0.1, **LEGACY)
    plan = plan_video(video_metadata(data), options)
    assert plan.num_frames == 8 and plan.num_source_frames == 600
    out = process_video(data, plan, options)
    assert out.shape[0] == plan.num_patches
    assert counts["open"] == 1                                             # one container for all frames
    assert counts["decoded"] <= 8 * 12 + 8, counts                         # not 600


def test_decord_backend_missing_or_equal():
    try:
        import decord  # noqa: F401
    except ImportError:
        data = video()
        plan = plan_video(video_metadata(data))
        with pytest.raises(ImportError, match=r"energon-nemotron\[decord\]"):
            process_video(data, plan, VideoOptions(backend="decord"))
        return
    pytest.skip("decord installed: covered by test_decord_backend")


@pytest.mark.parametrize("container", ["mp4", "webm"])
def test_decord_backend(container):
    pytest.importorskip("decord")
    data = video(160, 96, 3.0, 10, container)
    plan = plan_video(video_metadata(data))
    ours = process_video(data, plan)
    theirs = process_video(data, plan, VideoOptions(backend="decord"))
    assert theirs.shape == ours.shape
    assert (theirs - ours).abs().max() < 1e-5


def test_decord_code_path_with_stand_in(monkeypatch):
    """The decord branch against a stand-in module with decord's API (VideoReader over a file object,
    ``len``, ``get_batch(indices).asnumpy()``), decoding with PyAV: same rows as the PyAV backend."""
    import sys
    import types

    class Batch:
        def __init__(self, arr):
            self.arr = arr

        def asnumpy(self):
            return self.arr

    class VideoReader:
        def __init__(self, f, ctx=None, num_threads=0):
            self.frames = full_decode(f.read())

        def __len__(self):
            return len(self.frames)

        def get_batch(self, indices):
            return Batch(np.stack([self.frames[i] for i in indices]))

    fake = types.SimpleNamespace(VideoReader=VideoReader, cpu=lambda i: i)
    monkeypatch.setitem(sys.modules, "decord", fake)
    data = video(96, 160, 2.5, 10, "webm")
    options = VideoOptions(min_frames=1)
    plan = plan_video(video_metadata(data), options)
    ours = process_video(data, plan, options)
    assert torch.equal(process_video(data, plan, VideoOptions(min_frames=1, backend="decord")), ours)
    far = plan_video({**video_metadata(data), "duration": 3.0, "num_frames": 30},
                     VideoOptions(fps=10, min_frames=1))
    with pytest.raises(MediaError, match="metadata disagrees"):
        process_video(data, far, VideoOptions(backend="decord"))


def test_a_file_that_is_no_video_is_reported_as_unreadable():
    """PyAV's InvalidDataError is a ValueError: it used to be reported as an "unsupported video
    display matrix"; now the display-matrix message is kept for the matrix check alone."""
    from energon_nemotron.errors import MediaError
    from energon_nemotron.media.video import video_metadata

    empty = io.BytesIO()                                 # an mp4 with a video stream and no frame
    with av.open(empty, "w", format="mp4") as c:
        s = c.add_stream("mpeg4", rate=8)
        s.width, s.height, s.pix_fmt = 64, 48, "yuv420p"
    for data in (b"this is not a video at all" * 10, empty.getvalue()):
        with pytest.raises(MediaError, match=r"^unreadable video: InvalidDataError") as err:
            video_metadata(data)
        assert "display matrix" not in str(err.value)
