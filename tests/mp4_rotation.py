"""Test helper (not a test): tiny H.264 MP4s written with PyAV in memory, and MP4s whose display
matrix is patched in place (ISO/IEC 14496-12 ``moov/trak/tkhd`` or ``moov/mvhd``).

Matrix layout, as stored: ``(a, b, u, c, d, v, x, y, w)``, big-endian int32; ``a b c d x y`` 16.16
fixed point, ``u v w`` 2.30. A stored pixel ``(p, q)`` (column, row) is shown at
``(a*p + c*q + x, b*p + d*q + y)``.
"""

from __future__ import annotations

import io
import math
import struct

import numpy as np

ONE = 1 << 16  # 1.0 in 16.16
W_ONE = 1 << 30  # 1.0 in 2.30
IDENTITY = (ONE, 0, 0, 0, ONE, 0, 0, 0, W_ONE)
# pattern "corners": marker colour per stored corner; the bottom-right corner stays empty.
CORNER_COLOURS = {"top_left": (255, 0, 0), "top_right": (0, 255, 0), "bottom_left": (0, 0, 255)}


def marker_side(width: int, height: int) -> int:
    """Side in pixels of the corner markers of :func:`pattern_frame`."""
    return max(2, min(width, height) // 4)


def pattern_frame(width: int, height: int, index: int, pattern: str = "corners") -> np.ndarray:
    """uint8 RGB [height, width, 3]. Background grey ``40 + 24 * (index % 8)`` tells frames apart.
    ``"corner"``: one white square top-left. ``"corners"``: red top-left, green top-right, blue
    bottom-left squares (see :data:`CORNER_COLOURS`), which pin down rotations *and* flips."""
    frame = np.full((height, width, 3), 40 + 24 * (index % 8), np.uint8)
    s = marker_side(width, height)
    if pattern == "corner":
        frame[:s, :s] = 255
    elif pattern == "corners":
        frame[:s, :s] = CORNER_COLOURS["top_left"]
        frame[:s, width - s:] = CORNER_COLOURS["top_right"]
        frame[height - s:, :s] = CORNER_COLOURS["bottom_left"]
    else:
        raise ValueError(f"unknown pattern {pattern!r}")
    return frame


def make_mp4(width: int, height: int, fps: int, num_frames: int, pattern: str = "corners", *,
             format: str = "mp4", rotation: float | None = None, hflip: bool = False) -> bytes:
    """An H.264 (libx264, yuv420p) file of :func:`pattern_frame` frames, written in memory.

    ``rotation`` (clockwise display degrees) / ``hflip``: written by PyAV's own muxer path
    (``VideoStream.set_display_rotation``, whose degrees are counter-clockwise, hence the negation).
    ``format``: any FFmpeg muxer name, e.g. ``"ismv"`` (writes a version-1 ``tkhd``), ``"matroska"``.
    """
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format=format) as container:
        stream = container.add_stream("libx264", rate=fps, options={"preset": "ultrafast"})
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        if rotation is not None or hflip:
            stream.set_display_rotation(-(rotation or 0.0), hflip=hflip)
        for i in range(num_frames):
            frame = av.VideoFrame.from_ndarray(pattern_frame(width, height, i, pattern), format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return buf.getvalue()


def rotation_matrix(degrees: int, width: int, height: int) -> tuple[int, ...]:
    """Matrix of a clockwise display rotation by ``degrees`` (0/90/180/270) of a ``width`` x
    ``height`` picture, translated back into the positive quadrant as cameras write it (90:
    ``x = height``; 180: ``x, y = width, height``; 270: ``y = width``)."""
    if degrees not in (0, 90, 180, 270):
        raise ValueError(f"degrees must be 0, 90, 180 or 270, got {degrees!r}")
    c, s = round(math.cos(math.radians(degrees))), round(math.sin(math.radians(degrees)))
    a, b, cc, d = c, s, -s, c  # (p, q) -> (c*p - s*q, s*p + c*q): clockwise with rows downwards
    corners = [(0, 0), (width, 0), (0, height), (width, height)]
    x = -min(a * p + cc * q for p, q in corners)
    y = -min(b * p + d * q for p, q in corners)
    return (a * ONE, b * ONE, 0, cc * ONE, d * ONE, 0, x * ONE, y * ONE, W_ONE)


def _children(data: bytes, start: int, end: int):
    """``(type, payload_offset, box_end)`` of the boxes in ``data[start:end]``."""
    while start + 8 <= end:
        size, kind = struct.unpack_from(">I4s", data, start)
        head = 8
        if size == 1:
            size, head = struct.unpack_from(">Q", data, start + 8)[0], 16
        elif size == 0:
            size = end - start
        if size < head or start + size > end:
            raise ValueError(f"corrupt box {kind!r} at {start}")
        yield kind, start + head, start + size
        start += size


def _child(data: bytes, start: int, end: int, kind: bytes) -> tuple[int, int] | None:
    return next(((p, e) for k, p, e in _children(data, start, end) if k == kind), None)


def _moov(data: bytes) -> tuple[int, int]:
    moov = _child(data, 0, len(data), b"moov")
    if moov is None:
        raise ValueError("no moov box")
    return moov


def video_tkhd_offsets(mp4: bytes) -> list[int]:
    """Payload offsets of the ``tkhd`` boxes of the video tracks (``mdia/hdlr`` type ``vide``)."""
    offsets = []
    for kind, start, end in _children(mp4, *_moov(mp4)):
        if kind != b"trak":
            continue
        tkhd, mdia = _child(mp4, start, end, b"tkhd"), _child(mp4, start, end, b"mdia")
        hdlr = mdia and _child(mp4, *mdia, b"hdlr")
        if tkhd and hdlr and mp4[hdlr[0] + 8:hdlr[0] + 12] == b"vide":
            offsets.append(tkhd[0])
    return offsets


def matrix_offset(mp4: bytes, payload: int, box: bytes) -> int:
    """Offset of the 9-int matrix in the ``tkhd``/``mvhd`` payload at ``payload`` (version 0 or 1)."""
    version = mp4[payload]
    if box == b"tkhd":
        return payload + (52 if version == 1 else 40)
    if box == b"mvhd":
        return payload + (48 if version == 1 else 36)
    raise ValueError(f"no matrix in {box!r}")


def read_matrix(mp4: bytes, box: bytes = b"tkhd") -> tuple[int, ...]:
    """The matrix of the first video track's ``tkhd`` (or of ``mvhd``) as stored."""
    payload = video_tkhd_offsets(mp4)[0] if box == b"tkhd" else _child(mp4, *_moov(mp4), b"mvhd")[0]
    return struct.unpack_from(">9i", mp4, matrix_offset(mp4, payload, box))


def with_display_matrix(mp4: bytes, matrix, box: bytes = b"tkhd") -> bytes:
    """Copy of ``mp4`` with every video track's ``tkhd`` matrix (or the movie's ``mvhd`` matrix,
    ``box=b"mvhd"``) overwritten by the 9 ints of ``matrix``; sizes and offsets are unchanged."""
    out = bytearray(mp4)
    if box == b"tkhd":
        payloads = video_tkhd_offsets(mp4)
    else:
        mvhd = _child(mp4, *_moov(mp4), b"mvhd")
        payloads = [mvhd[0]] if mvhd else []
    if not payloads:
        raise ValueError(f"no {box.decode()} box to patch")
    for payload in payloads:
        struct.pack_into(">9i", out, matrix_offset(mp4, payload, box), *matrix)
    return bytes(out)


def with_rotation(mp4: bytes, degrees: int) -> bytes:
    """Copy of ``mp4`` whose video tracks FFmpeg shows rotated clockwise by ``degrees`` (0, 90, 180,
    270): their ``tkhd`` matrix set to :func:`rotation_matrix` for the track's own width/height
    (the 16.16 fields after the matrix). ffprobe then reports ``rotation of -degrees``."""
    payloads = video_tkhd_offsets(mp4)
    if not payloads:
        raise ValueError("no video track to rotate")
    out = bytearray(mp4)
    for payload in payloads:
        at = matrix_offset(mp4, payload, b"tkhd")
        width, height = (v >> 16 for v in struct.unpack_from(">II", mp4, at + 36))
        struct.pack_into(">9i", out, at, *rotation_matrix(degrees, width, height))
    return bytes(out)
