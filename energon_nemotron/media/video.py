"""Nemotron 3 Nano Omni video path: header metadata, frame plan, prompt text and ViT rows.

:func:`video_metadata` reads the headers, :func:`plan_video` picks frames and frame size from that
metadata alone (token budgeting before decoding, notes ``nemotron_media.md`` §2.2), :func:`video_prompt`
gives the per-tubelet text and :func:`process_video` decodes only the chosen frames into pre-patchified
rows ``float32 [num_patches, 3*P*P]`` (rows of frame ``f``: ``[f*grid_h*grid_w, (f+1)*grid_h*grid_w)``).

Frame times are segment midpoints over ``[0, duration)``: ``t_k = duration / n * (k + 0.5)``.
Megatron's encoder (``get_seq_frames_v3``) uses ``seg = (duration - 1) / n``: one *second* off a
length in seconds, zero or negative times for videos of at most 1 s, the last second never sampled;
not copied, so prompt timestamps differ from Megatron's by the factor ``(duration - 1) / duration``.
Megatron also rounds ``n`` to a multiple of ``temporal_patch``; here the last tubelet is padded instead.

Frames are decoded at native size by Energon's ``AVDecoder`` and resized with PIL bicubic (as
Megatron's Energon image strategy). ``get_video_clips(video_out_frame_size=...)`` is not used: its
swscale *bilinear* differs (mean |delta| 0.8-1.9, max 5-11 of 255 on demo videos 160x96 -> 640x384,
640x360 -> 672x384, 1280x720 -> 672x384). Pixels: ``(v / 255 - mean) / std`` in float32 (what
``ToTensor`` + ``Normalize`` compute), OpenAI-CLIP mean/std, raster patches flattened ``(C, P, P)``.
"""

from __future__ import annotations

import io
import math
import os
from dataclasses import dataclass
from typing import Literal, Union

import numpy as np
import torch
from PIL import Image

from energon_nemotron.errors import ConfigError, MediaError
from energon_nemotron.media.image import MEAN_PLANES, STD_PLANES

__all__ = ["VideoOptions", "VideoPlan", "video_metadata", "plan_video", "frame_timestamps", "video_prompt",
           "process_video"]

VideoSource = Union[bytes, bytearray, memoryview, str, "os.PathLike[str]"]


@dataclass(frozen=True)
class VideoOptions:
    """Frame sampling and size (defaults: the Omni configuration). ``n = clamp(int(fps * duration),
    min_frames, max_frames)`` (at most the source frame count); frames of ~``target_patches`` patches
    of ``patch_size`` px (square unless ``maintain_aspect_ratio``), ``downsample**2`` patches per LLM
    token, ``temporal_patch`` frames per tubelet; longer than ``max_duration`` s -> ``MediaError``."""

    fps: float = 2.0
    min_frames: int = 8
    max_frames: int = 32
    temporal_patch: int = 2
    target_patches: int = 1024
    maintain_aspect_ratio: bool = True
    patch_size: int = 16
    downsample: int = 2
    max_duration: float = 600.0
    backend: Literal["pyav", "decord"] = "pyav"

    def __post_init__(self) -> None:
        if not self.fps > 0 or not self.max_duration > 0:
            raise ConfigError(f"video fps and max_duration must be > 0, got {self.fps}, {self.max_duration}")
        if not 1 <= self.min_frames <= self.max_frames:
            raise ConfigError(f"need 1 <= min_frames <= max_frames, got {self.min_frames}, {self.max_frames}")
        if min(self.temporal_patch, self.patch_size, self.downsample) < 1:
            raise ConfigError("temporal_patch, patch_size and downsample must be >= 1")
        if self.target_patches < self.downsample ** 2:
            raise ConfigError(f"target_patches must be >= downsample**2, got {self.target_patches}")
        if self.backend not in ("pyav", "decord"):
            raise ConfigError(f"video backend must be 'pyav' or 'decord', got {self.backend!r}")


@dataclass(frozen=True)
class VideoPlan:
    """What :func:`process_video` will produce, known from the metadata alone.

    ``width``/``height``/``duration``/``fps``/``num_source_frames`` echo the metadata; ``frame_times``
    are the chosen frames' times in seconds; every frame becomes a ``grid_h x grid_w`` patch grid
    (even sides); each tubelet (``temporal_patch`` frames) costs ``tokens_per_tubelet =
    grid_h*grid_w // downsample**2`` tokens.
    """

    width: int
    height: int
    duration: float
    fps: float
    num_source_frames: int
    frame_times: tuple[float, ...]
    grid_h: int
    grid_w: int
    tokens_per_tubelet: int
    temporal_patch: int = 2

    @property
    def num_frames(self) -> int:
        return len(self.frame_times)

    @property
    def num_tubelets(self) -> int:
        return -(-self.num_frames // self.temporal_patch)

    @property
    def num_tokens(self) -> int:
        return self.num_tubelets * self.tokens_per_tubelet

    @property
    def num_patches(self) -> int:
        """Rows of :func:`process_video` (the last tubelet padded by repeating the last frame)."""
        return self.num_tubelets * self.temporal_patch * self.grid_h * self.grid_w


def _open_bytes(data: VideoSource):
    if isinstance(data, (bytes, bytearray, memoryview)):
        return io.BytesIO(bytes(data))
    return open(os.fspath(data), "rb")


def _tag_seconds(tag) -> float | None:
    """Seconds of a Matroska ``DURATION`` tag (``HH:MM:SS.nnnnnnnnn``), or None."""
    parts = str(tag).split(":")
    try:
        return int(parts[0]) * 3600 + int(parts[1]) * 60 + float(parts[2]) if len(parts) == 3 else None
    except ValueError:
        return None


def video_metadata(data: VideoSource) -> dict:
    """``{"width", "height", "duration", "fps", "num_frames"}`` of the first video stream, read from
    the headers with PyAV (this function decodes no frame; FFmpeg's stream probing may read the first
    packets). ``duration``: the stream's, else its Matroska ``DURATION`` tag, else the container's
    (which also covers audio). ``fps``: the average frame rate. ``num_frames``: the stream's recorded
    count (MP4/MOV/AVI), else *estimated* as ``round(duration * fps)`` (Matroska/WebM).
    ``MediaError`` for unreadable data or no video stream."""
    import av

    try:
        with _open_bytes(data) as f, av.open(f, "r") as container:
            if not container.streams.video:
                raise MediaError("no video stream in the container")
            s = container.streams.video[0]
            width, height = int(s.codec_context.width or 0), int(s.codec_context.height or 0)
            rate = s.average_rate or s.guessed_rate or s.base_rate
            duration = _tag_seconds(s.metadata.get("DURATION"))
            if s.duration and s.time_base:
                duration = float(s.duration * s.time_base)
            elif not duration and container.duration:
                duration = container.duration / av.time_base
            frames = int(s.frames or 0)
    except MediaError:
        raise
    except Exception as e:  # PyAV raises FFmpegError subclasses, OSError, ValueError, ...
        raise MediaError(f"unreadable video: {type(e).__name__}: {e}") from e
    fps = float(rate) if rate else (frames / duration if frames and duration else 0.0)
    if width <= 0 or height <= 0 or not duration or duration <= 0 or fps <= 0:
        raise MediaError(f"video headers lack size, duration or frame rate ({width}x{height}, "
                         f"duration {duration}, fps {fps})")
    return {"width": width, "height": height, "duration": duration, "fps": fps,
            "num_frames": frames if frames > 0 else max(1, round(duration * fps))}


def frame_timestamps(duration: float, n: int) -> tuple[float, ...]:
    """Midpoints of ``n`` equal segments of ``[0, duration)``: ``duration / n * (k + 0.5)``, k < n."""
    if n < 1 or not duration > 0:
        raise ValueError(f"need n >= 1 and duration > 0, got n={n}, duration={duration}")
    seg = duration / n
    return tuple(seg * (k + 0.5) for k in range(n))


def _frame_grid(width: int, height: int, o: VideoOptions) -> tuple[int, int]:
    """(grid_h, grid_w) of every frame: vLLM ``_compute_aspect_preserving_size`` (Python ``round``)."""
    d = o.downsample
    if not o.maintain_aspect_ratio:
        side = max(d, int(math.sqrt(o.target_patches)) // d * d)
        return side, side
    a = width / max(height, 1)
    ph, pw = max(round(math.sqrt(o.target_patches / a)), 1), max(round(math.sqrt(o.target_patches * a)), 1)
    rh, rw = ph % d, pw % d
    up_h, up_w = ph + (d - rh if rh else 0), pw + (d - rw if rw else 0)
    if up_h * up_w <= o.target_patches:
        return up_h, up_w
    return max(d, ph - rh), max(d, pw - rw)


def plan_video(metadata: dict, options: VideoOptions = VideoOptions()) -> VideoPlan:
    """Choose frames and frame size from :func:`video_metadata`'s dict (no decoding).

    ``n = min(clamp(int(options.fps * duration), min_frames, max_frames), num_frames)``; times from
    :func:`frame_timestamps`; grid from the aspect-preserving rule. ``MediaError`` when the metadata
    is unusable or the video is longer than ``options.max_duration``."""
    try:
        width, height = int(metadata["width"]), int(metadata["height"])
        duration, fps = float(metadata["duration"]), float(metadata["fps"])
        num_source = int(metadata["num_frames"])
    except (KeyError, TypeError, ValueError) as e:
        raise MediaError(f"bad video metadata {metadata!r}: {e}") from e
    if width <= 0 or height <= 0 or not duration > 0 or not fps > 0 or num_source <= 0:
        raise MediaError(f"bad video metadata {metadata!r}")
    if duration > options.max_duration:
        raise MediaError(f"video too long: {duration:.1f} s > max_duration {options.max_duration:g} s",
                         code="media_too_large")
    n = min(max(int(options.fps * duration), options.min_frames), options.max_frames, num_source)
    grid_h, grid_w = _frame_grid(width, height, options)
    return VideoPlan(width=width, height=height, duration=duration, fps=fps, num_source_frames=num_source,
                     frame_times=frame_timestamps(duration, n), grid_h=grid_h, grid_w=grid_w,
                     tokens_per_tubelet=grid_h * grid_w // options.downsample ** 2,
                     temporal_patch=options.temporal_patch)


def video_prompt(plan: VideoPlan) -> list[tuple[str, int]]:
    """One ``(text, placeholder_tokens)`` per tubelet, e.g. ``("Frame 1 sampled at 0.25 seconds and
    frame 2 sampled at 0.75 seconds: ", 240)``; a short last tubelet names only its real frames.
    Megatron's prompt v2 puts ``"This is a video:\\n"`` before and ``"\\n"`` after each placeholder
    span; those separators are the caller's."""
    t, out = plan.temporal_patch, []
    for g in range(0, plan.num_frames, t):
        parts = [f"{'Frame' if i == g else 'frame'} {i + 1} sampled at {plan.frame_times[i]:.2f} seconds"
                 for i in range(g, min(g + t, plan.num_frames))]
        out.append((" and ".join(parts) + ": ", plan.tokens_per_tubelet))
    return out


def _decode_pyav(data: VideoSource, times: list[float]) -> list[np.ndarray]:
    """RGB uint8 ``[H, W, 3]`` frames at ``times`` (one ``get_video_clips`` call: one open container,
    Energon's keyframe seeking); ranges past the end yield nothing, so the list may be shorter."""
    from megatron.energon.av import AVDecoder

    try:
        with _open_bytes(data) as f:
            clips, _ = AVDecoder(f, suppress_warnings=True).get_video_clips([(t, t) for t in times])
    except Exception as e:  # FFmpeg errors, Energon asserts (no video stream / no fps), ...
        raise MediaError(f"cannot decode video: {type(e).__name__}: {e}") from e
    return [clip[0].permute(1, 2, 0).numpy() for clip in clips]


def _decode_decord(data: VideoSource, indices: list[int]) -> list[np.ndarray]:
    """RGB uint8 ``[H, W, 3]`` frames at source frame ``indices`` with ``decord.VideoReader``."""
    try:
        import decord
    except ImportError as e:
        raise ImportError("backend='decord' needs decord: pip install 'energon-nemotron[decord]'") from e
    try:
        with _open_bytes(data) as f:
            reader = decord.VideoReader(f, ctx=decord.cpu(0), num_threads=1)
            have = [i for i in indices if i < len(reader)]
            batch = reader.get_batch(have).asnumpy() if have else []
    except Exception as e:
        raise MediaError(f"cannot decode video: {type(e).__name__}: {e}") from e
    return list(batch)


def _patchify_into(dst: torch.Tensor, frame: np.ndarray, grid_h: int, grid_w: int, p: int) -> None:
    """Write one resized RGB uint8 frame ``[grid_h*p, grid_w*p, 3]`` as normalised rows into ``dst``
    (``float32 [grid_h*grid_w, 3*p*p]``, patches raster order, each ``(C, P, P)``)."""
    src = torch.from_numpy(frame).view(grid_h, p, grid_w, p, 3).permute(0, 2, 4, 1, 3)
    dst.view(grid_h, grid_w, 3, p, p).copy_(src)
    dst.view(-1, 3, p * p).div_(255.0).sub_(MEAN_PLANES).div_(STD_PLANES)


def process_video(data: VideoSource, plan: VideoPlan, options: VideoOptions = VideoOptions()) -> torch.Tensor:
    """Decode the planned frames and return ``float32 [plan.num_patches, 3*P*P]`` (P = patch size).

    Frame ``k`` is the source frame shown at ``plan.frame_times[k]`` (source index
    ``int(t * fps)``); planned times falling into the same source frame are decoded once. Each frame
    is resized (PIL bicubic) to ``(grid_w*P, grid_h*P)``, normalised and patchified; the last tubelet
    is padded by repeating the last frame. If the container yields fewer frames than planned (the
    last ones missing), one missing frame is replaced by the last decoded one; more -> ``MediaError``.
    """
    p, gh, gw = options.patch_size, plan.grid_h, plan.grid_w
    keys = [int(t * plan.fps) for t in plan.frame_times]
    first = {}
    for k, t in zip(keys, plan.frame_times):
        first.setdefault(k, t)
    if options.backend == "decord":
        frames = _decode_decord(data, list(first))
    else:
        frames = _decode_pyav(data, list(first.values()))
    slot = {k: i for i, k in enumerate(first)}
    missing = sum(slot[k] >= len(frames) for k in keys)
    if not frames or missing > 1:
        raise MediaError(f"metadata disagrees with the decoded video: {plan.num_frames} frames planned, "
                         f"{plan.num_frames - missing} decoded")
    size, per_frame = (gw * p, gh * p), gh * gw
    out = torch.empty(plan.num_patches, 3 * p * p, dtype=torch.float32)
    done: dict[int, int] = {}
    for f, k in enumerate(keys):
        i = min(slot[k], len(frames) - 1)
        dst = out[f * per_frame:(f + 1) * per_frame]
        if i in done:                                   # same source frame again: copy its rows
            dst.copy_(out[done[i] * per_frame:(done[i] + 1) * per_frame])
            continue
        if ((frame := frames[i]).shape[1], frame.shape[0]) != size:
            img = Image.fromarray(np.ascontiguousarray(frame)).resize(size, Image.Resampling.BICUBIC)
            frame = np.array(img)
        _patchify_into(dst, np.ascontiguousarray(frame), gh, gw, p)
        done[i] = f
    last = out[(plan.num_frames - 1) * per_frame:plan.num_frames * per_frame]
    for f in range(plan.num_frames, plan.num_tubelets * plan.temporal_patch):
        out[f * per_frame:(f + 1) * per_frame].copy_(last)
    return out
