"""The two greedy knapsacks of Megatron-LM's multimodal data loading, as NeMo-RL names them.

Both are packers of the ``registry.PACKERS`` protocol (``packing.spec``; the guarantees are in
``packing.algorithms``): ``lengths`` int [N] (each >= 1), ``capacity`` >= 1; bins of item indices
in placement order, every index once, no empty bin, an oversized item (length > capacity) alone in
its own bin, at most ``max_sequences_per_bin`` items per bin. ``seed`` is accepted and ignored.

- ``greedy_knapsack``: one bin at a time, filled by taking again and again the longest remaining
  item that still fits (ties: the lowest index); when none fits (or the bin holds
  ``max_sequences_per_bin`` items) the next bin opens.
- ``balanced_greedy_knapsack``: ``ceil(Σ min(len, capacity) / capacity) + balanced_knapsack_delta``
  bins opened up front; items in decreasing length (stable), each into the least-filled bin that
  may still receive items (ties: the lowest-numbered) when it fits there, else into a new bin.
  Bins left empty are dropped.

Oversized items, which NeMo-RL refuses (``ValueError``) and Megatron-LM drops, come first here, each
in a bin of its own, in decreasing length (stable), as in the decreasing packers.
"""

from __future__ import annotations

from bisect import bisect_right
from heapq import heappop, heappush, heapreplace
from typing import Sequence

import numpy as np

from energon_nemotron.packing.algorithms import _prepare
from energon_nemotron.packing.spec import register_packer

__all__ = ["greedy_knapsack", "balanced_greedy_knapsack"]


def _find(parent: list[int], x: int) -> int:
    """The nearest position <= ``x`` still present, -1 if none. ``parent`` is a union-find over
    positions: ``parent[p] == p`` while ``p`` is present, ``p - 1`` once taken; paths are compressed."""
    root = x
    while root >= 0 and parent[root] != root:
        root = parent[root]
    while x >= 0 and parent[x] != x:
        parent[x], x = root, parent[x]
    return root


@register_packer("greedy_knapsack")
def greedy_knapsack(lengths: Sequence[int] | np.ndarray, capacity: int, *,
                    max_sequences_per_bin: int | None = None, seed: int = 0) -> list[list[int]]:
    """Greedy knapsack bins: each bin filled with the longest remaining item that fits, until none does.

    Args:
        lengths: int [N] item lengths (>= 1); a sequence or a numpy array.
        capacity: room of every bin (>= 1).
        max_sequences_per_bin: at most this many items per bin (>= 1); None: no limit.
        seed: ignored (deterministic packer; accepted for the common packer signature).

    Returns:
        Bins in opening order (oversized items' first), each a list of item indices in placement
        order (decreasing length within a bin). The items are kept sorted by (length, -index)
        and taken from the right end of the prefix that fits: O(N log N).
    """
    sizes, order, _, n_over, k = _prepare(lengths, capacity, max_sequences_per_bin)
    bins: list[list[int]] = [[i] for i in order[:n_over].tolist()]
    fitting = np.flatnonzero(sizes <= capacity)
    # ascending length; equal lengths by decreasing index, so the rightmost one is the lowest index
    asc = fitting[np.lexsort((-fitting, sizes[fitting]))]
    asc_sizes = sizes[asc].tolist()
    asc_items = asc.tolist()
    present = list(range(len(asc_items)))               # union-find: nearest untaken position <= p
    left = len(asc_items)
    while left:
        room, current = capacity, []
        while k is None or len(current) < k:
            p = _find(present, bisect_right(asc_sizes, room) - 1)
            if p < 0:
                break
            current.append(asc_items[p])
            room -= asc_sizes[p]
            present[p] = p - 1
        left -= len(current)
        bins.append(current)
    return bins


@register_packer("balanced_greedy_knapsack")
def balanced_greedy_knapsack(lengths: Sequence[int] | np.ndarray, capacity: int, *,
                             max_sequences_per_bin: int | None = None, seed: int = 0,
                             balanced_knapsack_delta: int | None = None) -> list[list[int]]:
    """Balanced greedy knapsack: spread the items over the bins that could hold them, plus ``delta``.

    ``ceil(Σ min(len, capacity) / capacity) + delta`` bins are opened up front. Items go in
    decreasing length (stable); each oversized item takes one of those bins alone (they come
    first, so the first ones), every other item goes into the least-filled bin that can still
    receive items (fewer than ``max_sequences_per_bin`` items; ties: lowest-numbered) if it fits
    there, else into a new bin (which then takes part like the others). Bins left empty are dropped.

    Args:
        lengths: int [N] item lengths (>= 1); a sequence or a numpy array.
        capacity: room of every bin (>= 1).
        max_sequences_per_bin: at most this many items per bin (>= 1); None: no limit.
        seed: ignored (deterministic packer; accepted for the common packer signature).
        balanced_knapsack_delta: extra bins opened up front (>= 0); None: 0. More bins up front
            spread the items thinner (Megatron-LM's default is 20, the Nemotron launch script's 5).

    Returns:
        Bins as :func:`greedy_knapsack` describes them (up-front bins first, by number).
    """
    delta = 0 if balanced_knapsack_delta is None else int(balanced_knapsack_delta)
    if delta < 0:
        raise ValueError(f"balanced_knapsack_delta must be >= 0 or None, got {balanced_knapsack_delta}")
    k = max_sequences_per_bin
    sizes, order, _, n_over, _ = _prepare(lengths, capacity, k)
    n_start = -(-int(np.minimum(sizes, capacity).sum()) // capacity) + delta
    order_list = order.tolist()
    bins: list[list[int]] = [[i] for i in order_list[:n_over]] + [[] for _ in range(n_start - n_over)]
    heap = [(0, b) for b in range(n_over, n_start)]     # (fill, bin) of the bins that may receive
    sz = sizes.tolist()
    for i in order_list[n_over:]:
        s = sz[i]
        if heap and heap[0][0] + s <= capacity:
            fill, b = heap[0]
            bins[b].append(i)
            fill += s
            if fill < capacity and (k is None or len(bins[b]) < k):
                heapreplace(heap, (fill, b))
            else:
                heappop(heap)
        else:
            b = len(bins)
            bins.append([i])
            if s < capacity and (k is None or k > 1):
                heappush(heap, (s, b))
    return [b for b in bins if b]
