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

Deduplicated form (:mod:`energon_nemotron.media.dedup_tensor`): ``PackedTensor.from_keyed(items,
keys)`` stores each distinct segment once (items point at segments through a CSR table; a key names
a segment's provenance) and returns a ``DedupPackedTensor``, a subclass with the same logical API
(``data`` is then built lazily). ``physical_nbytes`` / ``logical_nbytes`` tell the two sizes apart;
for a plain instance they are equal and nothing else changes.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Iterator, Optional, Sequence

import torch


def shared_empty(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised CPU tensor allocated directly in shared memory (no copy into it later)."""
    numel = 1
    for d in shape:
        numel *= int(d)
    storage = torch.UntypedStorage._new_shared(numel * torch.empty(0, dtype=dtype).element_size())
    return torch.empty(0, dtype=dtype).set_(storage, 0, tuple(shape))


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


def _to_args(device: Any, dtype: Optional[torch.dtype], floating: bool) -> tuple[Any, Optional[torch.dtype]]:
    """``(device, dtype to cast to or None)`` of ``PackedTensor.to(device, dtype)`` for data that is
    ``floating`` or not (a dtype may come positionally; it must be floating: TypeError)."""
    if isinstance(device, torch.dtype) and dtype is None:
        device, dtype = None, device
    if dtype is not None and not dtype.is_floating_point:
        raise TypeError(f"PackedTensor.to casts floating data only; dtype must be floating, got {dtype}")
    return device, (dtype if dtype is not None and floating else None)


class PackedTensor:
    """``data``: Tensor ``[sum n_i, *feature_shape]``; ``offsets``: int64 ``[N+1]`` on the same device
    (``offsets[0] == 0``, non-decreasing, ``offsets[-1] == data.shape[0]``). See the module docstring.
    """

    #: whether items point at a deduplicated segment store (``DedupPackedTensor``)
    is_deduplicated = False

    def __init__(self, data: torch.Tensor, offsets: torch.Tensor) -> None:
        if not isinstance(data, torch.Tensor) or data.dim() < 1:
            raise ValueError(f"data must be a tensor with at least one dim, got {_describe(data)}")
        if not isinstance(offsets, torch.Tensor) or offsets.dim() != 1 or offsets.dtype != torch.int64:
            raise ValueError(f"offsets must be a 1-D int64 tensor, got {_describe(offsets)}")
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
                raise ValueError(f"item {i} must be a tensor with at least one dim, got {_describe(t)}")
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

    @staticmethod
    def from_keyed(items: Sequence[Any], keys: Sequence[Any], *, feature_shape: Optional[Sequence[int]] = None,
                   dtype: Optional[torch.dtype] = None, shared: bool = False) -> "PackedTensor":
        """A deduplicated instance (``DedupPackedTensor.from_keyed``): ``items[i]`` a tensor
        ``[n_i, *feature_shape]`` with one hashable provenance key ``keys[i]``, or a sequence of
        segment tensors with one key per segment; each distinct key is stored once (None: never
        shared); the same key with another shape or dtype is a ValueError."""
        from energon_nemotron.media.dedup_tensor import DedupPackedTensor

        return DedupPackedTensor.from_keyed(items, keys, feature_shape=feature_shape, dtype=dtype, shared=shared)

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
        n, k = len(self), operator.index(i)
        k = k + n if k < 0 else k
        if not 0 <= k < n:
            raise IndexError(f"item index {i} out of range for {n} items")
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
        n = len(self)
        i, j = operator.index(i), operator.index(j)
        i, j = (i + n if i < 0 else i), (j + n if j < 0 else j)
        if not 0 <= i <= j <= n:
            raise IndexError(f"slice({i}, {j}) out of range for {n} items")
        offsets = self.offsets[i : j + 1]
        start, stop = offsets[[0, -1]].tolist()
        return PackedTensor._unchecked(self.data[start:stop], offsets - offsets[0])

    @staticmethod
    def concat(parts: Sequence["PackedTensor"]) -> "PackedTensor":
        """All items of ``parts`` in order. Feature shapes and dtypes must agree (ValueError naming the
        part otherwise); empty parts are fine; ``parts`` itself must not be empty. When a part is
        deduplicated the result is too (``DedupPackedTensor.concat``: shared across parts by key)."""
        parts = _check_parts(parts)
        if any(p.is_deduplicated for p in parts):
            from energon_nemotron.media.dedup_tensor import DedupPackedTensor

            return DedupPackedTensor.concat(parts)
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
        device, target = _to_args(device, dtype, self.data.is_floating_point())
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
        shares its memory when alignment allows. ValueError on a malformed header or wrong size. A
        header with a ``dedup`` table gives a ``DedupPackedTensor``."""
        if isinstance(header, dict) and "dedup" in header:
            from energon_nemotron.media.dedup_tensor import DedupPackedTensor

            return DedupPackedTensor.from_wire(header, buffer)
        try:
            dtype = dtype_from_name(header["dtype"])
            feature_shape = tuple(operator.index(d) for d in header["feature_shape"])
            offsets = [operator.index(o) for o in header["offsets"]]
        except (KeyError, TypeError) as e:
            raise ValueError(f"malformed PackedTensor wire header: {e!r}") from e
        if any(d < 0 for d in feature_shape) or not offsets:
            raise ValueError(f"bad feature_shape {feature_shape} or empty offsets in wire header")
        data = wire_rows_view(buffer, dtype, feature_shape, offsets[-1], "rows")
        return cls(data, torch.tensor(offsets, dtype=torch.int64, device=buffer.device))


def wire_rows_view(buffer: Any, dtype: torch.dtype, feature_shape: tuple, rows: int, what: str) -> torch.Tensor:
    """``[rows, *feature_shape]`` of ``dtype`` over a wire buffer (1-D uint8; shares its memory when
    aligned, else a copy); ValueError when it is not one or its size does not match (``what``: how
    the message names the rows)."""
    if not isinstance(buffer, torch.Tensor) or buffer.dtype != torch.uint8 or buffer.dim() != 1:
        raise ValueError(f"wire buffer must be a 1-D uint8 tensor, got {_describe(buffer)}")
    expected = rows * math.prod(feature_shape) * dtype.itemsize
    if buffer.numel() != expected:
        raise ValueError(f"wire buffer has {buffer.numel()} bytes, header needs {expected} "
                         f"({rows} {what} x {feature_shape} x {dtype.itemsize} bytes of {dtype_name(dtype)})")
    buffer = buffer.contiguous()
    try:
        flat = buffer.view(dtype)
    except RuntimeError:  # storage offset not aligned to the item size: copy
        flat = buffer.clone().view(dtype)
    return flat.reshape(rows, *feature_shape)


def _check_parts(parts: Sequence[PackedTensor]) -> list[PackedTensor]:
    """``parts`` as a list; ValueError when empty or when feature shapes or dtypes differ."""
    parts = list(parts)
    if not parts:
        raise ValueError("concat needs at least one part (to know feature shape and dtype)")
    first = parts[0]
    for k, p in enumerate(parts):
        if p.feature_shape != first.feature_shape or p.dtype != first.dtype:
            raise ValueError(f"part {k} has feature shape {p.feature_shape} and dtype {p.dtype}, "
                             f"part 0 has {first.feature_shape} and {first.dtype}")
    return parts


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"tensor of shape {tuple(x.shape)} and dtype {x.dtype}"
    return type(x).__name__
