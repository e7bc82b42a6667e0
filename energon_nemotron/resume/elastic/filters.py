"""An elastic start: the merged state checked against the new loader, and every leaf made to skip,
without reading them, the samples consumed before it."""

from __future__ import annotations

from typing import Any

import numpy as np

from energon_nemotron.errors import ConfigError
from energon_nemotron.resume.elastic.record import VERSION, _leaf_name, _rank_range, dataset_leaves, decode_counts, layout_free
from energon_nemotron.resume.fingerprint import check_fingerprint


class SkipConsumed:
    """A leaf's ``_get_sample`` after an elastic start: in its pass ``k`` a sample consumed more than
    ``k`` times is skipped (Energon's empty-sample convention: nothing is read). Holds the counts of
    this rank's part only (``lo``: the first sample of it)."""

    def __init__(self, leaf: Any, counts: np.ndarray, lo: int) -> None:
        self.leaf = leaf
        self.counts, self.lo = counts, lo

    def __call__(self, index: int) -> Any:
        leaf, k = self.leaf, index - self.lo
        if 0 <= k < self.counts.size and self.counts[k] > leaf._epoch_count:
            from megatron.energon.flavors.webdataset.sample_loader import RawSampleData

            return RawSampleData(__restore_key__=("Webdataset", index), data=(None,) * len(leaf.join_readers))
        return type(leaf)._get_sample(leaf, index)


class RestoreUnfiltered:
    """A leaf's ``restore_sample`` after an elastic start: samples named by buffered restore keys
    are read as they are (the leaf yielded them, so they were not skipped)."""

    def __init__(self, leaf: Any) -> None:
        self.leaf = leaf

    def __call__(self, restore_key: tuple) -> Any:
        name, index = restore_key
        assert name == "Webdataset" and isinstance(index, int), restore_key
        return type(self.leaf)._get_sample(self.leaf, index)


def start_elastic(dataset: Any, merged: Any, fingerprint: dict, origin: str) -> list[np.ndarray]:
    """Check ``merged`` against this loader (its configuration apart from the rank layout, its
    datasets) and make every leaf skip what was consumed; returns the per-leaf counts."""
    body = merged.get("merged") if isinstance(merged, dict) else None
    if not isinstance(body, dict) or body.get("version") != VERSION:
        raise ConfigError(f"{origin}: not a merged state (energon_nemotron.resume.merge_rank_states of every "
                          "rank's state); elastic=True needs one")
    check_fingerprint(merged.get("fingerprint"), layout_free(fingerprint), origin)
    saved = body.get("leaves") if isinstance(body.get("leaves"), list) else []
    mine = [(list(p), _leaf_name(leaf), len(leaf.join_readers[0])) for p, leaf in dataset_leaves(dataset)]
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
        lo, hi = _rank_range(leaf.workers_slice_offsets)
        leaf._get_sample = SkipConsumed(leaf, np.ascontiguousarray(c[lo:hi]), lo)
        leaf.restore_sample = RestoreUnfiltered(leaf)
