"""Packing algorithms: bin for bin equal to the textbook item-by-item algorithms; invariants."""

from __future__ import annotations

import inspect
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energon_nemotron.packing import balanced_greedy_knapsack, best_fit_decreasing, fill_ratio, first_fit_decreasing, first_fit_shuffle
from energon_nemotron.registry import PACKERS

ALL_PACKERS = ["balanced_greedy_knapsack", "best_fit_decreasing", "concatenative", "first_fit_decreasing",
               "first_fit_shuffle", "greedy_knapsack", "minimum_bin_slack", "modified_first_fit_decreasing"]


def textbook(lengths, capacity, best, k=None, order=None):
    """Item-by-item reference: in ``order`` (default: decreasing length, stable), first or best
    fit among the bins holding fewer than ``k`` items (all bins when ``k`` is None)."""
    if order is None:
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    rooms, bins = [], []
    for i in order:
        size = lengths[i]
        if size > capacity:
            rooms.append(0)
            bins.append([i])
            continue
        fits = [b for b, room in enumerate(rooms) if room >= size and (k is None or len(bins[b]) < k)]
        if fits:
            b = min(fits, key=lambda b: (rooms[b], b)) if best else fits[0]
            rooms[b] -= size
            bins[b].append(i)
        else:
            rooms.append(capacity - size)
            bins.append([i])
    return bins


ALGOS = [(best_fit_decreasing, True), (first_fit_decreasing, False)]


@pytest.mark.parametrize("algo, best", ALGOS)
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_equal_to_textbook(algo, best, data):
    capacity = data.draw(st.integers(1, 64))
    lengths = data.draw(st.lists(st.integers(1, capacity + 8), max_size=120))
    assert algo(lengths, capacity) == textbook(lengths, capacity, best)


@pytest.mark.parametrize("algo, best", ALGOS)
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_equal_to_textbook_with_max_sequences(algo, best, data):
    capacity = data.draw(st.integers(1, 64))
    lengths = data.draw(st.lists(st.integers(1, capacity + 8), max_size=120))
    k = data.draw(st.integers(1, 10))
    assert algo(lengths, capacity, max_sequences_per_bin=k) == textbook(lengths, capacity, best, k)


@pytest.mark.parametrize("algo, best", ALGOS)
@pytest.mark.parametrize("k", [None, 1, 2, 3, 7])
def test_many_equal_lengths_equal_to_textbook(algo, best, k):
    rng = np.random.default_rng(1)
    lengths = rng.choice([3, 5, 7, 11, 30], size=600).tolist()
    assert algo(lengths, 64, max_sequences_per_bin=k) == textbook(lengths, 64, best, k)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_first_fit_shuffle_is_first_fit_in_shuffled_order(data):
    capacity = data.draw(st.integers(1, 64))
    lengths = data.draw(st.lists(st.integers(1, capacity + 8), max_size=120))
    k = data.draw(st.none() | st.integers(1, 10))
    seed = data.draw(st.integers(0, 2**32))
    order = list(range(len(lengths)))
    random.Random(seed).shuffle(order)
    expected = textbook(lengths, capacity, False, k, order)
    assert first_fit_shuffle(lengths, capacity, max_sequences_per_bin=k, seed=seed) == expected


@pytest.mark.parametrize("name", ALL_PACKERS)
@settings(max_examples=150, deadline=None)
@given(lengths=st.lists(st.integers(1, 5000), max_size=400), capacity=st.integers(1, 4096),
       k=st.none() | st.integers(1, 12), seed=st.integers(0, 1000))
def test_invariants(name, lengths, capacity, k, seed):
    algo = PACKERS.get(name)
    bins = algo(lengths, capacity, max_sequences_per_bin=k, seed=seed)
    placed = sorted(i for b in bins for i in b)
    assert placed == list(range(len(lengths)))                    # every item exactly once
    assert all(b for b in bins)                                    # no empty bins
    for b in bins:
        total = sum(lengths[i] for i in b)
        assert total <= capacity or len(b) == 1                    # capacity holds (or lone oversized)
        assert k is None or len(b) <= k
    assert algo(lengths, capacity, max_sequences_per_bin=k, seed=seed) == bins   # deterministic
    if lengths:
        bound = -(-sum(min(x, capacity) for x in lengths) // capacity)
        assert len(bins) >= bound
        assert 0 < fill_ratio(lengths, bins, capacity) <= 1
    if k is None or k >= min(len(lengths), capacity):              # the limit cannot bind
        assert algo(lengths, capacity, seed=seed) == bins


def test_first_fit_shuffle_seeds():
    lengths = [5, 3, 8, 2, 4, 6, 7, 1, 9, 2, 3, 5]
    a, b = first_fit_shuffle(lengths, 10, seed=0), first_fit_shuffle(lengths, 10, seed=1)
    assert a == first_fit_shuffle(lengths, 10, seed=0)
    assert a != b
    assert first_fit_shuffle(lengths, 10) == a                     # default seed 0


def test_balanced_greedy_knapsack_by_hand():
    # lengths 5 3 8 2 4 6 (indices 0..5), capacity 10: total 28 -> ceil(28 / 10) = 3 bins.
    # Decreasing (stable): 8(#2) 6(#5) 5(#0) 4(#4) 3(#1) 2(#3); fills start [0, 0, 0].
    #   8 -> bin 0 (fill 0, lowest)        fills [8, 0, 0]
    #   6 -> bin 1                         fills [8, 6, 0]
    #   5 -> bin 2                         fills [8, 6, 5]
    #   4 -> bin 2 (least, 5 + 4 <= 10)    fills [8, 6, 9]
    #   3 -> bin 1 (least, 6 + 3 <= 10)    fills [8, 9, 9]
    #   2 -> bin 0 (least, 8 + 2 <= 10)    fills [10, 9, 9]
    assert balanced_greedy_knapsack([5, 3, 8, 2, 4, 6], 10) == [[2, 3], [5, 1], [0, 4]]
    # 12 4 6 6 6, capacity 10: Σ min = 10 + 22 = 32 -> 4 bins. 12(#0) alone in bin 0; 6(#2) ->
    # bin 1, 6(#3) -> bin 2, 6(#4) -> bin 3; 4(#1) -> bin 1 (fills 6 6 6, lowest) = 10.
    assert balanced_greedy_knapsack([12, 4, 6, 6, 6], 10) == [[0], [2, 1], [3], [4]]
    # 6 6 6, capacity 10: 2 bins; the third 6 does not fit the least-filled bin (6) -> new bin.
    assert balanced_greedy_knapsack([6, 6, 6], 10) == [[0], [1], [2]]
    # five 1s, capacity 10, k = 2: 1 bin up front; it closes after two items, so each further pair
    # opens a new bin: [0, 1], [2, 3], [4].
    assert balanced_greedy_knapsack([1] * 5, 10, max_sequences_per_bin=2) == [[0, 1], [2, 3], [4]]
    # 7 2 2 2 1, capacity 10, k = 2: 14 -> 2 bins. 7 -> bin 0; 2(#1) -> bin 1; 2(#2) -> bin 1 (fill
    # 2 < 7), bin 1 closes (2 items); 2(#3) -> bin 0 (7 + 2), closes; 1(#4): no bin left -> new bin.
    assert balanced_greedy_knapsack([7, 2, 2, 2, 1], 10, max_sequences_per_bin=2) == [[0, 3], [1, 2], [4]]
    # Without k: fills [7, 0] -> 2(#1) bin 1 [7, 2] -> 2(#2) bin 1 [7, 4] -> 2(#3) bin 1 [7, 6]
    # -> 1(#4) bin 1 (6 < 7) [7, 7].
    assert balanced_greedy_knapsack([7, 2, 2, 2, 1], 10) == [[0], [1, 2, 3, 4]]


def naive_balanced(lengths, capacity, k=None):
    """Reference balanced greedy knapsack: linear scans instead of a heap."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    n_start = -(-sum(min(x, capacity) for x in lengths) // capacity)
    bins, fills = [[] for _ in range(n_start)], [0] * n_start
    for i in order:
        size = lengths[i]
        if size > capacity:                        # first in the order: the first empty bin
            b = fills.index(0)
            bins[b], fills[b] = [i], capacity
            continue
        open_ = [b for b in range(len(bins)) if k is None or len(bins[b]) < k]
        b = min(open_, key=lambda b: (fills[b], b)) if open_ else None
        if b is not None and fills[b] + size <= capacity:
            bins[b].append(i)
            fills[b] += size
        else:
            bins.append([i])
            fills.append(size)
    return [b for b in bins if b]


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_balanced_greedy_knapsack_equal_to_naive(data):
    capacity = data.draw(st.integers(1, 64))
    lengths = data.draw(st.lists(st.integers(1, capacity + 8), max_size=120))
    k = data.draw(st.none() | st.integers(1, 10))
    expected = naive_balanced(lengths, capacity, k)
    assert balanced_greedy_knapsack(lengths, capacity, max_sequences_per_bin=k) == expected


def test_fill_ratio_unchanged():
    # Σ min(len, capacity) / (bins · capacity); oversized items count as capacity.
    assert fill_ratio([5, 3, 8, 2, 4, 6], [[2, 3], [5, 1], [0, 4]], 10) == pytest.approx(28 / 30)
    assert fill_ratio([12, 4, 6, 6, 6], [[0], [2, 1], [3], [4]], 10) == pytest.approx(32 / 40)
    assert fill_ratio([1] * 5, [[0, 1], [2, 3], [4]], 10) == pytest.approx(5 / 30)
    assert fill_ratio([], [], 10) == 1.0


def test_lognormal_fill_near_the_bound():
    rng = np.random.default_rng(0)
    lengths = np.maximum(1, np.round(rng.lognormal(np.log(600), 0.9, size=20_000))).astype(int)
    for algo, _ in ALGOS:
        bins = algo(lengths, 4096)
        assert fill_ratio(lengths, bins, 4096) > 0.999
    assert fill_ratio(lengths, first_fit_shuffle(lengths, 4096), 4096) > 0.98
    assert fill_ratio(lengths, balanced_greedy_knapsack(lengths, 4096), 4096) > 0.98


def test_registry_signature_and_errors():
    assert PACKERS.names() == ALL_PACKERS
    assert PACKERS.get("best_fit_decreasing") is best_fit_decreasing
    for name in ALL_PACKERS:
        params = inspect.signature(PACKERS.get(name)).parameters
        assert list(params)[:4] == ["lengths", "capacity", "max_sequences_per_bin", "seed"]
        assert params["max_sequences_per_bin"].kind is inspect.Parameter.KEYWORD_ONLY
        assert params["max_sequences_per_bin"].default is None and params["seed"].default == 0
        algo = PACKERS.get(name)
        with pytest.raises(ValueError, match="lengths must be >= 1, got 0 at index 1"):
            algo([3, 0], 8)
        with pytest.raises(ValueError, match="capacity must be >= 1"):
            algo([3], 0)
        with pytest.raises(ValueError, match="max_sequences_per_bin must be >= 1"):
            algo([3], 8, max_sequences_per_bin=0)
        assert algo([], 8) == [] and algo([], 8, max_sequences_per_bin=2) == []
    known = ", ".join(ALL_PACKERS)
    with pytest.raises(KeyError, match=f"unknown packer 'nope'; known: {known}"):
        PACKERS.get("nope")


# -- minimum_bin_slack ----------------------------------------------------------------------------

from itertools import combinations  # noqa: E402

from energon_nemotron.packing.refine import best_subset, minimum_bin_slack  # noqa: E402


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(1, 40), max_size=10), room=st.integers(0, 100))
def test_best_subset_is_exact(sizes, room):
    arr = np.asarray(sizes, dtype=np.int64)
    picked = best_subset(arr, room) if sizes else []
    assert len(set(picked)) == len(picked) and sum(sizes[i] for i in picked) <= room
    best = max((sum(c) for r in range(len(sizes) + 1) for c in combinations(sizes, r) if sum(c) <= room), default=0)
    assert sum(sizes[i] for i in picked) == best


@settings(max_examples=150, deadline=None)
@given(lengths=st.lists(st.integers(1, 300), min_size=1, max_size=60), k=st.one_of(st.none(), st.integers(1, 5)),
       patches=st.lists(st.integers(0, 500), min_size=60, max_size=60), budget=st.one_of(st.none(), st.integers(200, 1500)))
def test_minimum_bin_slack_invariants_with_two_budgets(lengths, k, patches, budget):
    extra = {} if budget is None else {"secondary": patches[:len(lengths)], "secondary_capacity": budget}
    bins = minimum_bin_slack(lengths, 256, max_sequences_per_bin=k, **extra)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths))) and all(bins)
    for b in bins:
        lone = len(b) == 1
        assert sum(lengths[i] for i in b) <= 256 or lone
        assert k is None or len(b) <= k
        assert budget is None or sum(patches[i] for i in b) <= budget or lone
    if k is None and budget is None:
        assert len(bins) >= -(-sum(min(x, 256) for x in lengths) // 256)


def test_minimum_bin_slack_reaches_the_buffer_bound_on_lognormal():
    rng = np.random.default_rng(3)
    lengths = np.clip(np.round(rng.lognormal(np.log(600), 0.9, size=256 * 20)), 1, 4096).astype(int)
    packs = bound = 0
    for s in range(0, lengths.size, 256):
        chunk = lengths[s:s + 256]
        packs += len(minimum_bin_slack(chunk, 4096))
        bound += -(-int(chunk.sum()) // 4096)
        packs_bfd = len(best_fit_decreasing(chunk, 4096))
        assert len(minimum_bin_slack(chunk, 4096)) <= packs_bfd
    assert packs <= bound + 1
