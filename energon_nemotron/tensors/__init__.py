"""Ragged tensors and their transport: the library's containers for per-item data of a batch.

``PackedTensor`` (:mod:`~energon_nemotron.tensors.packed`) holds a list of per-item tensors
``[n_i, *feature_shape]`` as one tensor plus offsets; ``DedupPackedTensor``
(:mod:`~energon_nemotron.tensors.dedup`) stores each distinct segment once (a video's repeated
frames, an image used twice). :func:`from_keyed`, :func:`concat` and :func:`from_wire` build
either kind; ``tensors.flat`` packs several CPU tensors into one byte buffer for pickling between
processes.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from energon_nemotron.tensors.common import dtype_from_name, dtype_name
from energon_nemotron.tensors.dedup import DedupPackedTensor, wire_key
from energon_nemotron.tensors.packed import PackedTensor

__all__ = ["PackedTensor", "DedupPackedTensor", "from_keyed", "concat", "from_wire", "dtype_name", "dtype_from_name",
           "wire_key"]


def from_keyed(items: Sequence[Any], keys: Sequence[Any], *, feature_shape: Optional[Sequence[int]] = None,
               dtype: Optional[torch.dtype] = None, shared: bool = False) -> DedupPackedTensor:
    """A deduplicated instance (``DedupPackedTensor.from_keyed``): ``items[i]`` a tensor
    ``[n_i, *feature_shape]`` with one hashable provenance key ``keys[i]``, or a sequence of segment
    tensors with one key per segment; each distinct key is stored once (None: never shared); the
    same key with another shape or dtype is a ValueError."""
    return DedupPackedTensor.from_keyed(items, keys, feature_shape=feature_shape, dtype=dtype, shared=shared)


def concat(parts: Sequence[PackedTensor]) -> PackedTensor:
    """All items of ``parts`` in order. Feature shapes and dtypes must agree (ValueError naming the
    part otherwise); empty parts are fine; ``parts`` itself must not be empty. When a part is
    deduplicated the result is too (``DedupPackedTensor.concat``: shared across parts by key)."""
    parts = list(parts)
    if any(p.is_deduplicated for p in parts):
        return DedupPackedTensor.concat(parts)
    return PackedTensor.concat(parts)


def from_wire(header: dict, buffer: torch.Tensor) -> PackedTensor:
    """Inverse of ``wire_header`` / ``wire_buffer`` of either kind: a header with a ``dedup`` table
    gives a ``DedupPackedTensor``. The result lives on ``buffer``'s device and shares its memory
    when alignment allows; ValueError on a malformed header or a wrong size."""
    if isinstance(header, dict) and "dedup" in header:
        return DedupPackedTensor.from_wire(header, buffer)
    return PackedTensor.from_wire(header, buffer)
