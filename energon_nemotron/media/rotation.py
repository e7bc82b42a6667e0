"""Display rotation of videos, applied the way the ``ffmpeg`` CLI's autorotate applies it.

A display matrix is 9 int32 ``(a, b, u, c, d, v, x, y, w)`` (``a b c d x y`` 16.16 fixed point,
``u v w`` 2.30), laid out alike in ISO/IEC 14496-12 ``tkhd`` and FFmpeg's ``AV_PKT_DATA_DISPLAYMATRIX``.
A stored pixel ``(p, q)`` (column, row; rows grow downwards) is shown at ``(a*p + c*q + x, b*p + d*q + y)``.
``av_display_rotation_get`` returns ``-atan2(b, a)``, a *counter-clockwise* angle; ffmpeg negates it
into a clockwise ``theta`` and inserts ``transpose=clock`` at 90, ``hflip,vflip`` at 180 and
``transpose=cclock`` at 270. A portrait phone video stored landscape has ``a b c d = 0 1 -1 0``:
ffprobe says "rotation of -90", and it is 90 (clockwise) here.

PyAV 18 reads no stream-level side data (it only writes it, ``VideoStream.set_display_matrix``); only
decoded frames carry the matrix (``VideoFrame.side_data``; ``VideoFrame.rotation`` is its
counter-clockwise angle truncated to int). So MP4/MOV headers are read here directly.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Sequence

import numpy as np

_IDENTITY = (1 << 16, 0, 0, 0, 1 << 16, 0, 0, 0, 1 << 30)
_ROTATIONS = (0, 90, 180, 270)


def display_rotation(matrix: Sequence[int] | None) -> int:
    """Clockwise degrees (0, 90, 180 or 270) that show frames carrying ``matrix`` (9 ints, or None
    for none: 0) upright. Within 1 degree of a multiple of 90 this is exactly ffmpeg's choice; other
    angles, which ffmpeg turns with the ``rotate`` filter (black corners), are rounded to the nearest
    multiple of 90 (an exact tie goes clockwise). A degenerate matrix (a zero column: NaN in
    libavutil, no filter in ffmpeg) gives 0. A mirrored one (negative determinant; ffmpeg would add
    ``hflip``/``vflip``/``transpose=*_flip``) raises ``ValueError``: an int cannot describe it."""
    if matrix is None:
        return 0
    m = [int(v) for v in matrix]
    if len(m) != 9:
        raise ValueError(f"a display matrix has 9 values, got {len(m)}")
    if math.hypot(m[0], m[3]) == 0 or math.hypot(m[1], m[4]) == 0:
        return 0
    if m[0] * m[4] - m[1] * m[3] < 0:
        raise ValueError(f"display matrix {tuple(m)} mirrors the picture; only rotations are supported")
    # av_display_rotation_get is -atan2(b/|col1|, a/|col0|); ffmpeg's theta is its negation.
    theta = math.degrees(math.atan2(m[1] / math.hypot(m[1], m[4]), m[0] / math.hypot(m[0], m[3])))
    return 90 * (math.floor(theta / 90 + 0.5) % 4)


def frame_display_matrix(frame) -> tuple[int, ...] | None:
    """The 9-int display matrix of a decoded ``av.VideoFrame`` (FFmpeg copies the container's into
    every frame and adds one from an H.264/HEVC display-orientation SEI), or None."""
    from av.sidedata.sidedata import Type as SideDataType

    # By key, not by iterating: PyAV 18.1.1 made the container a Mapping (iteration gives the keys;
    # 18.1.0 gave the entries), and its lookup by type is the same in both.
    sd = frame.side_data.get(SideDataType.DISPLAYMATRIX)
    return None if sd is None else struct.unpack("=9i", bytes(sd))


def video_rotation(stream, header_only: bool = False) -> int:
    """Clockwise rotation (0, 90, 180, 270) that shows the decoded frames of ``stream`` (a PyAV video
    stream of an ``av.open`` input container) upright, per :func:`display_rotation`.

    MP4/MOV/3GP (the formats phones write) are read from the headers without decoding: the ``tkhd``
    matrix of the stream's track times the ``mvhd`` one, computed as FFmpeg's mov demuxer does; the
    container's bytes are read through its file object (position restored) or its path. Otherwise
    (other formats, unreachable bytes) one frame is decoded, which consumes packets of the
    container: call this before decoding, or seek back. The header path does not see a matrix that
    only an H.264/HEVC display-orientation SEI carries. ``header_only``: never decode (formats
    other than MP4/MOV give 0). ``ValueError`` for a mirrored matrix.
    """
    container = stream.container
    if {"mov", "mp4"} & set(str(container.format.name).split(",")):
        matrix = _header_matrix(container, stream.id)
        if matrix is not None:
            return display_rotation(matrix)
    if header_only:
        return 0
    for frame in container.decode(stream):
        return display_rotation(frame_display_matrix(frame))
    return 0


def rotate_frame(frame: np.ndarray, rotation: int) -> np.ndarray:
    """``frame`` [H, W, C] (or [H, W]; any dtype, e.g. uint8 RGB) rotated clockwise by ``rotation``
    (0, 90, 180, 270): a new C-contiguous array of the same dtype, [W, H, C] for 90 and 270."""
    k = _quarter_turns(rotation)
    return np.rot90(frame, k=-k, axes=(0, 1)).copy()  # .copy(): C order, never a view


def rotated_size(width: int, height: int, rotation: int) -> tuple[int, int]:
    """Display ``(width, height)`` of a ``width`` x ``height`` frame rotated by ``rotation``."""
    return (height, width) if _quarter_turns(rotation) % 2 else (width, height)


def _quarter_turns(rotation: int) -> int:
    if rotation not in _ROTATIONS:
        raise ValueError(f"rotation must be one of {_ROTATIONS}, got {rotation!r}")
    return int(rotation) // 90


def _header_matrix(container, track_id: int) -> tuple[int, ...] | None:
    """The display matrix of track ``track_id`` from the ISO-BMFF boxes (the identity when there is
    none); None when the bytes are unreachable, truncated, or hold no such track."""
    f = getattr(getattr(container, "file", None), "file", None)  # PyIOFile wraps the user's file
    try:
        if f is not None and callable(getattr(f, "seek", None)) and getattr(f, "seekable", lambda: True)():
            pos = f.tell()
            try:
                return _mp4_matrix(f, track_id)
            finally:
                f.seek(pos)
        if isinstance(container.name, str) and os.path.isfile(container.name):
            with open(container.name, "rb") as fh:
                return _mp4_matrix(fh, track_id)
    except (struct.error, IndexError):  # truncated boxes: let the decoder decide
        pass
    return None


def _boxes(f, start: int, end: int):
    """``(type, payload_start, box_end)`` of the boxes in ``f[start:end]``."""
    while start + 8 <= end:
        f.seek(start)
        size, kind = struct.unpack(">I4s", f.read(8))
        head = 8
        if size == 1:
            size, head = struct.unpack(">Q", f.read(8))[0], 16
        elif size == 0:
            size = end - start
        if size < head or start + size > end:
            return
        yield kind, start + head, start + size
        start += size


def _matrix_at(f, payload: int, offset_v0: int, offset_v1: int) -> tuple[int, ...]:
    f.seek(payload)
    version = f.read(1)[0]
    f.seek(payload + (offset_v1 if version == 1 else offset_v0))
    return struct.unpack(">9i", f.read(36))


def _mp4_matrix(f, track_id: int) -> tuple[int, ...] | None:
    """tkhd matrix x mvhd matrix of the track, in FFmpeg's fixed-point arithmetic; None: no track."""
    f.seek(0, 2)
    moov = next(((start, stop) for kind, start, stop in _boxes(f, 0, f.tell()) if kind == b"moov"), None)
    movie = _IDENTITY
    for kind, start, stop in _boxes(f, *moov) if moov else ():
        if kind == b"mvhd":
            movie = _matrix_at(f, start, 36, 48)
        for child, tkhd, _ in _boxes(f, start, stop) if kind == b"trak" else ():
            f.seek(tkhd)
            head = f.read(24)
            if child == b"tkhd" and struct.unpack_from(">I", head, 20 if head[0] == 1 else 12)[0] == track_id:
                track = _matrix_at(f, tkhd, 40, 52)
                return tuple(sum((track[3 * i + e] * movie[3 * e + j]) >> (30 if e == 2 else 16)
                                 for e in range(3)) for i in range(3) for j in range(3))
    return None
