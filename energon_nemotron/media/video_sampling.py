"""Which frames of a video to take, and the time each frame's prompt label names: three rules.

* ``hf`` — the official Nemotron Omni processor (``transformers`` ``BaseVideoProcessor.sample_frames``
  / ``default_sample_indices_fn``): ``n`` frames at source indices ``k * total // n`` (frame 0
  included), labels ``index * int(1000 / fps) / 1000`` (the processor's millisecond truncation).
* ``bridge`` — Megatron-Bridge 0.6.2 (``sample_video_frames_to_data_urls`` as its Nemotron Omni collate
  calls it): ``n = max(1, int(total / fps_src * int(fps)))`` or a fixed count, indices
  ``round(linspace(0, total - 1, n))`` (numpy's half-to-even, first and last frame included), all
  frames when ``n >= total``, ``[0]`` for one; labels ``k / sampled_fps`` with ``sampled_fps = (n - 1)
  / (t_last - t_first)`` over the chosen frames' times ``index / fps_src``.
* ``midpoints`` — the project's earlier rule: midpoints of ``n`` equal segments of the duration,
  decoded at those times, labelled with them.

Pure functions of the header metadata; no decoding.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

__all__ = ["hf_count", "hf_indices", "hf_label_times", "bridge_count", "bridge_indices", "bridge_label_times",
           "midpoint_times"]


def hf_indices(total: int, n: int) -> tuple[int, ...]:
    """``n`` source frame indices ``k * total // n`` (``k < n``) of a ``total``-frame video, as the
    processor's ``default_sample_indices_fn`` with ``num_frames=n``; ``1 <= n <= total``."""
    if not 1 <= n <= total:
        raise ValueError(f"need 1 <= n <= total frames, got n={n}, total={total}")
    return tuple(int(i) for i in np.arange(n, dtype=np.int64) * total // n)


def hf_count(total: int, fps_src: float, fps: float) -> int:
    """The processor's frame count for a target ``fps``: ``max(1, int(total / fps_src * fps))``."""
    return max(1, int(total / fps_src * fps))


def hf_label_times(indices, fps_src: float) -> tuple[float, ...]:
    """Prompt times of the processor's ``replace_video_token``: ``index * int(1000 / fps) / 1000``."""
    step_ms = int(1000.0 / fps_src)
    return tuple(int(i) * step_ms / 1000.0 for i in indices)


def bridge_count(total: int, fps_src: float, fps: float, num_frames: Optional[int], cap: Optional[int]) -> int:
    """Bridge's frame count: ``max(1, int(total / max(1e-6, fps_src) * int(fps)))`` when ``int(fps) > 0``
    and no fixed ``num_frames`` is asked for, else ``num_frames``; at most ``cap`` (Bridge's
    ``nframe_max``) when given."""
    n = num_frames if num_frames else max(1, int(total / max(1e-6, fps_src) * int(fps)))
    return min(n, cap) if cap else n


def bridge_indices(total: int, n: int) -> tuple[int, ...]:
    """Bridge's indices for ``n`` wanted frames of ``total``: all frames when ``n >= total``, ``(0,)``
    for one, else ``unique(round(linspace(0, total - 1, n)))``."""
    if n >= total:
        return tuple(range(total))
    if n == 1:
        return (0,)
    return tuple(int(i) for i in np.unique(np.round(np.linspace(0, total - 1, n)).astype(int)))


def bridge_label_times(indices, fps_src: float, fps: float) -> tuple[float, ...]:
    """Bridge's prompt times ``k / sampled_fps`` for the ``k``-th chosen frame. ``sampled_fps`` is
    ``(n - 1) / (t_last - t_first)`` with ``t = index / fps_src`` (1.0 for a zero span); with one
    frame it is the configured ``fps`` (the collate's fallback), so the label is 0."""
    times = [i / fps_src for i in indices]
    if len(times) > 1:
        span = times[-1] - times[0]
        rate = (len(times) - 1) / span if span > 0 else 1.0
    else:
        rate = fps
    return tuple(k / rate for k in range(len(times)))


def midpoint_times(duration: float, n: int) -> tuple[float, ...]:
    """Midpoints of ``n`` equal segments of ``[0, duration)``: ``duration / n * (k + 0.5)``, k < n."""
    if n < 1 or not duration > 0:
        raise ValueError(f"need n >= 1 and duration > 0, got n={n}, duration={duration}")
    seg = duration / n
    return tuple(seg * (k + 0.5) for k in range(n))
