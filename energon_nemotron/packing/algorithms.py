"""Bin-packing of sequence lengths into fixed-capacity rows. Pure functions on integer lengths.

Both algorithms sort items by decreasing length (stable: equal lengths keep their input order)
and place them one at a time, exactly as the textbook definitions; an item longer than the
capacity gets a bin of its own. They run on groups of equal lengths instead of single items: an
open bin that receives an item of length ``s`` keeps receiving the next items of the same length
until its room drops below ``s`` (it stays the best and the first fit), so a whole group is placed
with a few array operations per bin *bucket* instead of one search per item. The result is
identical, bin for bin, to the item-by-item algorithm (the tests compare with a naive version).

- ``first_fit_decreasing``: the lowest-numbered bin with room.
- ``best_fit_decreasing``: the bin with the least room that still fits (ties: lowest-numbered).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from energon_nemotron.registry import PACKERS


def _prepare(lengths: Sequence[int] | np.ndarray, capacity: int):
    """Validated lengths, their stable decreasing order, and the count of oversized items."""
    sizes = np.asarray(lengths, dtype=np.int64).reshape(-1)
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    if sizes.size and int(sizes.min()) < 1:
        raise ValueError(f"lengths must be >= 1, got {int(sizes.min())} at index {int(sizes.argmin())}")
    order = np.argsort(-sizes, kind="stable")
    sorted_sizes = sizes[order]
    n_over = int(np.count_nonzero(sorted_sizes > capacity))
    return sizes, order, sorted_sizes, n_over


def _groups(sorted_sizes: np.ndarray, start: int):
    """(size, first, end) of each run of equal sizes in ``sorted_sizes[start:]``."""
    rest = sorted_sizes[start:]
    if rest.size == 0:
        return []
    cuts = np.flatnonzero(np.diff(rest)) + 1
    firsts = np.concatenate(([0], cuts)) + start
    ends = np.concatenate((cuts, [rest.size])) + start
    return list(zip(sorted_sizes[firsts].tolist(), firsts.tolist(), ends.tolist()))


def _bins_from_assignment(order: np.ndarray, bin_of_sorted: np.ndarray, n_bins: int) -> list[list[int]]:
    """Item indices of each bin, in placement order."""
    by_bin = np.argsort(bin_of_sorted, kind="stable")
    counts = np.bincount(bin_of_sorted, minlength=n_bins)
    items = order[by_bin].tolist()
    out, at = [], 0
    for c in counts.tolist():
        out.append(items[at:at + c])
        at += c
    return out


def _open_bins(bin_of_sorted, pos, rem, size, capacity, first_id):
    """Place ``rem`` items of ``size`` into new bins from ``first_id``; return (ids, rooms, n_new)."""
    q = capacity // size
    full, part = divmod(rem, q)
    n_new = full + (1 if part else 0)
    ids = np.arange(first_id, first_id + n_new, dtype=np.int64)
    bin_of_sorted[pos:pos + full * q] = np.repeat(ids[:full], q)
    bin_of_sorted[pos + full * q:pos + rem] = first_id + full
    rooms = np.full(n_new, capacity - q * size, dtype=np.int64)
    if part:
        rooms[-1] = capacity - part * size
    return ids, rooms, n_new


@PACKERS.register("first_fit_decreasing")
def first_fit_decreasing(lengths: Sequence[int] | np.ndarray, capacity: int) -> list[list[int]]:
    """First-fit-decreasing bins.

    Args:
        lengths: int [N] item lengths (>= 1).
        capacity: room of every bin.

    Returns:
        Bins in opening order, each a list of item indices in placement order. Every index
        appears exactly once; a bin's total never exceeds ``capacity`` unless it holds one
        oversized item alone.
    """
    sizes, order, sorted_sizes, n_over = _prepare(lengths, capacity)
    n = sizes.size
    bin_of_sorted = np.empty(n, dtype=np.int64)
    bin_of_sorted[:n_over] = np.arange(n_over)
    room = np.zeros(max(n, 1), dtype=np.int64)      # room of each bin (oversized bins: 0)
    n_bins = n_over
    for size, pos, end in _groups(sorted_sizes, n_over):
        rem = end - pos
        cand = np.flatnonzero(room[:n_bins] >= size)
        if cand.size:
            takes = room[cand] // size                       # items each candidate can absorb
            cum = np.cumsum(takes)
            k = int(np.searchsorted(cum, rem))               # candidates 0..k are (partly) used
            if k < cand.size:
                takes = takes[:k + 1].copy()
                takes[k] -= int(cum[k]) - rem
                cand = cand[:k + 1]
            used = int(takes.sum())
            bin_of_sorted[pos:pos + used] = np.repeat(cand, takes)
            room[cand] -= takes * size
            pos += used
            rem -= used
        if rem:
            ids, rooms, n_new = _open_bins(bin_of_sorted, pos, rem, size, capacity, n_bins)
            room[ids] = rooms
            n_bins += n_new
    return _bins_from_assignment(order, bin_of_sorted, n_bins)


class _Buckets:
    """Open bins grouped by room: ``room -> sorted bin ids`` plus a presence count per room."""

    def __init__(self, capacity: int) -> None:
        self.count = np.zeros(capacity + 1, dtype=np.int64)
        self.ids: dict[int, list[np.ndarray]] = {}

    def add(self, room: int, ids: np.ndarray) -> None:
        if ids.size:
            self.ids.setdefault(room, []).append(ids)
            self.count[room] += ids.size

    def pop(self, room: int) -> np.ndarray:
        parts = self.ids.pop(room)
        self.count[room] = 0
        return np.sort(np.concatenate(parts)) if len(parts) > 1 else parts[0]

    def rooms_at_least(self, size: int) -> np.ndarray:
        return np.flatnonzero(self.count[size:]) + size


@PACKERS.register("best_fit_decreasing")
def best_fit_decreasing(lengths: Sequence[int] | np.ndarray, capacity: int) -> list[list[int]]:
    """Best-fit-decreasing bins (same arguments and guarantees as :func:`first_fit_decreasing`)."""
    sizes, order, sorted_sizes, n_over = _prepare(lengths, capacity)
    n = sizes.size
    bin_of_sorted = np.empty(n, dtype=np.int64)
    bin_of_sorted[:n_over] = np.arange(n_over)
    buckets = _Buckets(capacity)
    n_bins = n_over
    for size, pos, end in _groups(sorted_sizes, n_over):
        rem = end - pos
        for room in buckets.rooms_at_least(size).tolist():
            ids = buckets.pop(room)
            q = room // size
            if ids.size * q <= rem:                  # every bin of this room fills up with q items
                bin_of_sorted[pos:pos + ids.size * q] = np.repeat(ids, q)
                buckets.add(room - q * size, ids)
                pos += ids.size * q
                rem -= ids.size * q
            else:                                    # the group ends inside this bucket
                full, part = divmod(rem, q)
                bin_of_sorted[pos:pos + full * q] = np.repeat(ids[:full], q)
                buckets.add(room - q * size, ids[:full])
                if part:
                    bin_of_sorted[pos + full * q:pos + rem] = ids[full]
                    buckets.add(room - part * size, ids[full:full + 1])
                buckets.add(room, ids[full + (1 if part else 0):])
                rem = 0
            if rem == 0:
                break
        if rem:
            ids, rooms, n_new = _open_bins(bin_of_sorted, pos, rem, size, capacity, n_bins)
            for r in np.unique(rooms).tolist():
                buckets.add(r, ids[rooms == r])
            n_bins += n_new
    return _bins_from_assignment(order, bin_of_sorted, n_bins)


def fill_ratio(lengths: Sequence[int] | np.ndarray, bins: list[list[int]], capacity: int) -> float:
    """Σ min(length, capacity) / (bins · capacity): the share of row positions holding tokens."""
    if not bins:
        return 1.0
    sizes = np.minimum(np.asarray(lengths, dtype=np.int64), capacity)
    return float(sizes.sum()) / (len(bins) * capacity)
