"""What a ``PackedBatch`` says of its media: where each item's placeholder sits (``MediaSpan``) and
the items' processed tensors (``BatchMedia``)."""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import torch

from energon_nemotron.tensors import PackedTensor

#: the kinds of media item; ``image`` and ``video`` are the visual ones
MEDIA_KINDS = ("image", "video", "audio")

__all__ = ["MediaSpan", "BatchMedia", "MEDIA_KINDS"]


@dataclass(frozen=True)
class MediaSpan:
    """One media item of a packed row: where its placeholder sits and what it holds.

    - ``kind``: ``image``, ``video`` or ``audio``; ``sample_key``: the key of the source it is in.
    - ``token_start``: row position of the placeholder's first id; ``placeholder_len``: ids of the
      whole placeholder (``<img>`` … ``</img>``, a video's frame texts, ``<so_start>`` … ``<so_end>``).
    - ``num_tokens``: embedding tokens (placeholder ids the model replaces with embeddings).
    - ``runs``: ``(offset from token_start, length)`` of each run of embedding placeholder ids, in
      order (one per image, tile set or video tubelet; one per audio); the lengths sum to ``num_tokens``.
    - ``grid``: ``(grid_h, grid_w)`` patch grid of each unit (image, tile or frame; visual kinds);
      ``tiles``: units of a tiled image (only when more than one); ``frames``: a video's frames;
      ``clips``: an audio's clips; ``augment``: what NeMo-RL's augmentation drew for it (or None).

    Lists given for ``runs`` and ``grid`` are stored as tuples (of ints: ``TypeError`` otherwise).
    """

    kind: str
    sample_key: str
    token_start: int
    num_tokens: int
    placeholder_len: int
    runs: tuple[tuple[int, int], ...]
    grid: Optional[tuple[int, int]] = None
    tiles: Optional[int] = None
    frames: Optional[int] = None
    clips: Optional[int] = None
    #: what NeMo-RL's augmentation drew for the item (``scale 2, jitter``; ``tiling 24x30 -> 24x62``),
    #: for people: the preview shows it; None: not augmented
    augment: Optional[str] = None

    def __post_init__(self) -> None:
        if self.kind not in MEDIA_KINDS:
            raise ValueError(f"MediaSpan of {self.sample_key}: kind must be one of {MEDIA_KINDS}, got {self.kind!r}")
        index = operator.index                 # ints only (TypeError for a float or a str)
        object.__setattr__(self, "runs", tuple((index(offset), index(n)) for offset, n in self.runs))
        if self.grid is not None:
            gh, gw = self.grid
            object.__setattr__(self, "grid", (index(gh), index(gw)))

    @property
    def is_audio(self) -> bool:
        return self.kind == "audio"

    def as_dict(self) -> dict[str, Any]:
        """The span as the plain dict the preview prints (its JSON ``media`` entries, the text
        view): ``kind``, ``num_tokens``, ``placeholder_len``, ``runs`` (lists), then ``grid`` and
        ``tiles`` (image), ``frames`` and ``grid`` (video) or ``clips`` (audio) and ``augment`` where
        set, then ``sample_key`` and ``token_start``."""
        out: dict[str, Any] = {"kind": self.kind, "num_tokens": self.num_tokens,
                               "placeholder_len": self.placeholder_len, "runs": [list(r) for r in self.runs]}
        order = ("frames", "grid", "tiles", "clips", "augment") if self.kind == "video" else \
            ("grid", "tiles", "frames", "clips", "augment")
        for name in order:
            value = getattr(self, name)
            if value is not None:
                out[name] = list(value) if name == "grid" else value
        out["sample_key"] = self.sample_key
        out["token_start"] = self.token_start
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "MediaSpan":
        """Inverse of :meth:`as_dict` (``TypeError`` on a missing or unknown key)."""
        return cls(**d)


#: the tensor fields of ``BatchMedia`` (what its dict-style view holds), in order
_MEDIA_TENSORS = ("pixel_values", "image_sizes", "num_frames", "num_units", "sound_features", "sound_lengths")


@dataclass(frozen=True, eq=False)
class BatchMedia:
    """The processed media items of a batch, every row's: row after row, each row's items in the
    order of its ``media_spans``. Visual items (image and video spans) are in the first five fields,
    audio items in the last two; the fields of a kind the batch lacks are None. Energon path only.

    - ``pixel_values``: ``PackedTensor``, per visual item float32 [P_i, 3·p·p] (p = ``patch_size``;
      rows are patches of C·p·p values, (C, p, p) flattened, raster order; deduplicated: an image
      used twice or a video's repeated frames are stored once).
    - ``image_sizes``: ``PackedTensor``, per visual item int32 [units_i, 2]: the (grid_h, grid_w)
      patch grid of each image, tile or frame.
    - ``num_frames``: int32 [N_visual]: a video's frames as the Omni processor counts them (the
      sampled frames, without the tubelet padding); an image's units (1, or its tiles).
    - ``num_units``: int32 [N_visual]: units per visual item, the rows of its ``image_sizes``: a
      video's frames padded to whole tubelets (the last frame repeated), an image's tiles.
    - ``patch_size``: p, pixels per patch side of ``pixel_values`` (as the media options set it).
    - ``sound_features``: ``PackedTensor``, per audio item float32 [clips_i, F, mel] (F: the
      batch's longest clip, shorter ones zero-padded; deduplicated).
    - ``sound_lengths``: ``PackedTensor``, per audio item int64 [clips_i]: mel frames of each clip, its
      ``sound_length`` (``1 + L // hop``, or the valid ``L // hop`` with ``audio.sound_length: valid``).

    Read-only dict-style access (``media["pixel_values"]``, ``keys()``, ``values()``, ``items()``,
    ``in``, ``len``, truth) covers the tensor fields that are set, as the dict this type replaced
    held them; ``patch_size`` is an attribute only. :meth:`PackedBatch.media_items` says which
    items are a row's.
    """

    pixel_values: Optional[PackedTensor] = None
    image_sizes: Optional[PackedTensor] = None
    num_frames: Optional[torch.Tensor] = None
    num_units: Optional[torch.Tensor] = None
    patch_size: Optional[int] = None
    sound_features: Optional[PackedTensor] = None
    sound_lengths: Optional[PackedTensor] = None

    @property
    def num_visual(self) -> int:
        """Visual items (image and video) of the batch."""
        return 0 if self.pixel_values is None else len(self.pixel_values)

    @property
    def num_audio(self) -> int:
        """Audio items of the batch."""
        return 0 if self.sound_features is None else len(self.sound_features)

    def present(self) -> list[tuple[str, Any]]:
        """``(field name, value)`` of every field that is set (``patch_size`` too), in field order."""
        return [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self) if getattr(self, f.name) is not None]

    def map(self, fn: Callable[[Any], Any]) -> "BatchMedia":
        """A copy with ``fn`` applied to every tensor and ``PackedTensor`` that is set."""
        return dataclasses.replace(self, **{k: fn(v) for k, v in self.items()})

    # -- read-only dict-style view of the tensor fields ------------------------------------------
    def keys(self) -> list[str]:
        return [k for k in _MEDIA_TENSORS if getattr(self, k) is not None]

    def values(self) -> list[Any]:
        return [getattr(self, k) for k in self.keys()]

    def items(self) -> list[tuple[str, Any]]:
        return [(k, getattr(self, k)) for k in self.keys()]

    def get(self, name: str, default: Any = None) -> Any:
        return getattr(self, name) if name in self else default

    def __getitem__(self, name: str) -> Any:
        if name not in self:
            raise KeyError(name)
        return getattr(self, name)

    def __contains__(self, name: object) -> bool:
        return name in _MEDIA_TENSORS and getattr(self, str(name)) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())
