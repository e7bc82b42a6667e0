"""The elastic record of a rank's state and the helpers every part of elastic resume shares: the
leaves of an Energon dataset tree, sample references in restore keys, per-sample counts."""

from __future__ import annotations

import base64
import copy
import zlib
from typing import Any, Iterator, Optional, Sequence

import numpy as np

from energon_nemotron._energon import (SELECTORS, batch_worker, inner_datasets, is_leaf, leaf_readers,
                                      leaf_shuffle_over_epochs, leaf_size, leaf_worker_slices, reader_location,
                                      sample_refs)
from energon_nemotron.errors import ConfigError

VERSION = 1
#: the loader settings a merged state may be restored under with other values (``batch_size``: a
#: fixed global batch over another DP size is another per-rank batch; it groups packs, picks none)
LAYOUT = ("dp_rank", "dp_size", "num_workers", "batch_size")
DAMAGED_HINT = "the state was saved by an older version, or damaged: resume it on the shape that saved it"


def encode_counts(counts: np.ndarray) -> str:
    """A uint8 array ``[n]`` as base64 of its zlib-compressed bytes."""
    return base64.b64encode(zlib.compress(np.ascontiguousarray(counts, dtype=np.uint8).tobytes(), 6)).decode("ascii")


def decode_counts(text: Any, size: int, where: str) -> np.ndarray:
    """Inverse of :func:`encode_counts`: uint8 ``[size]`` (``ConfigError`` naming ``where``)."""
    try:
        counts = np.frombuffer(zlib.decompress(base64.b64decode(text, validate=True)), dtype=np.uint8).copy()
    except (ValueError, TypeError, zlib.error) as e:
        raise ConfigError(f"{where}: damaged sample counts ({e})") from None
    if counts.size != size:
        raise ConfigError(f"{where}: {counts.size} sample counts for {size} samples")
    return counts


def dataset_leaves(dataset: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    """``(path, leaf)`` for every ``WebdatasetSampleLoaderDataset`` under ``dataset`` in depth-first
    order; ``path``: the inner-dataset index at every blend or concatenation on the way. Another
    wrapper with several inner datasets: ``ConfigError`` (its restore keys do not say which)."""
    name = type(dataset).__name__
    if is_leaf(dataset):
        yield path, dataset
        return
    children = inner_datasets(dataset)
    if len(children) > 1 and name not in SELECTORS:
        raise ConfigError(f"elastic resume: the dataset tree has a {name} with {len(children)} inner datasets; "
                          f"only {', '.join(SELECTORS)} are supported")
    for i, child in enumerate(children):
        yield from dataset_leaves(child, path + ((i,) if name in SELECTORS else ()))


def _leaf_name(leaf: Any) -> str:
    reader = leaf_readers(leaf)[0]
    where = reader_location(reader)
    return where.rstrip("/").rsplit("/", 1)[-1] if where is not None else type(reader).__name__


def _owned(offsets: Sequence[int]) -> tuple[int, int]:
    """A worker's samples: its slices are consecutive, ``[offsets[0], offsets[-1])``."""
    return (int(offsets[0]), int(offsets[-1])) if len(offsets) > 1 else (0, 0)


def _rank_range(leaf_workers: Sequence[Sequence[int]]) -> tuple[int, int]:
    spans = [_owned(o) for o in leaf_workers if len(o) > 1]
    return (min(lo for lo, _ in spans), max(hi for _, hi in spans)) if spans else (0, 0)


def rank_record(dataset: Any, cfg: Any, repeat: bool, skipped: Optional[list] = None,
                recent: Optional[list] = None) -> dict:
    """This rank's elastic record (see the module docstring); ``skipped``: per leaf the counts of an
    elastic start (uint8 ``[size]``), of which the record keeps this rank's part, or None;
    ``recent``: per worker the batches it delivered after its saved checkpoint
    (:meth:`RecentBatches.since`)."""
    leaves = []
    for i, (path, leaf) in enumerate(dataset_leaves(dataset)):
        if leaf_shuffle_over_epochs(leaf) not in (None, 1):
            raise ConfigError(f"elastic resume: leaf {_leaf_name(leaf)} shuffles its slices over "
                              f"{leaf_shuffle_over_epochs(leaf)} epochs; only one epoch at a time is supported")
        workers = [list(map(int, offsets)) for offsets in leaf_worker_slices(leaf)]
        entry = {"path": list(path), "name": _leaf_name(leaf), "size": leaf_size(leaf), "workers": workers}
        if skipped is not None:
            lo, hi = _rank_range(workers)
            entry["skipped"] = {"lo": lo, "counts": encode_counts(skipped[i][lo:hi])}
        leaves.append(entry)
    return {"version": VERSION, "dp_rank": cfg.loader.dp_rank, "dp_size": cfg.loader.dp_size,
            "num_workers": cfg.loader.num_workers, "repeat": bool(repeat), "leaves": leaves,
            "after_checkpoint": recent if recent is not None else []}


class RecentBatches:
    """Per worker, the samples of the batches it delivered lately, newest last: Energon saves a
    worker as its latest checkpoint plus the number of batches delivered after it (replayed on
    restore), and those batches' samples count as consumed. Keeps ``keep`` batches a worker (the
    loader checkpoints every worker at least once a second)."""

    def __init__(self, streams: int, keep: int = 4096) -> None:
        from collections import deque

        self.batches = [deque(maxlen=keep) for _ in range(max(streams, 1))]

    def add(self, restore_key: Any) -> None:
        """Record a delivered batch (its ``__restore_key__``: the worker wrapper's name, the worker,
        its batch index, then the batch's own key)."""
        if not restore_key:
            return
        worker, key = batch_worker(restore_key)
        self.batches[worker % len(self.batches)].append([[list(path), index] for path, index in sample_refs(key)])

    def since(self, energon: Any) -> list:
        """Per worker, the batches (each a list of sample refs ``[path, index]``) after the checkpoint
        that ``energon`` (a settled ``SavableDataLoaderState``) holds for it; ``None`` for a worker
        whose batches are no longer all kept."""
        out = []
        for w, entry in enumerate(getattr(energon, "worker_states", None) or []):
            offset = int(getattr(entry, "offset", 0) or 0)
            queue = self.batches[w] if w < len(self.batches) else ()
            out.append(None if offset > len(queue) else list(queue)[len(queue) - offset:])
        return out

    def seed(self, record: Any) -> None:
        """After a same-shape restore: the restored checkpoints' batches, as the saved record lists them."""
        saved = record.get("after_checkpoint") if isinstance(record, dict) else None
        for w, batches in enumerate(saved if isinstance(saved, list) else []):
            if w < len(self.batches) and isinstance(batches, list):
                self.batches[w].extend(batches)


def layout_free(fingerprint: Any) -> Any:
    out = copy.deepcopy(fingerprint)
    if isinstance(out, dict) and isinstance(out.get("loader"), dict):
        for key in LAYOUT:
            out["loader"].pop(key, None)
    return out


def rank_skipped(leaves: list[dict], where: str) -> Optional[list[np.ndarray]]:
    """The counts an elastic start skips, over the whole leaf (zero outside this rank's part)."""
    if not all(isinstance(leaf, dict) and "skipped" in leaf for leaf in leaves):
        return None
    out = []
    for leaf in leaves:
        lo, hi = _rank_range(leaf["workers"])
        full = np.zeros(leaf["size"], dtype=np.uint8)
        full[lo:hi] = decode_counts(leaf["skipped"].get("counts"), hi - lo, f"{where} {leaf['name']}")
        out.append(full)
    return out

