"""Image planning, from the header only (``media.image_pixels`` decodes into pre-patchified ViT rows).

Two layouts, both for RADIO ViT-H/16 with 2x2 pixel shuffle (see the notes, §1):

* ``dynamic`` — Nemotron 3 Nano Omni "dynamic native resolution": one resize to a patch grid close to
  the native size, between ``min_patches`` and ``max_patches`` patches, even sides.
* ``tiling`` — InternVL tiling of Llama-3.1-Nemotron-Nano-VL / Nemotron-Nano-12B-v2-VL: the closest
  ``i x j`` tile grid (``i`` tiles across, ``j`` down, ``1 <= i*j <= max_tiles``), plus a thumbnail.

:func:`plan_image` decides the geometry and the LLM token count from ``(width, height)`` alone, so
token budgeting can run before decoding; ``image_pixels.process_image`` decodes and produces
``float32 [num_patches, 3*P*P]``, patches in raster order, each flattened in ``(C, P, P)`` order,
``(v / 255 - mean) / std`` with the OpenAI-CLIP mean/std (the ``hf`` resize folds it into its passes
as ``v * SCALE + SHIFT``: the same to float rounding).

Decoding to RGB follows the Omni processor's ``convert_to_rgb``: an image with an alpha band or a
``transparency`` key is composited onto white; others go through ``convert("RGB")`` (palette,
grayscale, CMYK, ...). Integer data wider than 8 bits (``I;16*``, ``I``): where every value fits in
8 bits (an 8-bit image stored in a 16-bit PNG) it is kept as it is, exactly as the processor keeps it;
otherwise it is scaled to 8 bits by its real bit depth (``v >> (bits - 8)``, ``bits`` that of the
largest value: 12-bit data ``v >> 4``, 16-bit ``v >> 8``), a deliberate difference: PIL's conversion,
which the processor uses, clips such data at 255, which turns the image near-white. A GIF or other
animated file gives its first frame.

Resize (``ImageOptions.resize``): ``hf`` — float32 antialiased bicubic without clamping, as the
processor's ``interpolate(..., mode="bicubic", antialias=True)`` (:mod:`energon_nemotron.media.resize`);
``pil`` — PIL bicubic on uint8 (rounded and clamped after each pass), the earlier behaviour.

EXIF orientation (tag 0x0112, read from the header, never after decoding) is applied by both
:func:`image_header_size` and ``image_pixels.process_image``; unreadable EXIF counts as no orientation. (The
processor applies it only when it opens a path itself; fed a PIL image it does not.)
"""

from __future__ import annotations

import functools
import io
import math
import numbers
import os
import struct
from dataclasses import dataclass, field
from typing import Callable, Literal, Optional, Union

import torch
from PIL import Image

from energon_nemotron.errors import ConfigError, MediaError
from energon_nemotron.media.augment import tiling_perturbation

__all__ = ["CLIP_MEAN", "CLIP_STD", "ImageOptions", "ImagePlan", "image_header_size", "plan_image"]

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
#: CLIP mean/std shaped [1, 3, 1] to broadcast over patch rows viewed as [N, 3, P*P] (image and video)
MEAN_PLANES = torch.tensor(CLIP_MEAN, dtype=torch.float32).view(1, 3, 1)
STD_PLANES = torch.tensor(CLIP_STD, dtype=torch.float32).view(1, 3, 1)
#: ``(v / 255 - mean) / std`` as ``v * SCALE + SHIFT``, folded into the float resize's passes
SCALE = (1.0 / (255.0 * torch.tensor(CLIP_STD, dtype=torch.float64))).to(torch.float32)
SHIFT = (-torch.tensor(CLIP_MEAN, dtype=torch.float64) / torch.tensor(CLIP_STD, dtype=torch.float64)).to(torch.float32)

ImageSource = Union[bytes, bytearray, memoryview, str, "os.PathLike[str]"]
_ORIENTATION_TAG = 0x0112
_TRANSPOSE = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180,
              4: Image.Transpose.FLIP_TOP_BOTTOM, 5: Image.Transpose.TRANSPOSE,
              6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE, 8: Image.Transpose.ROTATE_90}
_DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, struct.error, Image.DecompressionBombError)


@dataclass(frozen=True)
class ImageOptions:
    """How images become patches. ``dynamic`` uses ``min_patches``/``max_patches`` (the budget);
    ``tiling`` uses ``tile_size``/``max_tiles``/``use_thumbnail``. ``max_pixels`` bounds the source
    size (checked on the header, before decoding); ``resize`` picks the kernel (``hf``: the Omni
    processor's float antialiased bicubic; ``pil``: PIL bicubic on uint8). Invalid values raise
    ``ConfigError``."""

    mode: Literal["dynamic", "tiling"] = "dynamic"
    patch_size: int = 16
    min_patches: int = 1024
    max_patches: int = 13312
    downsample: int = 2
    tile_size: int = 512
    max_tiles: int = 12
    use_thumbnail: bool = True
    max_pixels: int = 89_478_485
    resize: Literal["hf", "pil"] = "hf"
    #: NeMo-RL's tiling augmentation, for the images of datasets with ``data_augment: true``
    #: (dynamic mode): the probability that a side of the grid moves by 32 patches (``media.augment``)
    tiling_augment_prob: float = field(default=0.4, metadata={"min": 0})

    def __post_init__(self) -> None:
        if self.mode not in ("dynamic", "tiling"):
            raise ConfigError(f"image mode must be 'dynamic' or 'tiling', not {self.mode!r}")
        if self.resize not in ("hf", "pil"):
            raise ConfigError(f"image resize must be 'hf' or 'pil', not {self.resize!r}")
        for name in ("patch_size", "min_patches", "max_patches", "downsample", "tile_size", "max_tiles",
                     "max_pixels"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"image option {name} must be a positive int, not {value!r}")
        if self.max_patches < self.downsample ** 2:
            raise ConfigError(f"max_patches {self.max_patches} < downsample**2 = {self.downsample ** 2}")
        if not (isinstance(self.tiling_augment_prob, (int, float)) and 0 <= self.tiling_augment_prob <= 1):
            raise ConfigError(f"image option tiling_augment_prob must be in [0, 1], not {self.tiling_augment_prob!r}")
        if self.tile_size % (self.patch_size * self.downsample):
            raise ConfigError(f"tile_size {self.tile_size} is not a multiple of patch_size * downsample "
                              f"= {self.patch_size * self.downsample}")


@dataclass(frozen=True)
class ImagePlan:
    """Geometry of one image, decided from its size only.

    ``width``/``height``: source size after EXIF orientation. ``grid_h``/``grid_w``: patch grid of ONE
    unit (the resized image in dynamic mode, one tile in tiling mode). ``num_units``: 1 (dynamic) or
    tiles plus thumbnail (tiling). ``tiles_w``/``tiles_h``: the tile grid (1, 1 in dynamic mode).
    ``num_tokens``: LLM tokens after pixel shuffle. ``patch_size``: pixels per patch side and
    ``resize`` the kernel (additions to the data-model fields, needed to process without the options)."""

    width: int
    height: int
    grid_h: int
    grid_w: int
    num_units: int
    tiles_w: int
    tiles_h: int
    num_tokens: int
    patch_size: int = 16
    resize: str = "hf"

    @property
    def num_patches(self) -> int:
        """Rows of :func:`process_image`'s output: ``num_units * grid_h * grid_w``."""
        return self.num_units * self.grid_h * self.grid_w

    @property
    def has_thumbnail(self) -> bool:
        """True when the last unit is a whole-image thumbnail (tiling mode, more than one tile)."""
        return self.num_units > self.tiles_w * self.tiles_h

    @property
    def unit_size(self) -> tuple[int, int]:
        """``(width, height)`` in pixels of one unit."""
        return self.grid_w * self.patch_size, self.grid_h * self.patch_size


def _orientation(im: Image.Image) -> int:
    """EXIF orientation 1..8 from what the header already holds (the base ``getexif``: a PNG's own
    ``getexif`` would decode the image to look for an eXIf chunk after the pixel data)."""
    try:
        value = Image.Image.getexif(im).get(_ORIENTATION_TAG, 1)
    except (*_DECODE_ERRORS, KeyError, TypeError, IndexError):
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def _open(source: ImageSource) -> Image.Image:
    """Open (header only) from bytes or a path; failures become ``MediaError``."""
    try:
        if isinstance(source, (bytes, bytearray, memoryview)):
            return Image.open(io.BytesIO(source))
        return Image.open(os.fspath(source))
    except Image.DecompressionBombError as e:
        raise MediaError(f"image over Pillow's decompression-bomb limit: {e}", code="media_too_large") from None
    except _DECODE_ERRORS as e:
        raise MediaError(f"cannot read image header: {type(e).__name__}: {e}") from None


def _oriented_size(im: Image.Image, orientation: int) -> tuple[int, int]:
    w, h = im.size
    return (h, w) if orientation >= 5 else (w, h)


def image_header_size(data: ImageSource) -> tuple[int, int]:
    """``(width, height)`` from the header only (no pixel decoding), swapped for EXIF orientations
    5-8. Raises ``MediaError("cannot read image header: ...")`` for unreadable or unknown formats."""
    with _open(data) as im:
        return _oriented_size(im, _orientation(im))


def _dynamic_grid(width: int, height: int, o: ImageOptions,
                  perturb: Optional[Callable[[int, int, int], tuple[int, int]]] = None) -> tuple[int, int]:
    """Omni ``get_patch_grid_size``: native grid with Python (banker's) ``round(x + 0.5)``, scaled
    down to ``max_patches``, up to ``min_patches``, then sides made multiples of ``downsample``.
    ``perturb(grid_h, grid_w, budget)``: a change of the grid before the rounding to multiples
    (NeMo-RL's tiling augmentation, ``media.augment.tiling_perturbation``)."""
    m, budget, least = o.downsample, o.max_patches, o.min_patches
    gh, gw = round(height / o.patch_size + 0.5), round(width / o.patch_size + 0.5)
    shrink = min(math.sqrt(budget / (gh * gw)), 1.0)
    # a side floored to 0 (aspect beyond ~1:budget) is kept at 1; the reference divides by zero there
    gh, gw = max(1, math.floor(shrink * gh)), max(1, math.floor(shrink * gw))
    if budget > least and gh * gw < least:
        grow = math.sqrt(least / (gh * gw))
        gh, gw = math.ceil(grow * gh), math.ceil(grow * gw)
    if perturb is not None:
        gh, gw = perturb(gh, gw, budget)
    if gh % m:
        up = gh + m - gh % m
        gh = up if up * gw <= budget else max(m, gh - gh % m)
    if gw % m:
        up = gw + m - gw % m
        gw = up if gh * up <= budget else max(m, gw - gw % m)
    if gh * gw > budget and perturb is None:       # a perturbed grid may pass its budget, as in NeMo-RL
        raise MediaError(f"image {width}x{height}: aspect ratio too extreme for max_patches {budget} "
                         f"({gh}x{gw} patches)")
    return gh, gw


@functools.lru_cache(maxsize=None)
def _tile_grids(max_tiles: int) -> tuple[tuple[int, int], ...]:
    """``(i, j)`` with ``1 <= i*j <= max_tiles`` ordered by ``i*j``, equal products in the order the
    InternVL set yields them (built with the same insertions, so ties resolve identically)."""
    grids = set()
    for n in range(1, max_tiles + 1):
        for i in range(1, n + 1):
            for j in range(1, n + 1):
                if 1 <= i * j <= max_tiles:
                    grids.add((i, j))
    return tuple(sorted(grids, key=lambda g: g[0] * g[1]))


def _tile_grid(width: int, height: int, o: ImageOptions) -> tuple[int, int]:
    """InternVL ``find_closest_aspect_ratio``: least ``|w/h - i/j|``; on an exact tie the later
    (larger) grid wins only if the image area exceeds half of the grid's pixel area."""
    aspect, area = width / height, width * height
    best, best_diff = (1, 1), math.inf
    for i, j in _tile_grids(o.max_tiles):
        diff = abs(aspect - i / j)
        if diff < best_diff:
            best, best_diff = (i, j), diff
        elif diff == best_diff and area > 0.5 * o.tile_size * o.tile_size * i * j:
            best = (i, j)
    return best


def plan_image(width: int, height: int, options: ImageOptions = ImageOptions(),
               augment: Optional[tuple[float, float, float]] = None) -> ImagePlan:
    """The :class:`ImagePlan` for a ``width`` x ``height`` image (after EXIF orientation), from the
    size alone. Raises ``MediaError`` for a non-positive size or more than ``max_pixels`` pixels.
    ``augment``: the three uniforms of NeMo-RL's tiling augmentation (``media.augment``; dynamic
    mode only), None: not augmented."""
    if not (isinstance(width, numbers.Integral) and isinstance(height, numbers.Integral)) or min(width, height) < 1:
        raise MediaError(f"invalid image size {width!r}x{height!r}")
    width, height = int(width), int(height)
    if width * height > options.max_pixels:
        raise MediaError(f"image {width}x{height} = {width * height} pixels exceeds max_pixels "
                         f"{options.max_pixels} (decompression-bomb guard)", code="media_too_large")
    shuffle = options.downsample ** 2
    if options.mode == "dynamic":
        perturb = None if augment is None else \
            (lambda h, w, budget: tiling_perturbation(h, w, budget, augment, options.tiling_augment_prob))
        gh, gw = _dynamic_grid(width, height, options, perturb)
        return ImagePlan(width, height, gh, gw, 1, 1, 1, gh * gw // shuffle, options.patch_size, options.resize)
    if augment is not None:
        raise ConfigError("the tiling augmentation (data_augment) applies to image mode dynamic, not tiling")
    tw, th = _tile_grid(width, height, options)
    units = tw * th + (1 if options.use_thumbnail and tw * th > 1 else 0)
    g = options.tile_size // options.patch_size
    return ImagePlan(width, height, g, g, units, tw, th, units * g * g // shuffle, options.patch_size, options.resize)
