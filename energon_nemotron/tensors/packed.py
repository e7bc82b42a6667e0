"""``PackedTensor``: a ragged list of per-item tensors stored as one tensor plus offsets.

Layout. Item ``i`` has shape ``[n_i, *feature_shape]`` (e.g. one image's patches ``[P_i, 768]``,
one audio's clips ``[clips_i, F, 128]``, one item's grid metadata ``[n_i, 2]``). All items share
``feature_shape`` and dtype and are concatenated along dim 0::

    data:    [sum(n_i), *feature_shape]           any dtype
    offsets: int64 [N + 1], offsets[0] == 0, non-decreasing, offsets[-1] == data.shape[0]
    item i:  data[offsets[i]:offsets[i + 1]]       (a view)

``offsets`` lives on the same device as ``data``. Default pickling (the two tensors) works. For a
``torch.distributed`` broadcast, ``wire_header()`` is a small JSON-able dict (dtype name, feature
shape, offsets) and ``wire_buffer()`` one flat uint8 tensor with the data bytes;
``PackedTensor.from_wire(header, buffer)`` rebuilds the exact (bit-identical) tensor.

Deduplicated form (:mod:`energon_nemotron.tensors.dedup`): ``tensors.from_keyed(items,
keys)`` stores each distinct segment once (items point at segments through a CSR table; a key names
a segment's provenance) and returns a ``DedupPackedTensor``, a subclass with the same logical API
(``data`` is then built lazily). ``physical_nbytes`` / ``logical_nbytes`` tell the two sizes apart;
for a plain instance they are equal and nothing else changes.
"""

from __future__ import annotations

import operator
from typing import Any, Iterator, Optional, Sequence

import torch

from energon_nemotron.tensors.common import (check_parts, describe, dtype_name, item_index, shared_empty, slice_bounds,
                                            to_args, wire_fields, wire_rows_view)


class PackedTensor:
    """``data``: Tensor ``[sum n_i, *feature_shape]``; ``offsets``: int64 ``[N+1]`` on the same device
    (``offsets[0] == 0``, non-decreasing, ``offsets[-1] == data.shape[0]``). See the module docstring.
    """

    #: whether items point at a deduplicated segment store (``DedupPackedTensor``)
    is_deduplicated = False

    def __init__(self, data: torch.Tensor, offsets: torch.Tensor) -> None:
        if not isinstance(data, torch.Tensor) or data.dim() < 1:
            raise ValueError(f"data must be a tensor with at least one dim, got {describe(data)}")
        if not isinstance(offsets, torch.Tensor) or offsets.dim() != 1 or offsets.dtype != torch.int64:
            raise ValueError(f"offsets must be a 1-D int64 tensor, got {describe(offsets)}")
        if offsets.device != data.device:
            raise ValueError(f"offsets are on {offsets.device} but data is on {data.device}")
        host = offsets.cpu()  # one transfer for all checks
        if host.numel() == 0 or int(host[0]) != 0:
            raise ValueError(f"offsets must start with 0, got {host.tolist()[:8]}")
        if bool((host[1:] < host[:-1]).any()):
            raise ValueError("offsets must be non-decreasing")
        if int(host[-1]) != data.shape[0]:
            raise ValueError(f"offsets end at {int(host[-1])} but data has {data.shape[0]} rows")
        self.data = data
        self.offsets = offsets

    @classmethod
    def _unchecked(cls, data: torch.Tensor, offsets: torch.Tensor) -> "PackedTensor":
        """Build without validation (for results derived from an already valid instance)."""
        out = cls.__new__(cls)
        out.data, out.offsets = data, offsets
        return out

    @classmethod
    def from_list(
        cls, items: Sequence[torch.Tensor], *, feature_shape: Optional[Sequence[int]] = None,
        dtype: Optional[torch.dtype] = None, shared: bool = False,
    ) -> "PackedTensor":
        """Pack ``items`` (each ``[n_i, *feature_shape]``, one dtype and device) into one tensor.

        With no items, ``feature_shape`` and ``dtype`` are required. When given alongside items they
        must match them (ValueError otherwise; nothing is cast). The data is a new tensor (copy).
        ``shared``: write it straight into shared memory (CPU), as a ``DataLoader`` worker should, so
        that sending it to the main process copies nothing more.
        """
        items = list(items)
        if not items:
            if feature_shape is None or dtype is None:
                raise ValueError("from_list([]) needs feature_shape and dtype")
            return cls.empty(tuple(feature_shape), dtype)
        first = items[0]
        for i, t in enumerate(items):
            if not isinstance(t, torch.Tensor) or t.dim() < 1:
                raise ValueError(f"item {i} must be a tensor with at least one dim, got {describe(t)}")
            if t.shape[1:] != first.shape[1:]:
                raise ValueError(f"item {i} has shape {tuple(t.shape)}: trailing shape {tuple(t.shape[1:])} "
                                 f"differs from item 0's {tuple(first.shape[1:])} (shape {tuple(first.shape)})")
            if t.dtype != first.dtype:
                raise ValueError(f"item {i} has dtype {t.dtype}, item 0 has {first.dtype}")
        if feature_shape is not None and tuple(feature_shape) != tuple(first.shape[1:]):
            raise ValueError(f"items have feature shape {tuple(first.shape[1:])}, expected {tuple(feature_shape)}")
        if dtype is not None and dtype != first.dtype:
            raise ValueError(f"items have dtype {first.dtype}, expected {dtype}")
        lengths = torch.tensor([0] + [t.shape[0] for t in items], dtype=torch.int64)
        offsets = torch.cumsum(lengths, 0).to(first.device)
        if shared and first.device.type == "cpu":
            shape = (int(offsets[-1]), *first.shape[1:])
            out = shared_empty(shape, first.dtype)
            return cls._unchecked(torch.cat(items, dim=0, out=out), offsets)
        return cls._unchecked(torch.cat(items, dim=0), offsets)

    @classmethod
    def empty(cls, feature_shape: Sequence[int], dtype: torch.dtype, device: Any = None) -> "PackedTensor":
        """No items: data ``[0, *feature_shape]`` of ``dtype``, offsets ``[0]``."""
        data = torch.empty((0, *feature_shape), dtype=dtype, device=device)
        return cls._unchecked(data, torch.zeros(1, dtype=torch.int64, device=data.device))

    @property
    def feature_shape(self) -> tuple[int, ...]:
        """Shape of one row of an item (``data.shape[1:]``)."""
        return tuple(self.physical_data.shape[1:])

    @property
    def dtype(self) -> torch.dtype:
        return self.physical_data.dtype

    @property
    def device(self) -> torch.device:
        return self.physical_data.device

    @property
    def physical_data(self) -> torch.Tensor:
        """The tensor whose bytes ``wire_buffer`` holds: ``data`` (the segment store when deduplicated)."""
        return self.data

    @property
    def physical_nbytes(self) -> int:
        """Bytes stored (``data``'s; the distinct segments' when deduplicated)."""
        return self.physical_data.numel() * self.physical_data.element_size()

    @property
    def logical_nbytes(self) -> int:
        """Bytes of the logical concatenation ``[sum n_i, *feature_shape]``."""
        return self.physical_nbytes

    def __len__(self) -> int:
        """Number of items N."""
        return self.offsets.shape[0] - 1

    def __getitem__(self, i: int) -> torch.Tensor:
        """Item ``i`` as a view ``[n_i, *feature_shape]``; negative indices count from the end."""
        k = item_index(i, len(self))
        start, stop = self.offsets[k : k + 2].tolist()
        return self.data[start:stop]

    def __iter__(self) -> Iterator[torch.Tensor]:
        bounds = self.offsets.tolist()
        for start, stop in zip(bounds[:-1], bounds[1:]):
            yield self.data[start:stop]

    def lengths(self) -> torch.Tensor:
        """int64 ``[N]``: rows per item (``n_i``), on the offsets' device."""
        return self.offsets[1:] - self.offsets[:-1]

    def as_tensor(self) -> torch.Tensor:
        """The concatenated data ``[sum n_i, *feature_shape]`` (not a copy)."""
        return self.data

    def slice(self, i: int, j: int) -> "PackedTensor":
        """Items ``i .. j-1`` (negative indices count from the end; need ``0 <= i <= j <= N`` after
        that, else IndexError). Offsets are rebased to 0; data is a view."""
        i, j = slice_bounds(i, j, len(self))
        offsets = self.offsets[i : j + 1]
        start, stop = offsets[[0, -1]].tolist()
        return PackedTensor._unchecked(self.data[start:stop], offsets - offsets[0])

    @staticmethod
    def concat(parts: Sequence["PackedTensor"]) -> "PackedTensor":
        """All items of plain ``parts`` in order. Feature shapes and dtypes must agree (ValueError
        naming the part otherwise); empty parts are fine; ``parts`` itself must not be empty. Parts
        that may be deduplicated go through ``energon_nemotron.tensors.concat`` (TypeError here)."""
        parts = check_parts(parts)
        if any(p.is_deduplicated for p in parts):
            raise TypeError("PackedTensor.concat joins plain parts; energon_nemotron.tensors.concat joins "
                            "deduplicated ones too")
        first = parts[0]
        pieces, base = [first.offsets[:1]], 0
        for p in parts:
            pieces.append(p.offsets[1:] + base)
            base += p.data.shape[0]
        return PackedTensor._unchecked(torch.cat([p.data for p in parts]), torch.cat(pieces))

    def to(
        self, device: Any = None, dtype: Optional[torch.dtype] = None, non_blocking: bool = False
    ) -> "PackedTensor":
        """Move to ``device`` and cast floating-point data to ``dtype`` (a floating dtype; integer and
        bool data keep their dtype). Offsets stay int64. ``to(torch.bfloat16)`` also works."""
        device, target = to_args(device, dtype, self.data.is_floating_point())
        data = self.data.to(device=device, dtype=target, non_blocking=non_blocking)
        offsets = self.offsets.to(device=data.device, non_blocking=non_blocking)
        return PackedTensor._unchecked(data, offsets)

    def pin_memory(self) -> "PackedTensor":
        """Copy of a CPU instance with both tensors in pinned (page-locked) memory."""
        return PackedTensor._unchecked(self.data.pin_memory(), self.offsets.pin_memory())

    def equal(self, other: Any) -> bool:
        """True when ``other`` is a PackedTensor on the same device with the same dtype, feature
        shape, offsets and data (``torch.equal`` semantics: NaN != NaN); logical, so a deduplicated
        ``other`` with the same items is equal."""
        if isinstance(other, PackedTensor) and other.is_deduplicated:
            return other.equal(self)
        return (isinstance(other, PackedTensor) and self.device == other.device and self.dtype == other.dtype
                and self.data.shape == other.data.shape and torch.equal(self.offsets, other.offsets)
                and torch.equal(self.data, other.data))

    def __repr__(self) -> str:
        return (f"PackedTensor(n={len(self)}, rows={self.data.shape[0]}, feature_shape={self.feature_shape}, "
                f"dtype={self.dtype}, device={self.device})")

    def wire_header(self) -> dict:
        """JSON-able ``{"dtype": str, "feature_shape": [int], "offsets": [int]}`` (no data)."""
        return {"dtype": dtype_name(self.dtype), "feature_shape": list(self.feature_shape),
                "offsets": self.offsets.tolist()}

    def wire_buffer(self) -> torch.Tensor:
        """The data bytes as one flat contiguous uint8 tensor (a view if data is contiguous)."""
        return self.data.contiguous().view(-1).view(torch.uint8)

    @staticmethod
    def wire_rows(header: dict) -> int:
        """Rows of ``[rows, *feature_shape]`` whose bytes the wire buffer of ``header`` holds (the
        stored segments' when deduplicated). KeyError/IndexError/TypeError on a malformed header."""
        table = header.get("dedup")
        return operator.index((table["segment_offsets"] if table is not None else header["offsets"])[-1])

    @classmethod
    def from_wire(cls, header: dict, buffer: torch.Tensor) -> "PackedTensor":
        """Inverse of ``wire_header`` / ``wire_buffer``. The result lives on ``buffer``'s device and
        shares its memory when alignment allows. ValueError on a malformed header or wrong size, and
        on a header with a ``dedup`` table (``energon_nemotron.tensors.from_wire`` reads both)."""
        if isinstance(header, dict) and "dedup" in header:
            raise ValueError("a deduplicated wire header: read it with energon_nemotron.tensors.from_wire")
        dtype, feature_shape, offsets = wire_fields(header)
        if not offsets:
            raise ValueError("empty offsets in wire header")
        data = wire_rows_view(buffer, dtype, feature_shape, offsets[-1], "rows")
        return cls(data, torch.tensor(offsets, dtype=torch.int64, device=buffer.device))


