"""``minimum_bin_slack``: fill one bin at a time as full as possible (exact subset sum).

Online packing fills each buffer on its own, so the best possible is ``ceil(Σ lengths /
capacity)`` bins per buffer; with sequences of a few hundred tokens in 4k bins that leaves only
tens of tokens of slack per bin, which first/best-fit-decreasing often miss by a whole bin. Here
each bin starts with the longest remaining item and is then completed with the subset of the
remaining items that leaves the least room, found exactly by a 0/1 subset-sum over reachable
totals (a boolean array over the bin's room, one shifted OR per item, each total remembering the
item that first reached it, so the subset can be read back). In the style of Gupta and Ho's
minimum-bin-slack heuristic.

Constraints: ``capacity`` (tokens); ``max_sequences_per_bin``; and an optional second budget,
``secondary`` per item (e.g. vision patches) within ``secondary_capacity`` per bin, which balances
vision-encoder work across packs. The subset is chosen on tokens; if it breaks the item count or
the second budget, its items are dropped longest-second-size first and the bin is topped up with
a fitting best-fit pass. An item over a budget gets a bin of its own. Deterministic (ties by index).

Even bins (``work``, one figure per item: ``packing.balance.CostModel``'s extra work). Each
bin has a target: the remaining items' work over the bins they still need (``ceil(tokens /
capacity)``). After its first item, the bin takes the remaining items dearest first while its work
stays within the target and they fit, then the subset sum completes the room, preferring the items
of least work per token. The cheap items (text) are many and small, so the subset sum still fills
almost every bin: the bins are as many as without ``work`` (tests/test_even_packs.py), the slack
spread over them instead of left in the last. The target follows what the earlier bins took, so
the last bins do not collect what the first left.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from energon_nemotron.packing.algorithms import _validate
from energon_nemotron.packing.spec import register_packer


def best_subset(sizes: np.ndarray, room: int) -> list[int]:
    """Positions (into ``sizes``) of a subset with the largest total ≤ ``room``.

    Args:
        sizes: int [n] positive sizes.
        room: the budget (>= 0).
    """
    reach = np.zeros(room + 1, dtype=bool)
    reach[0] = True
    who = np.full(room + 1, -1, dtype=np.int64)
    scratch = np.empty(room + 1, dtype=bool)
    hi = 0                                   # no total above hi is reached yet
    for pos, w in enumerate(sizes.tolist()):
        if w > room:
            continue
        hi = min(room, hi + w)
        span = slice(w, hi + 1)
        new = scratch[:hi + 1 - w]
        np.greater(reach[:hi + 1 - w], reach[span], out=new)     # reached from t - w, not yet at t
        who[span][new] = pos
        reach[span] |= new
        if reach[room]:
            break
    total = int(np.flatnonzero(reach)[-1])
    chosen = []
    while total > 0:
        pos = int(who[total])
        chosen.append(pos)
        total -= int(sizes[pos])
    return chosen


@register_packer("minimum_bin_slack", second_budget=True, even=True)
def minimum_bin_slack(lengths: Sequence[int] | np.ndarray, capacity: int, *,
                      max_sequences_per_bin: Optional[int] = None, seed: int = 0,
                      secondary: Optional[Sequence[int]] = None,
                      secondary_capacity: Optional[int] = None,
                      work: Optional[Sequence[float]] = None) -> list[list[int]]:
    """Bins filled one at a time to the least slack (see the module docstring).

    Args:
        lengths: int [N] item lengths (>= 1).
        capacity: room of every bin (tokens).
        max_sequences_per_bin: at most this many items per bin (None: no limit).
        seed: accepted for the common packer signature (the packer is deterministic).
        secondary: int [N] second size of every item (e.g. vision patches), or None.
        secondary_capacity: the second budget per bin (required with ``secondary``).
        work: float [N] work of every item (>= 0), or None; given: bins of even work (module docstring).

    Returns:
        Bins (lists of item indices); every index exactly once, no empty bin.
    """
    sizes = _validate(lengths, capacity, max_sequences_per_bin)
    k = max_sequences_per_bin
    if secondary is None:
        second, capacity2 = np.zeros_like(sizes), 0
    else:
        if secondary_capacity is None or secondary_capacity < 1:
            raise ValueError("secondary needs a secondary_capacity >= 1")
        second, capacity2 = np.asarray(secondary, dtype=np.int64).reshape(-1), int(secondary_capacity)
        if second.shape != sizes.shape or (second.size and int(second.min()) < 0):
            raise ValueError("secondary must hold one non-negative size per item")
    if work is not None:
        work = np.asarray(work, dtype=np.float64).reshape(-1)
        if work.shape != sizes.shape or (work.size and float(work.min()) < 0):
            raise ValueError("work must hold one non-negative figure per item")
    order = sorted(range(sizes.size), key=lambda i: (-int(sizes[i]), -int(second[i]), i))
    rank = {i: r for r, i in enumerate(order)}
    orders = None if work is None else _work_orders(sizes, work)
    bins: list[list[int]] = [[i] for i in order if sizes[i] > capacity or second[i] > capacity2]
    remaining = [i for i in order if sizes[i] <= capacity and second[i] <= capacity2]
    while remaining:
        first, rest = remaining[0], remaining[1:]
        room = capacity - int(sizes[first])
        room2 = capacity2 - int(second[first])
        slots = None if k is None else k - 1
        if not rest or not room or slots == 0:
            picked = []
        elif work is None:
            picked = [rest[p] for p in best_subset(sizes[rest], room)]
        else:
            picked = _even_subset(first, rest, remaining, sizes, work, capacity, orders)
        if secondary is not None or slots is not None:
            picked = _within(picked, sizes, second, room2, slots)
            picked = _top_up(picked, rest, sizes, second, room, room2, slots)
        chosen = set(picked)
        bins.append([first] + sorted(picked, key=rank.__getitem__))
        remaining = [i for i in rest if i not in chosen]
    return bins


def _work_orders(sizes: np.ndarray, work: np.ndarray) -> tuple[list[int], list[int]]:
    """Every item's index, dearest first (ties by index), and cheapest per token first (ties by
    index): the orders :func:`_even_subset` walks, sorted once per buffer."""
    w, n = work.tolist(), sizes.tolist()
    return (sorted(range(len(w)), key=lambda i: (-w[i], i)),
            sorted(range(len(w)), key=lambda i: (w[i] / n[i], i)))


def _even_subset(first: int, rest: list[int], remaining: list[int], sizes: np.ndarray, work: np.ndarray,
                 capacity: int, orders: tuple[list[int], list[int]]) -> list[int]:
    """Items of ``rest`` to complete the bin of ``first``: dearest first while the bin's work stays
    within its target (the work of ``remaining`` over the bins its tokens need) and they fit, then
    the subset of the others that fills the room best, cheapest per token first (``orders``:
    :func:`_work_orders`, filtered here to ``rest``)."""
    need = max(1, math.ceil(int(sizes[remaining].sum()) / capacity))
    target = float(work[remaining].sum()) / need
    used, room = float(work[first]), capacity - int(sizes[first])
    member = set(rest)
    picked: list[int] = []
    for i in orders[0]:
        if i not in member:
            continue
        if work[i] <= 0 or used >= target:
            break
        if used + float(work[i]) <= target and int(sizes[i]) <= room:
            picked.append(i)
            used += float(work[i])
            room -= int(sizes[i])
    member.difference_update(picked)
    cheap = [i for i in orders[1] if i in member]
    if room and cheap:
        picked += [cheap[p] for p in best_subset(sizes[cheap], room)]
    return picked


def _within(picked: list[int], sizes, second, room2: int, slots: Optional[int]) -> list[int]:
    """Drop items (largest second size first, then shortest) until the count and second budget hold."""
    picked = sorted(picked, key=lambda i: (-int(second[i]), int(sizes[i]), i))
    while picked and (sum(int(second[i]) for i in picked) > room2 or (slots is not None and len(picked) > slots)):
        picked.pop(0)
    return picked


def _top_up(picked: list[int], rest: list[int], sizes, second, room: int, room2: int,
            slots: Optional[int]) -> list[int]:
    """Add more remaining items (longest first) while every budget still holds."""
    used, used2 = sum(int(sizes[i]) for i in picked), sum(int(second[i]) for i in picked)
    taken = set(picked)
    for i in rest:
        if slots is not None and len(picked) >= slots:
            break
        if i not in taken and used + sizes[i] <= room and used2 + second[i] <= room2:
            picked.append(i)
            taken.add(i)
            used += int(sizes[i])
            used2 += int(second[i])
    return picked
