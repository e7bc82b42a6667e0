"""Modified first-fit decreasing (Johnson & Garey 1985) as NeMo-RL runs it.

A packer of the ``registry.PACKERS`` protocol (``packing.spec``; guarantees in
``packing.algorithms``), registered as ``modified_first_fit_decreasing`` (NeMo-RL's
``ModifiedFirstFitDecreasingPacker``, its recommended packer). Items are classed by length ``s``
against the capacity ``C``: large ``s > C/2``, medium ``C/3 < s <= C/2``, small ``C/6 < s <= C/3``,
tiny ``s <= C/6``. Then, in NeMo-RL's phases:

1. one bin per large item, in decreasing length (stable);
2. forward over those bins: each takes the longest medium item that fits (ties: lowest index);
3. backward over the bins without a medium item: the two shortest small items fit, so the bin
   takes the shortest one and the longest small item that still fits beside it (ties: the highest
   index, as NeMo-RL scans the ascending list from its end);
4. forward over the large bins: each takes, as long as one fits, the longest remaining medium,
   small or tiny item that fits (ties: lowest index);
5. the leftovers, in decreasing length (stable), go into further bins kept in increasing fill: an
   item goes into the least-filled of them (ties: the earliest placed into) if it fits there, else
   into a new one. These bins follow the large ones in increasing fill (ties: earliest filled).

Step 5 is what NeMo-RL's "O(n log n) FFD" does: a worst fit, not a first fit (its bins are the same
as a first fit's only sometimes); it is kept because it is what NeMo-RL packs. An oversized item is
a large item that nothing joins: alone in its bin. With a ``max_sequences_per_bin`` that may bind
(``k < min(N, capacity)``) the phases are not run: the bins are :func:`first_fit_decreasing`'s with
that limit, as in NeMo-RL, whose phases cannot honour a count. A limit that cannot bind changes
nothing (NeMo-RL switches to its FFD for any limit set, even one no bin could reach).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from heapq import heappop, heappush
from typing import Sequence

import numpy as np

from energon_nemotron.packing.algorithms import _validate, first_fit_decreasing
from energon_nemotron.packing.spec import register_packer

__all__ = ["modified_first_fit_decreasing"]


class _Present:
    """Positions 0..n-1 of a sorted list, some taken: the nearest present one at or after / at or
    before a position (two union-finds with path compression)."""

    def __init__(self, n: int) -> None:
        self.after = list(range(n + 1))              # after[n] == n: none
        self.before = list(range(n + 1))             # position p is before[p + 1]; before[0] == 0: none
        self.count = n

    def next(self, p: int) -> int:
        """The first present position >= p; n if none."""
        root, up = p, self.after
        while up[root] != root:
            root = up[root]
        while up[p] != p:
            up[p], p = root, up[p]
        return root

    def prev(self, p: int) -> int:
        """The last present position <= p; -1 if none."""
        x = p + 1
        root, up = x, self.before
        while up[root] != root:
            root = up[root]
        while up[x] != x:
            up[x], x = root, up[x]
        return root - 1

    def take(self, p: int) -> None:
        self.after[p] = p + 1
        self.before[p + 1] = p
        self.count -= 1


def _phases(sizes: list[int], capacity: int) -> list[list[int]]:
    """Steps 1-5 of the module docstring on ``sizes`` [N] (no count limit)."""
    n, c = len(sizes), capacity
    by_desc = sorted(range(n), key=lambda i: -sizes[i])                  # stable: ties by index
    large = [i for i in by_desc if 2 * sizes[i] > c]
    medium = [i for i in by_desc if 2 * sizes[i] <= c < 3 * sizes[i]]
    small = sorted((i for i in range(n) if 3 * sizes[i] <= c < 6 * sizes[i]), key=lambda i: sizes[i])
    bins = [[i] for i in large]
    fill = [sizes[i] for i in large]
    has_medium = [False] * len(bins)

    med_neg = [-sizes[i] for i in medium]                                # ascending
    med = _Present(len(medium))
    for b in range(len(bins)):                                           # 2: a medium item per large bin
        p = med.next(bisect_left(med_neg, fill[b] - c))
        if p < len(medium):
            med.take(p)
            bins[b].append(medium[p])
            fill[b] += sizes[medium[p]]
            has_medium[b] = True

    small_sizes = [sizes[i] for i in small]                              # ascending
    sm = _Present(len(small))
    for b in reversed(range(len(bins))):                                 # 3: two small items per bin
        if has_medium[b] or sm.count < 2:
            continue
        room = c - fill[b]
        first = sm.next(0)
        second = sm.next(first + 1)
        if small_sizes[first] + small_sizes[second] > room:
            continue
        sm.take(first)
        other = sm.prev(bisect_right(small_sizes, room - small_sizes[first]) - 1)
        sm.take(other)
        bins[b] += [small[first], small[other]]
        fill[b] += small_sizes[first] + small_sizes[other]

    taken = set(medium[p] for p in range(len(medium)) if med.next(p) != p)
    taken.update(small[p] for p in range(len(small)) if sm.next(p) != p)
    rest = [i for i in by_desc if 2 * sizes[i] <= c and i not in taken]  # decreasing, ties by index
    rest_neg = [-sizes[i] for i in rest]
    left = _Present(len(rest))
    for b in range(len(bins)):                                           # 4: greedy over the large bins
        while left.count:
            room = c - fill[b]
            if room < sizes[rest[left.prev(len(rest) - 1)]]:
                break
            p = left.next(bisect_left(rest_neg, -room))
            left.take(p)
            bins[b].append(rest[p])
            fill[b] += sizes[rest[p]]

    heap = [(0, 0, 0)]                                                   # 5: (fill, placed-at, bin)
    extra: list[list[int]] = [[]]
    tick = 0
    for p in range(len(rest)):
        if left.next(p) != p:
            continue
        i, tick = rest[p], tick + 1
        if sizes[i] <= c - heap[0][0]:
            f, _, e = heappop(heap)
        else:
            f, e = 0, len(extra)
            extra.append([])
        extra[e].append(i)
        heappush(heap, (f + sizes[i], tick, e))
    bins += [extra[e] for _, _, e in sorted(heap) if extra[e]]
    return bins


@register_packer("modified_first_fit_decreasing")
def modified_first_fit_decreasing(lengths: Sequence[int] | np.ndarray, capacity: int, *,
                                  max_sequences_per_bin: int | None = None, seed: int = 0) -> list[list[int]]:
    """NeMo-RL's modified first-fit decreasing (the module docstring gives the steps).

    Args:
        lengths: int [N] item lengths (>= 1); a sequence or a numpy array.
        capacity: room of every bin (>= 1).
        max_sequences_per_bin: at most this many items per bin (>= 1); None: no limit. When it may
            bind, the bins are :func:`first_fit_decreasing`'s with that limit.
        seed: ignored (deterministic packer; accepted for the common packer signature).

    Returns:
        The large items' bins (in decreasing length of their large item), then the leftovers' bins
        in increasing fill; each a list of item indices in placement order. Python loops with
        binary searches: O(N log N).
    """
    sizes = _validate(lengths, capacity, max_sequences_per_bin)
    k = max_sequences_per_bin
    if k is not None and k < min(sizes.size, capacity):                 # a limit that may bind
        return first_fit_decreasing(sizes, capacity, max_sequences_per_bin=k)
    return _phases(sizes.tolist(), capacity)
