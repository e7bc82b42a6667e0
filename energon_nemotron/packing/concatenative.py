"""Concatenative packing: the items in their own order, a new bin whenever the next one does not fit.

A packer of the ``registry.PACKERS`` protocol (``packing.spec``; guarantees in
``packing.algorithms``). NeMo-RL's ``concatenative`` (``ConcatenativePacker``): no reordering, so
consecutive items share a bin, which keeps the stream's order at the price of fill.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from energon_nemotron.packing.algorithms import _validate
from energon_nemotron.packing.spec import register_packer

__all__ = ["concatenative"]


@register_packer("concatenative")
def concatenative(lengths: Sequence[int] | np.ndarray, capacity: int, *,
                  max_sequences_per_bin: int | None = None, seed: int = 0) -> list[list[int]]:
    """In-order bins: each item joins the current bin if it fits there (and the bin holds fewer
    than ``max_sequences_per_bin`` items), else the current bin closes and the item opens the next.

    Args:
        lengths: int [N] item lengths (>= 1); a sequence or a numpy array.
        capacity: room of every bin (>= 1).
        max_sequences_per_bin: at most this many items per bin (>= 1); None: no limit.
        seed: ignored (deterministic packer; accepted for the common packer signature).

    Returns:
        Bins in order, each a run of consecutive indices: ``[[0, 1], [2], [3, 4, 5], ...]``. An
        oversized item (length > capacity) closes the current bin and stays alone in its own.
    """
    sizes = _validate(lengths, capacity, max_sequences_per_bin).tolist()
    k = max_sequences_per_bin
    bins: list[list[int]] = []
    current: list[int] = []
    fill = 0
    for i, s in enumerate(sizes):
        if current and (fill + s > capacity or (k is not None and len(current) >= k)):
            bins.append(current)
            current, fill = [], 0
        current.append(i)
        fill += s
    if current:
        bins.append(current)
    return bins
