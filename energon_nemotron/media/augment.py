"""NeMo-RL's media augmentations (its ``nemotron_multimodal`` encoder, after Megatron-LM's
multimodal task encoder), as pure functions of their random draws.

Each rule takes the uniforms it consumes as arguments, so that it is exact for any draw and the
draw itself comes from elsewhere (``media.draws``: a pure function of seed, dataset, sample key,
pass and item). NeMo-RL draws from the process-global ``random`` / ``torch`` generators instead;
given the same uniforms, every rule here gives what NeMo-RL's gives.

- **Video scale** (:func:`scale_values`, :func:`pick_scale`): a scale drawn uniformly from
  ``1``, ``2 … frames_up`` and ``1/2 … 1/resolution_up``. A scale ``s`` multiplies the frame cap and
  the frame rate (both truncated to integers, the cap at least ``min_frames``, the rate at least 1)
  and divides the frame's patch budget (``int(target_patches / s)``); with ``resolution_only`` the
  cap and the rate stay, so only the resolution changes. A video with fewer source frames than
  ``min_frames`` takes all of them at scale 1.
- **Frame count and times** (:func:`nemo_rl_frame_count`, :func:`nemo_rl_times`): Megatron-LM's
  selection: ``n = min(max(int(fps * duration), min_frames), cap)``, rounded to a multiple of the
  temporal patch (up when the source has that many frames and the cap allows, else down, at least
  one tubelet); times ``(duration - 1) / n * (k + 0.5)`` in float32, with the temporal jitter
  moving each by up to half a segment (``u * segment - segment / 2``), clamped to ``[0, duration]``.
- **Tiling perturbation** (:func:`tiling_perturbation`), for images of ``data_augment`` datasets:
  with probability ``prob``, half the time one side of the patch grid shrinks by 32 patches (the
  width or the height at even odds when both exceed 32, else the one that does), else one side
  grows by 32 when the grid is under its budget; before the grid's sides are rounded to the
  pixel-shuffle multiple.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

__all__ = ["scale_values", "pick_scale", "nemo_rl_frame_count", "nemo_rl_times", "tiling_perturbation",
           "TILING_STEP", "scaled_target"]

#: patches a side of the grid moves by in the tiling perturbation
TILING_STEP = 32


def scale_values(frames_up: Optional[int], resolution_up: Optional[int]) -> tuple[float, ...]:
    """The scales a video's draw picks from: ``1.0``, then ``2.0 … frames_up``, then ``1/2 …
    1/resolution_up`` (None or 1: none of that kind)."""
    values = [1.0]
    if frames_up is not None:
        values += [float(v) for v in range(2, frames_up + 1)]
    if resolution_up is not None:
        values += [1.0 / v for v in range(2, resolution_up + 1)]
    return tuple(values)


def pick_scale(values: Sequence[float], u: float) -> float:
    """The value a uniform ``u`` in ``[0, 1)`` picks, each of ``values`` with probability
    ``1 / len(values)`` (what ``random.choice`` does with its own draw)."""
    return values[min(int(u * len(values)), len(values) - 1)]


def nemo_rl_frame_count(duration: float, num_source_frames: int, scale: float, *, min_frames: int,
                        max_frames: int, fps: float, temporal_patch: int,
                        resolution_only: bool) -> tuple[int, float]:
    """``(frames to take, the scale that applies)`` of a clip of ``duration`` seconds and
    ``num_source_frames`` frames at the drawn ``scale`` (module docs); the scale is 1 for a clip
    shorter than ``min_frames`` frames."""
    if num_source_frames < min_frames:
        n, scale, cap = num_source_frames, 1.0, max_frames
    else:
        if resolution_only:
            cap, rate = max_frames, fps
        else:
            cap, rate = max(min_frames, int(max_frames * scale)), max(1, int(fps * scale))
        n = min(max(int(rate * duration), min_frames), cap)
    if n % temporal_patch:
        down = n // temporal_patch * temporal_patch
        up = down + temporal_patch
        n = up if up <= num_source_frames and up <= cap else max(temporal_patch, down)
    return n, scale


def nemo_rl_times(duration: float, n: int, jitter: Optional[Sequence[float]] = None,
                  clip_start: float = 0.0) -> tuple[float, ...]:
    """The ``n`` frame times of a clip of ``duration`` seconds starting at ``clip_start``: float32
    ``(duration - 1) / n * (k + 0.5)``; ``jitter``: ``n`` uniforms in ``[0, 1)`` (float32), each
    moving its frame by ``u * segment - segment / 2``, then clamped to ``[0, duration]``."""
    segment = float(duration - 1) / n
    times = segment * (torch.arange(n, dtype=torch.float32) + 0.5)
    if jitter is not None:
        half = segment * 0.5
        times += torch.as_tensor(jitter, dtype=torch.float32) * (half * 2) - half
        times = torch.clamp(times, 0, duration)
    times += clip_start
    return tuple(float(t) for t in times.tolist())


def scaled_target(target_patches: int, scale: float) -> int:
    """A video frame's patch budget at ``scale``: ``int(target_patches / scale)``."""
    return int(target_patches / scale)


def tiling_perturbation(grid_h: int, grid_w: int, available: int, draws: Sequence[float],
                        prob: float) -> tuple[int, int]:
    """``(grid_h, grid_w)`` after the tiling perturbation (module docs) with the uniforms
    ``draws`` (three, in ``[0, 1)``: whether, which way, which side); ``available``: the grid's
    patch budget."""
    u_apply, u_way, u_side = draws[0], draws[1], draws[2]
    if not u_apply < prob:
        return grid_h, grid_w
    step = TILING_STEP
    if u_way < 0.5:
        if grid_w > step and grid_h > step:
            if u_side < 0.5:
                grid_w -= step
            else:
                grid_h -= step
        elif grid_w > step:
            grid_w -= step
        elif grid_h > step:
            grid_h -= step
    elif grid_w * grid_h < available:
        if u_side < 0.5:
            grid_w += step
        else:
            grid_h += step
    return grid_h, grid_w

