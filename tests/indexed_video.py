"""Test videos whose frames say which frame they are.

``make_indexed_video`` writes an mp4 (PyAV) in which frame ``i`` shows ``i`` as 12 bits: a 4x3
grid of black/white blocks covering the whole frame, most significant bit top left, row-major.
``read_frame_index`` reads the bits back from the centre of each block, so the code survives
lossy video coding, JPEG at quality 75 and any resize down to 64x64 (a block is then still
16x21 pixels and only its middle half is looked at).

Frame rates may be fractional: pass a ``Fraction`` (``Fraction(30000, 1001)``) or a float; a
non-integer float with ``|fps * 1.001 - N| < 0.001`` (an NTSC rate: 23.976, 29.97, 59.94) is
taken as exactly ``N * 1000/1001``, any other float as its nearest fraction with denominator <= 1001.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np

GRID_COLS = 4
GRID_ROWS = 3
NUM_BITS = GRID_COLS * GRID_ROWS
MAX_FRAMES = 1 << NUM_BITS


def as_rate(fps: float | int | Fraction) -> Fraction:
    """The exact frame rate a video is written with."""
    if isinstance(fps, Fraction):
        rate = fps
    elif isinstance(fps, int):
        rate = Fraction(fps)
    else:
        ntsc = float(fps) * 1001 / 1000
        if abs(ntsc - round(ntsc)) < 1e-3 and round(ntsc) >= 1 and abs(float(fps) - round(float(fps))) > 1e-6:
            rate = Fraction(round(ntsc) * 1000, 1001)
        else:
            rate = Fraction(float(fps)).limit_denominator(1001)
    if rate <= 0:
        raise ValueError(f"fps must be positive, got {fps!r}")
    return rate


def _bits(index: int) -> list[int]:
    return [(index >> (NUM_BITS - 1 - k)) & 1 for k in range(NUM_BITS)]


def _edges(length: int, parts: int) -> list[int]:
    return [(length * k) // parts for k in range(parts + 1)]


def frame_for_index(index: int, width: int, height: int) -> np.ndarray:
    """The RGB uint8 picture (height, width, 3) that encodes ``index``."""
    if not 0 <= index < MAX_FRAMES:
        raise ValueError(f"frame index {index} does not fit in {NUM_BITS} bits")
    image = np.zeros((height, width, 3), dtype=np.uint8)
    xs, ys = _edges(width, GRID_COLS), _edges(height, GRID_ROWS)
    for k, bit in enumerate(_bits(index)):
        if bit:
            row, col = divmod(k, GRID_COLS)
            image[ys[row]:ys[row + 1], xs[col]:xs[col + 1]] = 255
    return image


def read_frame_index(frame_rgb: np.ndarray) -> int:
    """The index a frame of ``make_indexed_video`` carries (any size, RGB or grayscale)."""
    frame = np.asarray(frame_rgb)
    if frame.ndim == 3:
        frame = frame.astype(np.float64).mean(axis=2)
    elif frame.ndim != 2:
        raise ValueError(f"expected an HxW or HxWxC picture, got shape {frame.shape}")
    height, width = frame.shape
    xs, ys = _edges(width, GRID_COLS), _edges(height, GRID_ROWS)
    index = 0
    for k in range(NUM_BITS):
        row, col = divmod(k, GRID_COLS)
        y0, y1, x0, x1 = ys[row], ys[row + 1], xs[col], xs[col + 1]
        qy, qx = (y1 - y0) // 4, (x1 - x0) // 4
        centre = frame[y0 + qy:y1 - qy, x0 + qx:x1 - qx]
        if centre.size == 0:
            raise ValueError(f"picture {width}x{height} is too small to read the index from")
        index = (index << 1) | int(centre.mean() >= 128)
    return index


def make_indexed_video(path: str | Path, width: int, height: int, fps: float | int | Fraction,
                       num_frames: int, codec: str = "libx264") -> Path:
    """Write an mp4 of ``num_frames`` frames, frame ``i`` showing index ``i``, at exactly ``fps``.

    Frame ``i`` has pts ``i`` in a time base of ``1/fps``. H.264 in 4:2:0 needs even sizes, so
    an odd width or height is written as 4:4:4 (which x264 accepts at any size) instead of being
    padded, and the file keeps the size asked for.
    """
    path = Path(path)
    if width < 8 or height < 6:
        raise ValueError(f"{width}x{height} is too small for a {GRID_COLS}x{GRID_ROWS} index grid")
    if not 1 <= num_frames <= MAX_FRAMES:
        raise ValueError(f"num_frames must be in [1, {MAX_FRAMES}], got {num_frames}")
    rate = as_rate(fps)
    odd = width % 2 or height % 2
    pix_fmt = "yuv444p" if odd and codec in ("libx264", "h264") else "yuv420p"
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream(codec, rate=rate)
        stream.width = width
        stream.height = height
        stream.pix_fmt = pix_fmt
        stream.time_base = 1 / rate
        stream.codec_context.time_base = 1 / rate
        for index in range(num_frames):
            frame = av.VideoFrame.from_ndarray(frame_for_index(index, width, height), format="rgb24")
            frame.pts = index
            frame.time_base = 1 / rate
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path
