"""Bin-packing of sequence lengths into fixed-capacity rows. Pure functions on integer lengths.

Every packer is registered in :data:`energon_nemotron.registry.PACKERS` and has the signature
``fn(lengths, capacity, *, max_sequences_per_bin=None, seed=0) -> list[list[int]]``: ``lengths``
is an int sequence/array [N] (each >= 1), ``capacity`` the room of every bin (>= 1). The result
is the bins in opening order, each a list of item indices in placement order: every index appears
exactly once, no bin is empty, a bin's total never exceeds ``capacity`` unless it holds one
oversized item (length > capacity) alone, and with ``max_sequences_per_bin=k`` no bin holds more
than ``k`` items (bins already holding ``k`` items are not considered for placement). ``seed`` is
used only by randomised packers; the others accept and ignore it. The output depends only on the
arguments (a fixed seed gives a fixed result).

- ``first_fit_decreasing``: decreasing length (stable), each item into the lowest-numbered bin
  with room.
- ``best_fit_decreasing``: decreasing length (stable), each item into the bin with the least room
  that still fits it (ties: lowest-numbered).
- ``first_fit_shuffle``: first fit in the order of ``random.Random(seed).shuffle`` of the indices.

The other registered packers follow the same protocol: ``packing.knapsack`` (``greedy_knapsack``,
``balanced_greedy_knapsack``), ``packing.concatenative``, ``packing.modified_ffd`` and
``packing.refine`` (``minimum_bin_slack``).

Without ``max_sequences_per_bin`` (or with a limit that cannot bind: ``k >= min(N, capacity)``)
the two decreasing fits run on groups of equal lengths instead of single items: an open bin that
receives an item of length ``s`` keeps receiving the next items of the same length until its room
drops below ``s`` (it stays the best and the first fit), so a whole group is placed with a few
array operations per bin *bucket* instead of one search per item. With a binding limit they place
one item at a time (first fit: a max-tree over bin rooms; best fit: a sorted list of rooms), in
O(N log N). Both paths are identical, bin for bin, to the textbook item-by-item algorithms (the
tests compare with a naive version).
"""

from __future__ import annotations

import random
from bisect import bisect_left, insort
from typing import Sequence

import numpy as np

from energon_nemotron.packing.spec import register_packer


def _validate(lengths: Sequence[int] | np.ndarray, capacity: int, k: int | None) -> np.ndarray:
    """Lengths as int64 [N] after checking ``capacity >= 1``, lengths >= 1 and ``k >= 1``."""
    sizes = np.asarray(lengths, dtype=np.int64).reshape(-1)
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    if sizes.size and int(sizes.min()) < 1:
        raise ValueError(f"lengths must be >= 1, got {int(sizes.min())} at index {int(sizes.argmin())}")
    if k is not None and k < 1:
        raise ValueError(f"max_sequences_per_bin must be >= 1 or None, got {k}")
    return sizes


def _prepare(lengths: Sequence[int] | np.ndarray, capacity: int, k: int | None = None):
    """Validated lengths, their stable decreasing order, sorted lengths, the count of oversized
    items, and ``k`` (None when it cannot bind: a bin within capacity holds <= capacity items)."""
    sizes = _validate(lengths, capacity, k)
    order = np.argsort(-sizes, kind="stable")
    sorted_sizes = sizes[order]
    n_over = int(np.count_nonzero(sorted_sizes > capacity))
    if k is not None and k >= min(sizes.size, capacity):
        k = None
    return sizes, order, sorted_sizes, n_over, k


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


def _first_fit_items(sizes: list[int], order: list[int], capacity: int, k: int | None) -> list[list[int]]:
    """Item-by-item first fit of the items in ``order``: each goes to the lowest-numbered bin with
    room for it (and fewer than ``k`` items), else to a new bin; oversized items get their own.

    A max-tree over the bins' rooms (leaves: bins by number; a closed bin has room 0) finds that
    bin by descending from the root, O(log N) per item.
    """
    width = 1 << max(0, len(order) - 1).bit_length()      # leaves >= N >= number of bins
    tree = [0] * (2 * width)
    bins: list[list[int]] = []
    for i in order:
        s = sizes[i]
        if s <= capacity and tree[1] >= s:
            node = 1
            while node < width:                          # leftmost leaf with room >= s
                node <<= 1
                if tree[node] < s:
                    node += 1
            b = node - width
            bins[b].append(i)
            room = tree[node] - s
        else:
            b = len(bins)
            bins.append([i])
            node = width + b
            room = max(capacity - s, 0)
        if k is not None and len(bins[b]) >= k:
            room = 0
        tree[node] = room
        node >>= 1
        while node:                                      # refresh the maxima above the leaf
            top = max(tree[2 * node], tree[2 * node + 1])
            if tree[node] == top:
                break
            tree[node] = top
            node >>= 1
    return bins


def _best_fit_items(sizes: list[int], order: list[int], capacity: int, k: int | None) -> list[list[int]]:
    """Item-by-item best fit of the items in ``order``: each goes to the bin with the least room
    that fits it (ties: lowest-numbered; only bins with fewer than ``k`` items), else to a new bin.

    Open bins are kept as a sorted list of keys ``room * N + bin`` (rooms > 0), searched with
    ``bisect``.
    """
    scale = max(len(order), 1)
    keys: list[int] = []
    bins: list[list[int]] = []
    for i in order:
        s = sizes[i]
        at = bisect_left(keys, s * scale) if s <= capacity else len(keys)
        if at < len(keys):
            room, b = divmod(keys.pop(at), scale)
            bins[b].append(i)
            room -= s
        else:
            b = len(bins)
            bins.append([i])
            room = capacity - s
        if room > 0 and (k is None or len(bins[b]) < k):
            insort(keys, room * scale + b)
    return bins


@register_packer("first_fit_decreasing")
def first_fit_decreasing(lengths: Sequence[int] | np.ndarray, capacity: int, *,
                         max_sequences_per_bin: int | None = None, seed: int = 0) -> list[list[int]]:
    """First-fit-decreasing bins.

    Args:
        lengths: int [N] item lengths (>= 1); a sequence or a numpy array.
        capacity: room of every bin (>= 1).
        max_sequences_per_bin: at most this many items per bin (>= 1); None: no limit.
        seed: ignored (deterministic packer; accepted for the common packer signature).

    Returns:
        Bins in opening order, each a list of item indices in placement order. Every index
        appears exactly once; no bin is empty; a bin's total never exceeds ``capacity`` unless
        it holds one oversized item alone; no bin holds more than ``max_sequences_per_bin`` items.
    """
    sizes, order, sorted_sizes, n_over, k = _prepare(lengths, capacity, max_sequences_per_bin)
    if k is not None:
        return _first_fit_items(sizes.tolist(), order.tolist(), capacity, k)
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


@register_packer("best_fit_decreasing")
def best_fit_decreasing(lengths: Sequence[int] | np.ndarray, capacity: int, *,
                        max_sequences_per_bin: int | None = None, seed: int = 0) -> list[list[int]]:
    """Best-fit-decreasing bins (same arguments and guarantees as :func:`first_fit_decreasing`)."""
    sizes, order, sorted_sizes, n_over, k = _prepare(lengths, capacity, max_sequences_per_bin)
    if k is not None:
        return _best_fit_items(sizes.tolist(), order.tolist(), capacity, k)
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


@register_packer("first_fit_shuffle")
def first_fit_shuffle(lengths: Sequence[int] | np.ndarray, capacity: int, *,
                      max_sequences_per_bin: int | None = None, seed: int = 0) -> list[list[int]]:
    """First fit in a random order: the indices shuffled by ``random.Random(seed)``.

    Args:
        lengths: int [N] item lengths (>= 1); a sequence or a numpy array.
        capacity: room of every bin (>= 1).
        max_sequences_per_bin: at most this many items per bin (>= 1); None: no limit.
        seed: seed of the shuffle; equal seeds give equal bins.

    Returns:
        Bins as :func:`first_fit_decreasing` describes them. One item at a time in plain Python
        (O(N log N)): far slower than the decreasing packers on millions of items.
    """
    sizes = _validate(lengths, capacity, max_sequences_per_bin)
    order = list(range(sizes.size))
    random.Random(seed).shuffle(order)
    return _first_fit_items(sizes.tolist(), order, capacity, max_sequences_per_bin)


def fill_ratio(lengths: Sequence[int] | np.ndarray, bins: list[list[int]], capacity: int) -> float:
    """Σ min(length, capacity) / (bins · capacity): the share of row positions holding tokens."""
    if not bins:
        return 1.0
    sizes = np.minimum(np.asarray(lengths, dtype=np.int64), capacity)
    return float(sizes.sum()) / (len(bins) * capacity)
