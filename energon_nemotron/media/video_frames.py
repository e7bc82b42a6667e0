"""Decoding a planned video into pre-patchified ViT rows (:mod:`energon_nemotron.media.video` plans it).

:func:`process_video` decodes only the frames a :class:`~energon_nemotron.media.video.VideoPlan`
chose, turns them upright, resizes and patchifies them into ``float32 [num_patches, 3*P*P]`` (rows
of frame ``f``: ``[f*grid_h*grid_w, (f+1)*grid_h*grid_w)``; the last tubelet padded by repeating the
last frame); :func:`process_video_frames` also tells which frames repeat one another (for
deduplication).
"""

from __future__ import annotations

import numpy as np
import torch

from energon_nemotron.errors import MediaError
from energon_nemotron.media.image_pixels import patch_grid
from energon_nemotron.media.rotation import rotate_frame
from energon_nemotron.media.video import VideoOptions, VideoPlan
from energon_nemotron.media.video_decode import VideoSource, frames_at_indices, frames_at_times

__all__ = ["process_video", "process_video_frames"]


def _decode(data: VideoSource, plan: VideoPlan, options: VideoOptions) -> list[np.ndarray]:
    """The planned frames, upright, one per planned frame (repeats share an array)."""
    if plan.frame_indices:
        got, seen = frames_at_indices(data, list(plan.frame_indices), options.max_pixels, options.backend)
        if seen is not None and seen != plan.rotation:
            raise MediaError(f"the decoded frames carry a display rotation of {seen} degrees, the plan "
                             f"{plan.rotation} (only MP4/MOV headers give it before decoding)")
        missing = [i for i in plan.frame_indices if i not in got]
        if missing:
            raise MediaError(f"metadata disagrees with the decoded video: frames {missing[:4]} of "
                             f"{plan.num_source_frames} planned do not decode ({len(got)} of "
                             f"{len(set(plan.frame_indices))} did)")
        frames = [got[i] for i in plan.frame_indices]
    else:
        keys = [int(t * plan.fps) for t in plan.frame_times]
        first: dict[int, float] = {}
        for k, t in zip(keys, plan.frame_times):
            first.setdefault(k, t)
        if options.backend == "decord":
            found = frames_at_indices(data, list(first), options.max_pixels, "decord")[0]
            decoded = [found[k] for k in first if k in found]
        else:
            decoded = frames_at_times(data, list(first.values()), options.max_pixels)
        slot = {k: i for i, k in enumerate(first)}
        missing = sum(slot[k] >= len(decoded) for k in keys)
        if not decoded or missing > 1:
            raise MediaError(f"metadata disagrees with the decoded video: {plan.num_frames} frames planned, "
                             f"{plan.num_frames - missing} decoded")
        frames = [decoded[min(slot[k], len(decoded) - 1)] for k in keys]
    if plan.rotation:
        turned = {id(f): rotate_frame(f, plan.rotation) for f in frames}
        frames = [turned[id(f)] for f in frames]
    for f in frames:
        if (f.shape[1], f.shape[0]) != (plan.width, plan.height):
            raise MediaError(f"a decoded frame is {f.shape[1]}x{f.shape[0]} but the plan is for "
                             f"{plan.width}x{plan.height} (rotation {plan.rotation})")
    return frames


def process_video(data: VideoSource, plan: VideoPlan, options: VideoOptions = VideoOptions()) -> torch.Tensor:
    """Decode the planned frames and return ``float32 [plan.num_patches, 3*P*P]`` (P = patch size).

    Frame ``k`` is source frame ``plan.frame_indices[k]`` (decode order), or, for the ``midpoints``
    rule, the frame shown at ``plan.frame_times[k]`` (one missing last frame is replaced by the last
    decoded one); it is turned upright, resized (``plan.resize``) to ``(grid_w*P, grid_h*P)``,
    normalised and patchified; the last tubelet is padded by repeating the last frame. A source
    frame chosen twice is processed once. ``MediaError`` when frames are missing or of another size.
    """
    return process_video_frames(data, plan, options)[0]


def process_video_frames(data: VideoSource, plan: VideoPlan,
                         options: VideoOptions = VideoOptions()) -> tuple[torch.Tensor, tuple[int, ...]]:
    """:func:`process_video`'s rows and, per frame of them (``num_tubelets * temporal_patch``, each
    ``grid_h * grid_w`` rows), the index of the distinct decoded frame it shows, numbered in order
    of first appearance: frames with the same index have identical rows (a source frame chosen
    twice, the last tubelet's padding), so a deduplicated store keeps them once."""
    p, per_frame = options.patch_size, plan.grid_h * plan.grid_w
    frames = _decode(data, plan, options)
    out = torch.empty(plan.num_patches, 3 * p * p, dtype=torch.float32)
    done: dict[int, int] = {}                              # id(frame) -> first logical frame showing it
    sources: list[int] = []
    for f, frame in enumerate(frames):
        dst = out[f * per_frame:(f + 1) * per_frame]
        if id(frame) in done:                              # same source frame again: copy its rows
            dst.copy_(out[done[id(frame)] * per_frame:(done[id(frame)] + 1) * per_frame])
            sources.append(sources[done[id(frame)]])
            continue
        patch_grid(frame, plan.grid_h, plan.grid_w, p, plan.resize, out=dst.view(plan.grid_h, plan.grid_w, 3, p, p))
        sources.append(len(done))
        done[id(frame)] = f
    last = out[(plan.num_frames - 1) * per_frame:plan.num_frames * per_frame]
    for f in range(plan.num_frames, plan.num_tubelets * plan.temporal_patch):
        out[f * per_frame:(f + 1) * per_frame].copy_(last)
        sources.append(sources[plan.num_frames - 1])
    return out, tuple(sources)
