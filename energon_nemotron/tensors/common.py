"""Helpers shared by the ragged-tensor containers (``tensors.packed``, ``tensors.dedup``), the
flat byte buffers (``tensors.flat``) and the TP broadcast (``parallel.broadcast``): dtype names,
shared-memory allocation, item-index normalisation and typed views of byte buffers."""

from __future__ import annotations

import math
import operator
from typing import Any, Optional, Sequence

import torch

__all__ = ["shared_empty", "dtype_name", "dtype_from_name", "to_args", "check_parts", "describe", "item_index",
           "slice_bounds", "typed_view", "wire_fields", "wire_rows_view"]


def shared_empty(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised CPU tensor allocated directly in shared memory (no copy into it later)."""
    shape = tuple(int(d) for d in shape)
    storage = torch.UntypedStorage._new_shared(math.prod(shape) * dtype.itemsize)
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape)


def dtype_name(dtype: torch.dtype) -> str:
    """Canonical name of a torch dtype, e.g. ``torch.bfloat16 -> "bfloat16"``."""
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"expected a torch.dtype, got {dtype!r}")
    return str(dtype).rsplit(".", 1)[-1]


def dtype_from_name(name: str) -> torch.dtype:
    """Inverse of :func:`dtype_name` (``"float32" -> torch.float32``); ValueError if unknown."""
    dtype = getattr(torch, name, None) if isinstance(name, str) and name.isidentifier() else None
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown torch dtype name {name!r}")
    return dtype


def to_args(device: Any, dtype: Optional[torch.dtype], floating: bool) -> tuple[Any, Optional[torch.dtype]]:
    """``(device, dtype to cast to or None)`` of ``PackedTensor.to(device, dtype)`` for data that is
    ``floating`` or not (a dtype may come positionally; it must be floating: TypeError)."""
    if isinstance(device, torch.dtype) and dtype is None:
        device, dtype = None, device
    if dtype is not None and not dtype.is_floating_point:
        raise TypeError(f"PackedTensor.to casts floating data only; dtype must be floating, got {dtype}")
    return device, (dtype if dtype is not None and floating else None)


def check_parts(parts: Sequence[Any]) -> list[Any]:
    """``parts`` (``PackedTensor``s) as a list; ValueError when empty or when feature shapes or
    dtypes differ."""
    parts = list(parts)
    if not parts:
        raise ValueError("concat needs at least one part (to know feature shape and dtype)")
    first = parts[0]
    for k, p in enumerate(parts):
        if p.feature_shape != first.feature_shape or p.dtype != first.dtype:
            raise ValueError(f"part {k} has feature shape {p.feature_shape} and dtype {p.dtype}, "
                             f"part 0 has {first.feature_shape} and {first.dtype}")
    return parts


def describe(x: Any) -> str:
    """How validation messages name a value: a tensor's shape and dtype, else its type."""
    if isinstance(x, torch.Tensor):
        return f"tensor of shape {tuple(x.shape)} and dtype {x.dtype}"
    return type(x).__name__


def item_index(i: Any, n: int) -> int:
    """Item ``i`` of ``n`` as an index in ``0 .. n-1`` (negative counts from the end); IndexError
    when out of range."""
    k = operator.index(i)
    k = k + n if k < 0 else k
    if not 0 <= k < n:
        raise IndexError(f"item index {i} out of range for {n} items")
    return k


def slice_bounds(i: Any, j: Any, n: int) -> tuple[int, int]:
    """Items ``i .. j-1`` of ``n`` as ``(i, j)`` with ``0 <= i <= j <= n`` (negative indices count
    from the end); IndexError otherwise."""
    i, j = operator.index(i), operator.index(j)
    i, j = (i + n if i < 0 else i), (j + n if j < 0 else j)
    if not 0 <= i <= j <= n:
        raise IndexError(f"slice({i}, {j}) out of range for {n} items")
    return i, j


def typed_view(raw: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A contiguous 1-D uint8 tensor seen as ``dtype``: a view, or a copy when its storage offset is
    not aligned to the item size."""
    try:
        return raw.view(dtype)
    except RuntimeError:
        return raw.clone().view(dtype)


def wire_rows_view(buffer: Any, dtype: torch.dtype, feature_shape: tuple, rows: int, what: str) -> torch.Tensor:
    """``[rows, *feature_shape]`` of ``dtype`` over a wire buffer (1-D uint8; shares its memory when
    aligned, else a copy); ValueError when it is not one or its size does not match (``what``: how
    the message names the rows)."""
    if not isinstance(buffer, torch.Tensor) or buffer.dtype != torch.uint8 or buffer.dim() != 1:
        raise ValueError(f"wire buffer must be a 1-D uint8 tensor, got {describe(buffer)}")
    expected = rows * math.prod(feature_shape) * dtype.itemsize
    if buffer.numel() != expected:
        raise ValueError(f"wire buffer has {buffer.numel()} bytes, header needs {expected} "
                         f"({rows} {what} x {feature_shape} x {dtype.itemsize} bytes of {dtype_name(dtype)})")
    return typed_view(buffer.contiguous(), dtype).reshape(rows, *feature_shape)


def wire_fields(header: Any) -> tuple[torch.dtype, tuple[int, ...], list[int]]:
    """``(dtype, feature_shape, offsets)`` of a ``PackedTensor`` wire header; ValueError when one is
    missing or malformed, or a dimension is negative."""
    try:
        dtype = dtype_from_name(header["dtype"])
        feature_shape = tuple(operator.index(d) for d in header["feature_shape"])
        offsets = [operator.index(o) for o in header["offsets"]]
    except (KeyError, TypeError) as e:
        raise ValueError(f"malformed PackedTensor wire header: {e!r}") from e
    if any(d < 0 for d in feature_shape):
        raise ValueError(f"bad feature_shape {feature_shape} in wire header")
    return dtype, feature_shape, offsets
