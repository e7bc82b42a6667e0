"""Decoding the chosen frames of a video: RGB uint8 ``[H, W, 3]`` arrays, as stored (not rotated).

* :func:`frames_at_times` — frames shown at given times, with Energon's ``AVDecoder`` (one container,
  keyframe seeking): the ``midpoints`` rule.
* :func:`frames_at_indices` — frames by their decode-order index: PyAV decodes forward from the
  start and converts only the wanted frames, as the processor's own ``read_video_pyav`` enumerates
  them; or decord's ``VideoReader.get_batch`` (Megatron-Bridge's decoder).

Both check the stream's header size against ``max_pixels`` before decoding any frame; the PyAV
index decoder also reports the display rotation the decoded frames carry.
"""

from __future__ import annotations

import io
import os
from typing import Optional, Union

import numpy as np

from energon_nemotron.errors import MediaError
from energon_nemotron.media.rotation import display_rotation, frame_display_matrix

VideoSource = Union[bytes, bytearray, memoryview, str, "os.PathLike[str]"]


def open_bytes(data: VideoSource):
    """A binary file object over the bytes or the path."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        return io.BytesIO(bytes(data))
    return open(os.fspath(data), "rb")


def check_pixels(width: int, height: int, max_pixels: int) -> None:
    """``MediaError`` (``media_too_large``) when a ``width`` x ``height`` frame exceeds ``max_pixels``."""
    if width * height > max_pixels:
        raise MediaError(f"video frames are {width}x{height} = {width * height} pixels, over video.max_pixels "
                         f"{max_pixels}", code="media_too_large")


def _check_header(f, max_pixels: int) -> None:
    import av

    with av.open(f, "r") as container:
        if container.streams.video:
            cc = container.streams.video[0].codec_context
            check_pixels(int(cc.width or 0), int(cc.height or 0), max_pixels)
    f.seek(0)


def frames_at_times(data: VideoSource, times: list[float], max_pixels: int) -> list[np.ndarray]:
    """Frames shown at ``times`` (one ``get_video_clips`` call, Energon's keyframe seeking); ranges
    past the end yield nothing, so the list may be shorter than ``times``."""
    from megatron.energon.av import AVDecoder

    try:
        with open_bytes(data) as f:
            _check_header(f, max_pixels)
            clips, _ = AVDecoder(f, suppress_warnings=True).get_video_clips([(t, t) for t in times])
    except MediaError:
        raise
    except Exception as e:  # FFmpeg errors, Energon asserts (no video stream / no fps), ...
        raise MediaError(f"cannot decode video: {type(e).__name__}: {e}") from e
    return [clip[0].permute(1, 2, 0).numpy() for clip in clips]


def _indices_pyav(f, wanted: set, last: int, max_pixels: int) -> tuple[dict[int, np.ndarray], Optional[int]]:
    import av

    out: dict[int, np.ndarray] = {}
    rotation = None
    with av.open(f, "r") as container:
        if not container.streams.video:
            raise MediaError("no video stream in the container")
        stream = container.streams.video[0]
        check_pixels(int(stream.codec_context.width or 0), int(stream.codec_context.height or 0), max_pixels)
        stream.codec_context.thread_type = "NONE"
        for i, frame in enumerate(container.decode(stream)):
            if rotation is None:
                rotation = display_rotation(frame_display_matrix(frame))
            if i in wanted:
                out[i] = frame.to_ndarray(format="rgb24")
            if i >= last:
                break
    return out, rotation


def _indices_decord(f, indices: list[int], max_pixels: int) -> dict[int, np.ndarray]:
    try:
        import decord
    except ImportError as e:
        raise ImportError("backend='decord' needs decord: pip install 'energon-nemotron[decord]'") from e
    _check_header(f, max_pixels)
    reader = decord.VideoReader(f, ctx=decord.cpu(0), num_threads=1)
    have = [i for i in indices if i < len(reader)]
    return dict(zip(have, reader.get_batch(have).asnumpy())) if have else {}


def frames_at_indices(data: VideoSource, indices: list[int], max_pixels: int,
                      backend: str = "pyav") -> tuple[dict[int, np.ndarray], Optional[int]]:
    """``({index: frame}, rotation)`` for the decode-order ``indices`` that exist (missing ones are
    absent); ``rotation``: the clockwise display rotation the decoded frames carry (PyAV), or None
    (decord does not say)."""
    wanted = sorted(set(int(i) for i in indices))
    try:
        with open_bytes(data) as f:
            if backend == "decord":
                return _indices_decord(f, wanted, max_pixels), None
            return _indices_pyav(f, set(wanted), wanted[-1], max_pixels)
    except (MediaError, ImportError):
        raise
    except Exception as e:
        raise MediaError(f"cannot decode video: {type(e).__name__}: {e}") from e
