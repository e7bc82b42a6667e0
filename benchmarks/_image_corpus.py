"""The varied image corpus of ``image_processor.py --corpus varied``: 20 (mode, format) kinds, from
1x1 to 6000x400, in four size classes by the shorter side.

Kinds: JPEG RGB, L, CMYK; PNG RGB, RGBA, L, LA, P, P with a transparency key, 1-bit, I;16 (16-bit
data); WebP RGB, RGBA; GIF (P); TIFF I;16B, I (32-bit integers), F (float), CMYK, RGB; BMP RGB.
Sizes (:data:`SIZES`, the same for every kind): 1x1 to 1920x1080, with 1500x24, 6000x400 and their
transposes. Classes: ``tiny`` (shorter side < 32 px), ``small`` (< 256), ``medium``
(< 1024), ``large`` (>= 1024).
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

FAST = Image.Quantize.FASTOCTREE     # PIL's default median cut takes ~1.5 s on a 2 MP image

#: every kind's sizes: 5 tiny (two of them 1500 px long), 3 small, 4 medium (with the 15:1 extremes), 2 large
SIZES = [(1, 1), (7, 5), (31, 20), (1500, 24), (24, 1500), (48, 48), (200, 150), (120, 250), (640, 480),
         (512, 700), (6000, 400), (400, 6000), (1920, 1080), (1200, 1600)]
CLASSES = (("tiny", 32), ("small", 256), ("medium", 1024), ("large", 1 << 30))
#: kinds whose data is wider than 8 bits: scaled by bit depth, where the processor clips (a documented
#: difference), so left out of the output comparison
WIDE_KINDS = ("png_i16", "tiff_i16b", "tiff_i32")


def size_class(width: int, height: int) -> str:
    side = min(width, height)
    return next(name for name, limit in CLASSES if side < limit)


def _photo(rng: np.random.Generator, w: int, h: int) -> np.ndarray:
    """uint8 [h, w, 3]: gradients, a few discs and noise (compresses like a photo)."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    f = rng.uniform(1, 4, 3)
    arr = np.stack([127 + 120 * np.sin(x / max(w, 1) * 6.28 * f[0]), 127 + 120 * np.cos(y / max(h, 1) * 6.28 * f[1]),
                    127 + 120 * np.sin((x + y) / max(w + h, 1) * 6.28 * f[2])], axis=-1)
    arr += rng.normal(0, 6, arr.shape)
    return np.clip(arr, 0, 255).astype(np.uint8)


def _encode(im: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def _kinds() -> dict:
    """kind -> ``make(rgb uint8 [h, w, 3]) -> bytes``."""
    def gray(a):
        return Image.fromarray(a[..., 1])

    def rgba(a):
        alpha = np.where(np.arange(a.shape[1])[None, :] % 7 < 5, 255, 60).astype(np.uint8)
        return Image.fromarray(np.dstack([a, np.broadcast_to(alpha, a.shape[:2])]), "RGBA")

    def wide(a, mode, dtype, scale):
        data = (a[..., 1].astype(np.float64) * scale).astype(dtype)
        return Image.frombytes(mode, (a.shape[1], a.shape[0]), data.tobytes())

    return {
        "jpeg_rgb": lambda a: _encode(Image.fromarray(a), "JPEG", quality=85),
        "jpeg_l": lambda a: _encode(gray(a), "JPEG", quality=85),
        "jpeg_cmyk": lambda a: _encode(Image.fromarray(a).convert("CMYK"), "JPEG", quality=85),
        "png_rgb": lambda a: _encode(Image.fromarray(a), "PNG"),
        "png_rgba": lambda a: _encode(rgba(a), "PNG"),
        "png_l": lambda a: _encode(gray(a), "PNG"),
        "png_la": lambda a: _encode(rgba(a).convert("LA"), "PNG"),
        "png_p": lambda a: _encode(Image.fromarray(a).quantize(64, method=FAST), "PNG"),
        "png_p_trns": lambda a: _encode(Image.fromarray(a).quantize(64, method=FAST), "PNG", transparency=3),
        "png_1bit": lambda a: _encode(gray(a).convert("1"), "PNG"),
        "png_i16": lambda a: _encode(wide(a, "I;16", "<u2", 257), "PNG"),
        "webp_rgb": lambda a: _encode(Image.fromarray(a), "WEBP", quality=80),
        "webp_rgba": lambda a: _encode(rgba(a), "WEBP", lossless=True),
        "gif": lambda a: _encode(Image.fromarray(a).quantize(128, method=FAST), "GIF"),
        "tiff_i16b": lambda a: _encode(wide(a, "I;16B", ">u2", 16), "TIFF"),
        "tiff_i32": lambda a: _encode(wide(a, "I", "<i4", 1), "TIFF"),
        "tiff_f": lambda a: _encode(wide(a, "F", "<f4", 1), "TIFF"),
        "tiff_cmyk": lambda a: _encode(Image.fromarray(a).convert("CMYK"), "TIFF"),
        "tiff_rgb": lambda a: _encode(Image.fromarray(a), "TIFF", compression="tiff_lzw"),
        "bmp_rgb": lambda a: _encode(Image.fromarray(a), "BMP"),
    }


def varied_corpus(seed: int = 3, sizes=None) -> list[tuple[str, bytes, str]]:
    """``(name, encoded bytes, size class)``: every size of ``sizes`` (default :data:`SIZES`: 280
    images) in every kind."""
    rng = np.random.default_rng(seed)
    out = []
    for kind, make in _kinds().items():
        for i, (w, h) in enumerate(sizes or SIZES):
            out.append((f"{kind}_{i:02d}_{w}x{h}", make(_photo(rng, w, h)), size_class(w, h)))
    return out
