"""An elastic start: the merged state checked against the new loader, and every leaf made to skip,
without reading them, the samples consumed before it."""

from __future__ import annotations

from typing import Any

import numpy as np

from energon_nemotron._energon import (empty_leaf_sample, filter_leaf_samples, leaf_epoch, leaf_size, leaf_worker_slices,
                                      read_leaf_sample)
from energon_nemotron.errors import ConfigError
from energon_nemotron.resume.elastic.record import VERSION, _leaf_name, _rank_range, dataset_leaves, decode_counts, layout_free
from energon_nemotron.resume.fingerprint import check_fingerprint


class SkipConsumed:
    """How a leaf reads sample ``index`` after an elastic start: in its pass ``k`` a sample consumed
    more than ``k`` times is skipped (Energon's empty sample: nothing is read). Holds the counts of
    this rank's part only (``lo``: the first sample of it)."""

    def __init__(self, leaf: Any, counts: np.ndarray, lo: int) -> None:
        self.leaf = leaf
        self.counts, self.lo = counts, lo

    def __call__(self, index: int) -> Any:
        leaf, k = self.leaf, index - self.lo
        if 0 <= k < self.counts.size and self.counts[k] > leaf_epoch(leaf):
            return empty_leaf_sample(leaf, index)
        return read_leaf_sample(leaf, index)


def start_elastic(dataset: Any, merged: Any, fingerprint: dict, origin: str) -> list[np.ndarray]:
    """Check ``merged`` against this loader (its configuration apart from the rank layout, its
    datasets) and make every leaf skip what was consumed; returns the per-leaf counts."""
    body = merged.get("merged") if isinstance(merged, dict) else None
    if not isinstance(body, dict) or body.get("version") != VERSION:
        raise ConfigError(f"{origin}: not a merged state (energon_nemotron.resume.merge_rank_states of every "
                          "rank's state); elastic=True needs one")
    check_fingerprint(merged.get("fingerprint"), layout_free(fingerprint), origin)
    saved = body.get("leaves") if isinstance(body.get("leaves"), list) else []
    mine = [(list(p), _leaf_name(leaf), leaf_size(leaf)) for p, leaf in dataset_leaves(dataset)]
    theirs = [(s.get("path"), s.get("name"), s.get("size")) for s in saved]
    if mine != theirs:
        raise ConfigError(f"{origin}: the merged state's datasets {theirs} are not this loader's {mine}")
    counts = [decode_counts(s.get("counts"), s["size"], f"{origin} {s['name']}") for s in saved]
    install_filters(dataset, counts)
    return counts


def install_filters(dataset: Any, counts: list[np.ndarray]) -> None:
    """Make every leaf of ``dataset`` skip, in its pass ``k``, the samples consumed more than ``k``
    times (``counts``: uint8 per leaf ``[size]``; each leaf keeps this rank's part)."""
    for (_, leaf), c in zip(dataset_leaves(dataset), counts):
        lo, hi = _rank_range(leaf_worker_slices(leaf))
        filter_leaf_samples(leaf, SkipConsumed(leaf, np.ascontiguousarray(c[lo:hi]), lo))
