"""Packing algorithms: bin for bin equal to the textbook item-by-item algorithms; invariants."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energon_nemotron.packing.algorithms import best_fit_decreasing, fill_ratio, first_fit_decreasing
from energon_nemotron.registry import PACKERS


def textbook(lengths, capacity, best):
    """Item-by-item reference: sorted by decreasing length (stable), first or best fit."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    rooms, bins = [], []
    for i in order:
        size = lengths[i]
        if size > capacity:
            rooms.append(0)
            bins.append([i])
            continue
        fits = [b for b, room in enumerate(rooms) if room >= size]
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
def test_many_equal_lengths_equal_to_textbook(algo, best):
    rng = np.random.default_rng(1)
    lengths = rng.choice([3, 5, 7, 11, 30], size=600).tolist()
    assert algo(lengths, 64) == textbook(lengths, 64, best)


@pytest.mark.parametrize("algo, best", ALGOS)
@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(1, 5000), max_size=400), capacity=st.integers(1, 4096))
def test_invariants(algo, best, lengths, capacity):
    bins = algo(lengths, capacity)
    placed = sorted(i for b in bins for i in b)
    assert placed == list(range(len(lengths)))                    # every item exactly once
    for b in bins:
        total = sum(lengths[i] for i in b)
        assert total <= capacity or len(b) == 1                    # capacity holds (or lone oversized)
    assert all(b for b in bins)
    if lengths:
        bound = -(-sum(min(x, capacity) for x in lengths) // capacity)
        assert len(bins) >= bound
        assert 0 < fill_ratio(lengths, bins, capacity) <= 1


def test_lognormal_fill_near_the_bound():
    rng = np.random.default_rng(0)
    lengths = np.maximum(1, np.round(rng.lognormal(np.log(600), 0.9, size=20_000))).astype(int)
    for algo, _ in ALGOS:
        bins = algo(lengths, 4096)
        assert fill_ratio(lengths, bins, 4096) > 0.999


def test_registry_and_errors():
    assert PACKERS.get("best_fit_decreasing") is best_fit_decreasing
    assert "first_fit_decreasing" in PACKERS.names()
    with pytest.raises(KeyError, match="unknown packer 'nope'; known: best_fit_decreasing, first_fit_decreasing"):
        PACKERS.get("nope")
    with pytest.raises(ValueError, match="lengths must be >= 1, got 0 at index 1"):
        best_fit_decreasing([3, 0], 8)
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        first_fit_decreasing([3], 0)
    assert best_fit_decreasing([], 8) == [] and first_fit_decreasing([], 8) == []
