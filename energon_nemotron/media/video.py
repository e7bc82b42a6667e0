"""Nemotron 3 Omni video path: header metadata, frame plan and prompt text.

:func:`video_metadata` reads the headers (size, duration, rate, frame count, display rotation),
:func:`plan_video` picks frames and frame size from that metadata alone (token budgeting before
decoding), :func:`video_prompt` gives the per-tubelet text; ``media.video_frames.process_video``
decodes only the chosen frames into pre-patchified rows.

Frame choice and labels (``VideoOptions.sampling``, :mod:`energon_nemotron.media.video_sampling`):
``hf`` (default) — the official Omni processor's indices, timestamps and prompt (no intro line);
``bridge`` — Megatron-Bridge 0.6.2's sampler, labels and ``"This is a video:"`` intro;
``midpoints`` — the project's earlier rule (segment midpoints, decoded by time, with the intro);
``nemo_rl`` — NeMo-RL's (Megatron-LM's) selection and prompt, with its augmentation (the drawn
scale, the temporal jitter: :mod:`energon_nemotron.media.augment`), decoded by time, with the intro
and a newline after the last tubelet.
The frame count: ``hf`` and ``midpoints`` take ``num_frames`` when set, else ``int(fps * duration)``
(``hf``: ``int(total / fps_src * fps)``, the processor's own expression), clamped to
``[min_frames, max_frames]`` and to the frame count; ``bridge`` follows Bridge (``int(fps)``, no
lower bound) up to ``max_frames``. Unset ``fps`` / ``max_frames`` take the sampling's values
(``hf``, ``midpoints``: 2 fps, 32 frames; ``bridge``: Bridge's collate, 1 fps and no cap).

Rotation: the display matrix (MP4/MOV ``tkhd``) is applied to decoded frames as players apply it;
the plan's ``width``/``height`` are the upright size. Every decoded frame must have the planned size
and every planned frame must decode (``midpoints`` keeps its one-frame tolerance for a short tail);
``max_pixels`` is checked on the header before any frame is decoded.

Resize (``resize``): ``hf`` — float32 antialiased bicubic, unclamped (the processor's
``interpolate(..., antialias=True)``); ``pil`` — PIL bicubic on uint8. Pixels are then
``(v / 255 - mean) / std`` with the OpenAI-CLIP mean/std, raster patches flattened ``(C, P, P)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Optional


from energon_nemotron.errors import ConfigError, MediaError
from energon_nemotron.media import video_sampling as sampling_rules
from energon_nemotron.media.augment import (nemo_rl_frame_count, nemo_rl_times, pick_scale, scale_values,
                                            scaled_target)
from energon_nemotron.media.draws import uniforms, uniforms_f32
from energon_nemotron.media.rotation import rotated_size, video_rotation
from energon_nemotron.media.video_decode import (VideoSource, check_pixels, open_bytes)
from energon_nemotron.media.video_sampling import midpoint_times as frame_timestamps

__all__ = ["VideoOptions", "VideoPlan", "video_metadata", "plan_video", "frame_timestamps", "video_prompt"]

SAMPLINGS = ("hf", "bridge", "midpoints", "nemo_rl")
#: ``(fps, max_frames)`` each sampling takes where the options leave them unset (None): the Omni
#: configuration for ``hf`` and ``midpoints``; Megatron-Bridge's own collate for ``bridge`` (its
#: ``video_fps`` 1.0 and ``nframe_max`` -1: no cap)
SAMPLING_DEFAULTS = {"hf": (2.0, 32), "midpoints": (2.0, 32), "bridge": (1.0, None), "nemo_rl": (2.0, 32)}


@dataclass(frozen=True)
class VideoOptions:
    """Frame sampling and size (defaults: the Omni configuration). ``sampling`` picks the rule (module
    docs); ``fps`` the target rate, ``num_frames`` a fixed count instead; ``min_frames``/``max_frames``
    bound the count (``bridge``: ``max_frames`` only); frames of ~``target_patches`` patches of
    ``patch_size`` px (square unless ``maintain_aspect_ratio``), ``downsample**2`` patches per LLM
    token, ``temporal_patch`` frames per tubelet; longer than ``max_duration`` s or frames over
    ``max_pixels`` -> ``MediaError``. ``fps`` and ``max_frames`` left unset (None) take the sampling's
    own values (:data:`SAMPLING_DEFAULTS`: ``hf`` 2 fps, at most 32 frames; ``bridge`` Bridge's 1 fps,
    no cap); the resolved values are the fields' values after construction."""

    fps: Optional[float] = None
    min_frames: int = 8
    max_frames: Optional[int] = None
    num_frames: Optional[int] = None
    sampling: Literal["hf", "bridge", "midpoints", "nemo_rl"] = "hf"
    resize: Literal["hf", "pil"] = "hf"
    temporal_patch: int = 2
    target_patches: int = 1024
    maintain_aspect_ratio: bool = True
    patch_size: int = 16
    downsample: int = 2
    max_duration: float = 600.0
    max_pixels: int = 8192 * 8192
    backend: Literal["pyav", "decord"] = "pyav"
    #: NeMo-RL's augmentation (``sampling: nemo_rl``; ``media.augment``): a scale drawn from 1,
    #: 2 … ``augment_frames_up`` and 1/2 … 1/``augment_resolution_up`` (None: none of that kind);
    #: ``augment_resolution_only``: the scale changes the resolution only; ``temporal_jitter``:
    #: each frame's time moves by up to half a segment
    augment_frames_up: Optional[int] = None
    augment_resolution_up: Optional[int] = None
    augment_resolution_only: bool = False
    temporal_jitter: bool = False

    @property
    def augments(self) -> bool:
        """Whether planning draws (a scale with more than one value, or the jitter)."""
        return len(scale_values(self.augment_frames_up, self.augment_resolution_up)) > 1 or self.temporal_jitter

    def __post_init__(self) -> None:
        if self.sampling not in SAMPLINGS:
            raise ConfigError(f"video sampling must be one of {', '.join(SAMPLINGS)}, got {self.sampling!r}")
        fps, max_frames = SAMPLING_DEFAULTS[self.sampling]
        if self.fps is None:
            object.__setattr__(self, "fps", fps)
        if self.max_frames is None:
            object.__setattr__(self, "max_frames", max_frames)
        if not self.fps > 0 or not self.max_duration > 0:
            raise ConfigError(f"video fps and max_duration must be > 0, got {self.fps}, {self.max_duration}")
        if self.sampling == "bridge":
            if self.min_frames < 1 or (self.max_frames is not None and self.max_frames < 1):
                raise ConfigError(f"need min_frames >= 1 and max_frames >= 1, got {self.min_frames}, {self.max_frames}")
        elif not 1 <= self.min_frames <= self.max_frames:
            raise ConfigError(f"need 1 <= min_frames <= max_frames, got {self.min_frames}, {self.max_frames}")
        if self.num_frames is not None and not (isinstance(self.num_frames, int) and self.num_frames >= 1):
            raise ConfigError(f"video num_frames must be a positive int or null, got {self.num_frames!r}")
        if min(self.temporal_patch, self.patch_size, self.downsample, self.max_pixels) < 1:
            raise ConfigError("temporal_patch, patch_size, downsample and max_pixels must be >= 1")
        if self.target_patches < self.downsample ** 2:
            raise ConfigError(f"target_patches must be >= downsample**2, got {self.target_patches}")
        if self.backend not in ("pyav", "decord"):
            raise ConfigError(f"video backend must be 'pyav' or 'decord', got {self.backend!r}")
        if self.resize not in ("hf", "pil"):
            raise ConfigError(f"video resize must be 'hf' or 'pil', got {self.resize!r}")
        for name in ("augment_frames_up", "augment_resolution_up"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int) and value >= 1):
                raise ConfigError(f"video {name} must be a positive int or null, got {value!r}")
        if self.augments and self.sampling != "nemo_rl":
            raise ConfigError(f"the video augmentation (augment_frames_up, augment_resolution_up, temporal_jitter) "
                              f"is NeMo-RL's and applies to its frame selection: set sampling: nemo_rl (it is "
                              f"{self.sampling!r})")
        if self.sampling == "nemo_rl" and (self.min_frames < self.temporal_patch or self.max_frames % self.temporal_patch):
            raise ConfigError(f"sampling nemo_rl needs min_frames >= temporal_patch and max_frames a multiple of it "
                              f"(NeMo-RL's checks), got {self.min_frames}, {self.max_frames}, {self.temporal_patch}")
        if self.sampling == "bridge" and self.num_frames is None and int(self.fps) < 1:
            raise ConfigError(f"sampling 'bridge' truncates fps to an integer (int({self.fps}) = 0 makes Bridge "
                              "switch to a fixed count): set video.num_frames")


@dataclass(frozen=True)
class VideoPlan:
    """What :func:`process_video` will produce, known from the metadata alone.

    ``width``/``height``: the upright (display) size; ``duration``/``fps``/``num_source_frames`` echo
    the metadata; ``frame_times`` are the times the prompt names, one per chosen frame;
    ``frame_indices`` the decode-order source indices to decode (empty: decode at ``frame_times``,
    the ``midpoints`` rule); every frame becomes a ``grid_h x grid_w`` patch grid (even sides); each
    tubelet (``temporal_patch`` frames) costs ``tokens_per_tubelet = grid_h*grid_w // downsample**2``
    tokens. ``intro``: whether the prompt starts with ``"This is a video:\\n"``; ``rotation``:
    clockwise degrees applied to decoded frames; ``resize``: the kernel; ``patch_size``: pixels per
    patch side.
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
    frame_indices: tuple[int, ...] = ()
    intro: bool = True
    rotation: int = 0
    resize: str = "hf"
    #: pixels per patch side (``VideoOptions.patch_size``): each patch row holds 3·p·p values
    patch_size: int = 16
    #: the drawn augmentation scale that applied (``media.augment``; 1: none)
    scale: float = 1.0
    #: text after the last tubelet (``"\n"`` for ``nemo_rl``, whose prompt ends with a newline)
    outro: str = ""

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


def _tag_seconds(tag) -> float | None:
    """Seconds of a Matroska ``DURATION`` tag (``HH:MM:SS.nnnnnnnnn``), or None."""
    parts = str(tag).split(":")
    try:
        return int(parts[0]) * 3600 + int(parts[1]) * 60 + float(parts[2]) if len(parts) == 3 else None
    except ValueError:
        return None


def video_metadata(data: VideoSource) -> dict:
    """``{"width", "height", "duration", "fps", "num_frames", "rotation"}`` of the first video stream,
    read from the headers with PyAV (no frame is decoded for MP4/MOV; FFmpeg's stream probing may
    read the first packets). ``width``/``height``: the upright size (the display matrix's
    ``rotation``, clockwise degrees, applied; read from MP4/MOV headers, other containers count as
    0 and a rotation found while decoding them is an error). ``duration``: the stream's, else its Matroska
    ``DURATION`` tag, else the container's. ``fps``: the average frame rate. ``num_frames``: the
    stream's recorded count (MP4/MOV/AVI), else *estimated* as ``round(duration * fps)``.
    ``MediaError`` for unreadable data, no video stream or a mirroring display matrix."""
    import av

    try:
        with open_bytes(data) as f, av.open(f, "r") as container:
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
            try:
                rotation = video_rotation(s, header_only=True)
            except ValueError as e:          # only the display matrix's own check (PyAV's errors are ValueErrors too)
                raise MediaError(f"unsupported video display matrix: {e}") from e
    except MediaError:
        raise
    except Exception as e:  # PyAV raises FFmpegError subclasses, OSError, ValueError, ...
        raise MediaError(f"unreadable video: {type(e).__name__}: {e}") from e
    fps = float(rate) if rate else (frames / duration if frames and duration else 0.0)
    if width <= 0 or height <= 0 or not duration or duration <= 0 or fps <= 0:
        raise MediaError(f"video headers lack size, duration or frame rate ({width}x{height}, "
                         f"duration {duration}, fps {fps})")
    width, height = rotated_size(width, height, rotation)
    return {"width": width, "height": height, "duration": duration, "fps": fps,
            "num_frames": frames if frames > 0 else max(1, round(duration * fps)), "rotation": rotation}


def _frame_grid(width: int, height: int, o: VideoOptions, target: Optional[int] = None) -> tuple[int, int]:
    """(grid_h, grid_w) of every frame: the processor's ``_compute_target_patches`` (Python ``round``)
    for ``target`` patches (default ``o.target_patches``)."""
    d, target = o.downsample, o.target_patches if target is None else target
    if not o.maintain_aspect_ratio:
        side = max(d, int(math.sqrt(target)) // d * d)
        return side, side
    a = width / max(height, 1)
    ph, pw = max(round(math.sqrt(target / a)), 1), max(round(math.sqrt(target * a)), 1)
    rh, rw = ph % d, pw % d
    up_h, up_w = ph + (d - rh if rh else 0), pw + (d - rw if rw else 0)
    if up_h * up_w <= target:
        return up_h, up_w
    return max(d, ph - rh), max(d, pw - rw)


def _choose(duration: float, fps: float, total: int, o: VideoOptions) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """``(label times, source indices)`` of the chosen frames under ``o.sampling``."""
    if o.sampling == "bridge":
        idx = sampling_rules.bridge_indices(total, sampling_rules.bridge_count(total, fps, o.fps, o.num_frames,
                                                                               o.max_frames))
        return sampling_rules.bridge_label_times(idx, fps, o.fps), idx
    if o.sampling == "hf":
        n = o.num_frames or sampling_rules.hf_count(total, fps, o.fps)
        idx = sampling_rules.hf_indices(total, min(max(n, o.min_frames), o.max_frames, total))
        return sampling_rules.hf_label_times(idx, fps), idx
    n = min(max(o.num_frames or int(o.fps * duration), o.min_frames), o.max_frames, total)
    return frame_timestamps(duration, n), ()


def _nemo_rl(duration: float, total: int, o: VideoOptions, draw: Optional[tuple]) -> tuple[tuple[float, ...], float]:
    """NeMo-RL's ``(frame times, scale)`` (``media.augment``), its draws made from ``draw``."""
    values = scale_values(o.augment_frames_up, o.augment_resolution_up)
    if o.augments and draw is None:
        raise ValueError("an augmenting video plan needs its draw key")
    scale = pick_scale(values, float(uniforms((*draw, "scale"), 1)[0])) if len(values) > 1 else 1.0
    n, scale = nemo_rl_frame_count(duration, total, scale, min_frames=o.min_frames, max_frames=o.max_frames,
                                   fps=o.fps, temporal_patch=o.temporal_patch,
                                   resolution_only=o.augment_resolution_only)
    jitter = uniforms_f32((*draw, "jitter"), n) if o.temporal_jitter else None
    return nemo_rl_times(duration, n, jitter), scale


def plan_video(metadata: dict, options: VideoOptions = VideoOptions(), draw: Optional[tuple] = None) -> VideoPlan:
    """Choose frames and frame size from :func:`video_metadata`'s dict (no decoding).

    Frames by ``options.sampling`` (module docs); grid from the aspect-preserving rule on the
    upright size. ``MediaError`` when the metadata is unusable, the video is longer than
    ``options.max_duration`` or its frames exceed ``options.max_pixels``. ``draw``: the key of
    this item's random draws (``media.draws``: seed, dataset, sample key, pass, item), needed when
    ``options.augments``."""
    try:
        width, height = int(metadata["width"]), int(metadata["height"])
        duration, fps = float(metadata["duration"]), float(metadata["fps"])
        num_source = int(metadata["num_frames"])
        rotation = int(metadata.get("rotation", 0))
    except (KeyError, TypeError, ValueError) as e:
        raise MediaError(f"bad video metadata {metadata!r}: {e}") from e
    if width <= 0 or height <= 0 or not duration > 0 or not fps > 0 or num_source <= 0 or rotation % 90:
        raise MediaError(f"bad video metadata {metadata!r}")
    if duration > options.max_duration:
        raise MediaError(f"video too long: {duration:.1f} s > max_duration {options.max_duration:g} s",
                         code="media_too_large")
    check_pixels(width, height, options.max_pixels)
    scale = 1.0
    if options.sampling == "nemo_rl":
        (times, scale), indices = _nemo_rl(duration, num_source, options, draw), ()
    else:
        times, indices = _choose(duration, fps, num_source, options)
    grid_h, grid_w = _frame_grid(width, height, options, scaled_target(options.target_patches, scale))
    return VideoPlan(width=width, height=height, duration=duration, fps=fps, num_source_frames=num_source,
                     frame_times=times, grid_h=grid_h, grid_w=grid_w,
                     tokens_per_tubelet=grid_h * grid_w // options.downsample ** 2,
                     temporal_patch=options.temporal_patch, frame_indices=indices,
                     intro=options.sampling != "hf", rotation=rotation % 360, resize=options.resize,
                     patch_size=options.patch_size, scale=scale, outro="\n" if options.sampling == "nemo_rl" else "")


def video_prompt(plan: VideoPlan) -> list[tuple[str, int]]:
    """One ``(text, placeholder_tokens)`` per tubelet, e.g. ``("Frame 1 sampled at 0.25 seconds and
    frame 2 sampled at 0.75 seconds: ", 240)``; a short last tubelet names only its real frames. The
    separators (the ``"This is a video:\\n"`` intro when ``plan.intro``, ``"\\n"`` between tubelets)
    are the caller's."""
    t, out = plan.temporal_patch, []
    for g in range(0, plan.num_frames, t):
        parts = [f"{'Frame' if i == g else 'frame'} {i + 1} sampled at {plan.frame_times[i]:.2f} seconds"
                 for i in range(g, min(g + t, plan.num_frames))]
        out.append((" and ".join(parts) + ": ", plan.tokens_per_tubelet))
    return out
