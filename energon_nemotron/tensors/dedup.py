"""``DedupPackedTensor``: a ``PackedTensor`` whose items point at physical segments stored once.

The *logical* view is a ``PackedTensor``'s (items ``[n_i, *F]``, ``offsets``, ``data``, ...). The
*physical* store holds each distinct segment once; an item is a list of segments (an image is one
segment, a video one segment per frame, so repeated frames and a video used twice share rows)::

    store:           [R, *F]          any dtype; segment s = store[segment_offsets[s]:segment_offsets[s + 1]]
    segment_offsets: int64 [S + 1]    CPU; 0 first, non-decreasing, R last
    item_ptr:        int64 [N + 1]    CPU; CSR row pointer: item i is references item_ptr[i]:item_ptr[i + 1]
    segment_ids:     int64 [M]        CPU; the segment of each reference, in logical order
    keys:            S provenance keys (hashable, distinct; None: a segment never shared)
    offsets:         int64 [N + 1]    logical item offsets (as a PackedTensor's), on the store's device
    item i:          cat(store segments of its references)   [n_i, *F]

``data`` / ``as_tensor()`` concatenate the references lazily, once (cached; never pickled). When the
references are the segments in order (nothing shared) the logical data *is* the store, no copy;
``item i`` is a view of the store when its segments are consecutive, else a copy of that item.
Items of a deduplicated tensor are read-only by contract (a write would reach every item sharing
the segment). The wire form carries the segment table in the header and only the store's bytes.
"""

from __future__ import annotations

import hashlib
import math
import operator
from typing import Any, Hashable, Iterator, Optional, Sequence

import torch

from energon_nemotron.tensors.common import (check_parts, describe, dtype_name, item_index, shared_empty, slice_bounds,
                                            to_args, wire_fields, wire_rows_view)
from energon_nemotron.tensors.packed import PackedTensor

__all__ = ["DedupPackedTensor", "wire_key"]


def _int64_cpu(t: Any, what: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype != torch.int64:
        raise ValueError(f"{what} must be a 1-D int64 tensor, got {describe(t)}")
    return t.cpu()


def _check_pointer(ptr: torch.Tensor, end: int, what: str, of: str) -> None:
    if ptr.numel() == 0 or int(ptr[0]) != 0:
        raise ValueError(f"{what} must start with 0, got {ptr.tolist()[:8]}")
    if bool((ptr[1:] < ptr[:-1]).any()):
        raise ValueError(f"{what} must be non-decreasing")
    if int(ptr[-1]) != end:
        raise ValueError(f"{what} end at {int(ptr[-1])} but there are {end} {of}")


def wire_key(key: Hashable) -> Optional[str]:
    """The JSON form of a provenance key: a ``str`` or None as is, anything else a digest of its
    ``repr`` (stable for str/bytes/int/tuple keys), so receivers can re-intern by it."""
    if key is None or isinstance(key, str):
        return key
    return "#" + hashlib.blake2b(repr(key).encode(), digest_size=16).hexdigest()


class _Interner:
    """Distinct segments in first-use order, found by identity: the key, or for an unkeyed segment
    a private token (so it is stored once per source, never shared with another)."""

    def __init__(self) -> None:
        self.segs: list[torch.Tensor] = []
        self.keys: list = []
        self.ids: list[int] = []
        self.ptr = [0]
        self.seen: dict = {}

    def add(self, t: torch.Tensor, key: Hashable, ident: Hashable, where: str) -> None:
        """Reference segment ``t`` (stored when ``ident`` is new); ``where`` names it in errors."""
        if ident in self.seen:                                   # TypeError when a key is unhashable
            old = self.segs[self.seen[ident]]
            if old.shape != t.shape or old.dtype != t.dtype:
                raise ValueError(f"key {key!r}: {where} is {t.dtype} {tuple(t.shape)}, the segment stored "
                                 f"under that key is {old.dtype} {tuple(old.shape)}")
            self.ids.append(self.seen[ident])
            return
        first = self.segs[0] if self.segs else t
        if t.shape[1:] != first.shape[1:] or t.dtype != first.dtype:
            raise ValueError(f"{where} is {t.dtype} with feature shape {tuple(t.shape[1:])}, the first segment "
                             f"{first.dtype} {tuple(first.shape[1:])}")
        self.seen[ident] = len(self.segs)
        self.ids.append(len(self.segs))
        self.segs.append(t)
        self.keys.append(key)

    def end_item(self) -> None:
        self.ptr.append(len(self.ids))

    def build(self, empty: torch.Tensor, shared: bool = False) -> "DedupPackedTensor":
        """The tensor (``empty``: a ``[0, *F]`` tensor giving F, dtype and device when no segment)."""
        seg = torch.cumsum(torch.tensor([0] + [t.shape[0] for t in self.segs], dtype=torch.int64), 0)
        if not self.segs:
            store = empty
        elif shared and empty.device.type == "cpu":
            store = torch.cat(self.segs, out=shared_empty((int(seg[-1]), *empty.shape[1:]), empty.dtype))
        else:
            store = torch.cat(self.segs)
        return DedupPackedTensor._unchecked(store, seg, torch.tensor(self.ptr, dtype=torch.int64),
                                            torch.tensor(self.ids, dtype=torch.int64), self.keys)


class DedupPackedTensor(PackedTensor):
    """A ``PackedTensor`` (logical API unchanged) over a deduplicated segment store; see the module
    docstring for the layout. Build it with :meth:`from_keyed` (or ``energon_nemotron.tensors.from_keyed``)."""

    is_deduplicated = True

    def __init__(self, store: torch.Tensor, segment_offsets: torch.Tensor, item_ptr: torch.Tensor,
                 segment_ids: torch.Tensor, keys: Optional[Sequence[Hashable]] = None) -> None:
        if not isinstance(store, torch.Tensor) or store.dim() < 1:
            raise ValueError(f"store must be a tensor with at least one dim, got {describe(store)}")
        seg = _int64_cpu(segment_offsets, "segment_offsets")
        ptr, ids = _int64_cpu(item_ptr, "item_ptr"), _int64_cpu(segment_ids, "segment_ids")
        _check_pointer(seg, store.shape[0], "segment_offsets", "store rows")
        _check_pointer(ptr, ids.numel(), "item_ptr", "segment references")
        n_seg = seg.numel() - 1
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= n_seg):
            raise ValueError(f"segment_ids must lie in [0, {n_seg}), got {ids.min().item()}..{ids.max().item()}")
        keys = (None,) * n_seg if keys is None else tuple(keys)
        if len(keys) != n_seg:
            raise ValueError(f"{len(keys)} keys for {n_seg} segments")
        named = [k for k in keys if k is not None]
        if len(set(named)) != len(named):                      # TypeError here when a key is unhashable
            raise ValueError("segment keys must be distinct (a shared segment is stored once)")
        self._set(store, seg, ptr, ids, keys)

    def _set(self, store, seg, ptr, ids, keys, offsets: Optional[torch.Tensor] = None) -> None:
        self.store, self.segment_offsets, self.item_ptr, self.segment_ids, self.keys = store, seg, ptr, ids, keys
        if offsets is None:
            ref_rows = (seg[1:] - seg[:-1])[ids]
            logical = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(ref_rows, 0)])
            offsets = logical[ptr].to(store.device)
        self.offsets = offsets
        self._logical: Optional[torch.Tensor] = None
        self._lists: Optional[tuple[list, list, list]] = None

    @classmethod
    def _unchecked(cls, store, seg, ptr, ids, keys, offsets=None) -> "DedupPackedTensor":
        out = cls.__new__(cls)
        out._set(store, seg, ptr, ids, tuple(keys), offsets)
        return out

    # -- construction ----------------------------------------------------------------------------
    @classmethod
    def from_keyed(cls, items: Sequence[Any], keys: Sequence[Any], *, feature_shape: Optional[Sequence[int]] = None,
                   dtype: Optional[torch.dtype] = None, shared: bool = False) -> "DedupPackedTensor":
        """Pack ``items`` storing each distinct segment once.

        ``items[i]``: a tensor ``[n_i, *F]`` (one segment; ``keys[i]`` its key) or a sequence of
        segment tensors ``[n_ij, *F]`` in order (``keys[i]`` a sequence of as many keys). A key is
        any hashable naming where the segment came from (e.g. a digest of the media bytes and the
        processing plan); None: never shared. A segment whose key was seen is not copied again (its
        content is trusted to match); the same key with another shape or dtype is a ValueError.
        Every segment shares ``F`` and the dtype (ValueError naming the item otherwise). With no
        items, ``feature_shape`` and ``dtype`` are required. ``shared``: the store is written
        straight into shared memory (a ``DataLoader`` worker), as ``from_list(shared=True)``.
        """
        if len(items) != len(keys):
            raise ValueError(f"{len(items)} items but {len(keys)} keys")
        store, anon = _Interner(), object()
        for i, (item, key) in enumerate(zip(items, keys)):
            parts, part_keys = ([item], [key]) if isinstance(item, torch.Tensor) else (list(item), list(key))
            if len(parts) != len(part_keys):
                raise ValueError(f"item {i} has {len(parts)} segments but {len(part_keys)} keys")
            for j, (t, k) in enumerate(zip(parts, part_keys)):
                if not isinstance(t, torch.Tensor) or t.dim() < 1:
                    raise ValueError(f"item {i} segment {j} must be a tensor with at least one dim, got {describe(t)}")
                store.add(t, k, (anon, i, j) if k is None else k, f"item {i} segment {j}")
            store.end_item()
        if not store.segs and (feature_shape is None or dtype is None):
            raise ValueError("from_keyed without segments needs feature_shape and dtype")
        first = store.segs[0] if store.segs else None
        if first is not None and feature_shape is not None and tuple(feature_shape) != first.shape[1:]:
            raise ValueError(f"items have feature shape {tuple(first.shape[1:])}, expected {tuple(feature_shape)}")
        if first is not None and dtype is not None and dtype != first.dtype:
            raise ValueError(f"items have dtype {first.dtype}, expected {dtype}")
        empty = first[:0] if first is not None else torch.empty((0, *feature_shape), dtype=dtype)
        return store.build(empty, shared)

    # -- shape and size (feature_shape, dtype, device: the base class's, from physical_data) ------
    @property
    def num_segments(self) -> int:
        """S, the physical segments."""
        return self.segment_offsets.numel() - 1

    @property
    def physical_data(self) -> torch.Tensor:
        return self.store

    @property
    def logical_nbytes(self) -> int:
        return int(self.offsets[-1]) * math.prod(self.feature_shape) * self.store.element_size()

    # -- logical access --------------------------------------------------------------------------
    def _host(self) -> tuple[list, list, list]:
        """(item_ptr, segment_ids, segment_offsets) as Python lists (cached)."""
        if self._lists is None:
            self._lists = (self.item_ptr.tolist(), self.segment_ids.tolist(), self.segment_offsets.tolist())
        return self._lists

    def _rows(self, refs: list[int]) -> torch.Tensor:
        """The rows of references ``refs``: a store view when their segments are consecutive (all of
        them in order: the whole store), else their concatenation (a copy)."""
        seg = self._host()[2]
        if not refs:
            return self.store[:0]
        if refs == list(range(refs[0], refs[0] + len(refs))):
            return self.store[seg[refs[0]]:seg[refs[-1] + 1]]
        return torch.cat([self.store[seg[s]:seg[s + 1]] for s in refs])

    def as_tensor(self) -> torch.Tensor:
        """The logical concatenation ``[sum n_i, *F]``: built on first use and cached (a view of the
        store when nothing is shared)."""
        if self._logical is None:
            self._logical = self._rows(self._host()[1])
        return self._logical

    @property
    def data(self) -> torch.Tensor:
        """The logical data (:meth:`as_tensor`)."""
        return self.as_tensor()

    def __getitem__(self, i: int) -> torch.Tensor:
        """Item ``i`` ``[n_i, *F]`` (negative indices count from the end): a view when its segments
        are consecutive in the store (or the logical data is built), else a copy. Read-only."""
        k = item_index(i, len(self))
        if self._logical is not None:
            start, stop = self.offsets[k:k + 2].tolist()
            return self._logical[start:stop]
        ptr, ids, _ = self._host()
        return self._rows(ids[ptr[k]:ptr[k + 1]])

    def __iter__(self) -> Iterator[torch.Tensor]:
        for k in range(len(self)):
            yield self[k]

    def slice(self, i: int, j: int) -> "DedupPackedTensor":
        """Items ``i .. j-1`` (IndexError as ``PackedTensor.slice``), deduplicated: the segments they
        reference, a view of the store when those are consecutive, else copied once each."""
        i, j = slice_bounds(i, j, len(self))
        ptr, ids, seg = self._host()
        refs = ids[ptr[i]:ptr[j]]
        used = sorted(set(refs))
        if not used:
            store, new = self.store[:0], {}
        elif used == list(range(used[0], used[0] + len(used))):
            store = self.store[seg[used[0]]:seg[used[-1] + 1]]
            new = {s: s - used[0] for s in used}
        else:
            store = torch.cat([self.store[seg[s]:seg[s + 1]] for s in used])
            new = {s: k for k, s in enumerate(used)}
        rows = torch.tensor([0] + [seg[s + 1] - seg[s] for s in used], dtype=torch.int64)
        offsets = self.offsets[i:j + 1]
        return DedupPackedTensor._unchecked(
            store, torch.cumsum(rows, 0), self.item_ptr[i:j + 1] - ptr[i],
            torch.tensor([new[s] for s in refs], dtype=torch.int64), [self.keys[s] for s in used],
            offsets - offsets[0])

    @staticmethod
    def concat(parts: Sequence[PackedTensor]) -> "DedupPackedTensor":
        """All items of ``parts`` (plain or deduplicated) in order, deduplicated across parts by key:
        a segment whose key an earlier part already holds is not stored again (same key, other
        shape: ValueError); items of plain parts become unkeyed segments. Feature shapes and dtypes
        must agree (ValueError naming the part); ``parts`` must not be empty."""
        parts = check_parts(parts)
        store, anon, first = _Interner(), object(), parts[0]
        for k, p in enumerate(parts):
            if isinstance(p, DedupPackedTensor):
                ptr, ids, seg = p._host()
                keys = p.keys
            else:                                   # a plain part: one unkeyed segment per item
                ptr = ids = list(range(len(p) + 1))
                seg, keys = p.offsets.tolist(), (None,) * len(p)
            rows = p.physical_data
            for item in range(len(p)):
                for s in ids[ptr[item]:ptr[item + 1]]:
                    ident = (anon, k, s) if keys[s] is None else keys[s]
                    store.add(rows[seg[s]:seg[s + 1]], keys[s], ident, f"part {k} segment {s}")
                store.end_item()
        return store.build(first.physical_data[:0])

    def to(self, device: Any = None, dtype: Optional[torch.dtype] = None,
           non_blocking: bool = False) -> "DedupPackedTensor":
        """``PackedTensor.to`` on the store (moved, floating data cast); the segment table stays."""
        device, target = to_args(device, dtype, self.store.is_floating_point())
        store = self.store.to(device=device, dtype=target, non_blocking=non_blocking)
        offsets = self.offsets.to(device=store.device, non_blocking=non_blocking)
        return DedupPackedTensor._unchecked(store, self.segment_offsets, self.item_ptr, self.segment_ids,
                                            self.keys, offsets)

    def pin_memory(self) -> "DedupPackedTensor":
        """Copy of a CPU instance with the store and offsets in pinned memory."""
        return DedupPackedTensor._unchecked(self.store.pin_memory(), self.segment_offsets, self.item_ptr,
                                            self.segment_ids, self.keys, self.offsets.pin_memory())

    def same_structure(self, other: Any) -> bool:
        """True when ``other`` is deduplicated with the same segment table (offsets, references)."""
        return (isinstance(other, DedupPackedTensor) and torch.equal(self.segment_offsets, other.segment_offsets)
                and torch.equal(self.item_ptr, other.item_ptr) and torch.equal(self.segment_ids, other.segment_ids))

    def equal(self, other: Any) -> bool:
        """Logical equality, as ``PackedTensor.equal`` (plain or deduplicated ``other``, same
        device, dtype, feature shape, offsets and logical data); the stores are compared directly
        when both share one segment table."""
        if not (isinstance(other, PackedTensor) and self.device == other.device and self.dtype == other.dtype
                and self.feature_shape == other.feature_shape and torch.equal(self.offsets, other.offsets)):
            return False
        if self.same_structure(other):
            return torch.equal(self.store, other.store)
        rows = other.as_tensor() if not isinstance(other, DedupPackedTensor) else other._rows(other._host()[1])
        _, ids, seg = self._host()
        at = 0
        for s in ids:
            n = seg[s + 1] - seg[s]
            if not torch.equal(self.store[seg[s]:seg[s + 1]], rows[at:at + n]):
                return False
            at += n
        return True

    def __repr__(self) -> str:
        return (f"DedupPackedTensor(n={len(self)}, rows={int(self.offsets[-1])}, segments={self.num_segments}, "
                f"stored_rows={self.store.shape[0]}, feature_shape={self.feature_shape}, dtype={self.dtype}, "
                f"device={self.device})")

    def __getstate__(self) -> dict:
        """Pickle the store and the segment table, never the caches."""
        return {"store": self.store, "segment_offsets": self.segment_offsets, "item_ptr": self.item_ptr,
                "segment_ids": self.segment_ids, "keys": self.keys, "offsets": self.offsets}

    def __setstate__(self, state: dict) -> None:
        self._set(state["store"], state["segment_offsets"], state["item_ptr"], state["segment_ids"],
                  tuple(state["keys"]), state["offsets"])

    # -- wire form -------------------------------------------------------------------------------
    def wire_header(self) -> dict:
        """JSON-able ``PackedTensor`` header plus ``"dedup": {"segment_offsets", "item_ptr",
        "segment_ids", "keys"}`` (keys as :func:`wire_key`); no data."""
        return {"dtype": dtype_name(self.dtype), "feature_shape": list(self.feature_shape),
                "offsets": self.offsets.tolist(),
                "dedup": {"segment_offsets": self.segment_offsets.tolist(), "item_ptr": self.item_ptr.tolist(),
                          "segment_ids": self.segment_ids.tolist(), "keys": [wire_key(k) for k in self.keys]}}

    def wire_buffer(self) -> torch.Tensor:
        """The store's bytes (physical rows only) as one flat contiguous uint8 tensor."""
        return self.store.contiguous().view(-1).view(torch.uint8)

    @classmethod
    def from_wire(cls, header: dict, buffer: torch.Tensor) -> "DedupPackedTensor":
        """Inverse of ``wire_header`` / ``wire_buffer``: the store lives on ``buffer``'s device (shares
        its memory when aligned); ValueError on a malformed header, a wrong size, or logical
        offsets that disagree with the segment table."""
        dtype, feature_shape, offsets = wire_fields(header)
        try:
            table = header["dedup"]
            seg, ptr, ids = ([operator.index(v) for v in table[k]]
                             for k in ("segment_offsets", "item_ptr", "segment_ids"))
            keys = list(table["keys"])
        except (KeyError, TypeError) as e:
            raise ValueError(f"malformed PackedTensor wire header: {e!r}") from e
        if not seg:
            raise ValueError("empty segment_offsets in wire header")
        store = wire_rows_view(buffer, dtype, feature_shape, seg[-1], "stored rows")
        as_t = lambda v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
        out = cls(store, as_t(seg), as_t(ptr), as_t(ids), keys)
        if out.offsets.tolist() != offsets:
            raise ValueError("wire header: offsets disagree with the segment table")
        return out
