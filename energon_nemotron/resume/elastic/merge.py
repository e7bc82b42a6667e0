"""``merge_rank_states``: how often each sample was consumed, from the states of all ranks (see
the package docstring)."""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator, Optional, Sequence

import numpy as np

from energon_nemotron._energon import (LEAF, SELECTORS, names_samples, sample_refs, saved_class, saved_inner,
                                      saved_leaf_epoch, saved_leaf_slices, worker_dataset_state)
from energon_nemotron.errors import ConfigError
from energon_nemotron.resume.checks import energon_position, state_parts
from energon_nemotron.resume.elastic.record import (DAMAGED_HINT, VERSION, _owned, encode_counts, layout_free,
                                                    rank_skipped)
from energon_nemotron.resume.fingerprint import fingerprint_diff


def _restore_keys(value: Any) -> Iterator[tuple]:
    """Every restore key anywhere in a saved state tree (buffers, pending keys), leaves' own states
    excepted."""
    if isinstance(value, tuple):
        if names_samples(value):
            yield value
            return
        for v in value:
            yield from _restore_keys(v)
    elif isinstance(value, dict):
        if saved_class(value) == LEAF:
            return
        for v in value.values():
            yield from _restore_keys(v)
    elif isinstance(value, list):
        for v in value:
            yield from _restore_keys(v)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _restore_keys(getattr(value, f.name))


def _leaf_states(tree: Any, path: tuple = ()) -> Iterator[tuple[tuple, dict]]:
    """``(path, state)`` of every leaf in a saved dataset state tree, in depth-first order."""
    if not isinstance(tree, dict):
        return
    name = saved_class(tree)
    if name == LEAF:
        yield path, tree
        return
    for i, child in enumerate(saved_inner(tree)[1] or []):
        yield from _leaf_states(child, path + ((i,) if name in SELECTORS else ()))


def _read_in_pass(state: dict, offsets: Sequence[int], where: str) -> np.ndarray:
    """uint8 ``[offsets[-1] - offsets[0]]``: 1 for the worker's samples its leaf has read in its
    current pass (from the leaf's saved state and the worker's slice ``offsets``)."""
    lo, hi = _owned(offsets)
    read = np.zeros(hi - lo, dtype=np.uint8)
    pending, active, pending_offset = saved_leaf_slices(state)
    if pending is None and pending_offset is None and all(a is None for a in active):
        return read                                   # the pass has not started
    if pending is None:
        raise ConfigError(f"{where}: the leaf's pending slices are not in the state; cannot tell what it has read")
    open_now = {a.index: a.current for a in active if a is not None}
    for k in set(range(len(offsets) - 1)) - set(pending) - set(open_now):
        read[offsets[k] - lo:offsets[k + 1] - lo] = 1
    for k, current in open_now.items():
        read[offsets[k] - lo:current - lo] = 1
    return read


def _add_worker(counts: list[np.ndarray], passes: list[list[int]], tree: Any, worker: int, leaves: list[dict],
                skipped: Optional[list], where: str) -> None:
    """Add one worker's consumption counts (its saved dataset state ``tree``; None: it never started)
    into ``counts`` (int16 per leaf ``[size]``), and its leaves' passes into ``passes``."""
    states = dict(_leaf_states(tree)) if tree is not None else {}
    if tree is not None and [list(p) for p in states] != [leaf["path"] for leaf in leaves]:
        raise ConfigError(f"{where}: the saved dataset tree has leaves {[list(p) for p in states]}, the record "
                          f"{[leaf['path'] for leaf in leaves]}")
    index = {tuple(leaf["path"]): i for i, leaf in enumerate(leaves)}
    for i, leaf in enumerate(leaves):
        offsets = leaf["workers"][worker]
        lo, hi = _owned(offsets)
        if hi <= lo:
            continue
        state = states.get(tuple(leaf["path"]), {})
        done = saved_leaf_epoch(state)
        mine = done + _read_in_pass(state, offsets, f"{where} leaf {leaf['name']}").astype(np.int16)
        if skipped is not None:                        # skipped by the elastic start: consumed already
            mine = np.maximum(mine, skipped[i][lo:hi])
        counts[i][lo:hi] += mine
        passes[i].append(done)
    for key in _restore_keys(tree):
        for path, sample in sample_refs(key):
            if path in index and 0 <= sample < leaves[index[path]]["size"]:
                counts[index[path]][sample] -= 1



def _worker_trees(energon: Any, where: str) -> list:
    """The saved dataset state tree of each worker stream (None: a worker that never started)."""
    return [worker_dataset_state(entry) for entry in energon.worker_states]


def _records(states: Sequence[dict]) -> tuple[list, dict]:
    """Each state's (elastic record, position), checked to be all ranks of one run once each, and
    their common layout-free fingerprint."""
    if not states:
        raise ConfigError("merge_rank_states: no states given")
    out, common = [], None
    for k, state in enumerate(states):
        fp, position = state_parts(state, f"state {k}")
        record = state.get("elastic")
        if not isinstance(record, dict) or record.get("version") != VERSION:
            raise ConfigError(f"state {k}: no elastic record (a Megatron-LM rows loader, or saved by an older "
                              "version): it can only be restored on the shape that saved it")
        if common is None:
            common = layout_free(fp)
        elif layout_free(fp) != common:
            raise ConfigError(f"state {k} was saved under another configuration than state 0:\n"
                              + "\n".join(fingerprint_diff(layout_free(fp), common)))
        out.append((record, position))
    size = out[0][0]["dp_size"]
    ranks = sorted(r["dp_rank"] for r, _ in out)
    if ranks != list(range(size)) or any(r["dp_size"] != size for r, _ in out):
        raise ConfigError(f"merge_rank_states: got the states of ranks {ranks} (dp_size "
                          f"{sorted({r['dp_size'] for r, _ in out})}); all {size} ranks are needed, once each")
    return out, common


def _merge(states: Sequence[dict]) -> dict:
    """:func:`merge_rank_states` (damaged records may raise other errors here)."""
    records, common = _records(states)
    shape = [(leaf["path"], leaf["name"], leaf["size"]) for leaf in records[0][0]["leaves"]]
    counts = [np.zeros(size, dtype=np.int16) for _, _, size in shape]
    passes: list[list[int]] = [[] for _ in shape]
    repeat = records[0][0]["repeat"]
    index_of = {tuple(p): i for i, (p, _, _) in enumerate(shape)}
    for record, position in records:
        where = f"rank {record['dp_rank']}"
        if [(leaf["path"], leaf["name"], leaf["size"]) for leaf in record["leaves"]] != shape:
            raise ConfigError(f"{where}: its datasets differ from rank 0's")
        skipped = rank_skipped(record["leaves"], where)
        energon = energon_position(position, record["num_workers"], where)
        trees = _worker_trees(energon, where) if energon is not None else [None] * max(record["num_workers"], 1)
        recent = record.get("after_checkpoint") or []
        for w, tree in enumerate(trees):
            _add_worker(counts, passes, tree, w, record["leaves"], skipped, f"{where} worker {w}")
            offset = int(getattr(energon.worker_states[w], "offset", 0) or 0) if energon is not None else 0
            batches = recent[w] if w < len(recent) else ([] if not offset else None)
            if batches is None or len(batches) != offset:
                raise ConfigError(f"{where} worker {w}: {offset} batch(es) delivered after its checkpoint, "
                                  f"{'none' if batches is None else len(batches)} recorded; {DAMAGED_HINT}")
            for batch in batches:              # delivered after the checkpoint: consumed once more
                for path, sample in batch:
                    i = index_of.get(tuple(path))
                    if i is not None and 0 <= sample < shape[i][2]:
                        counts[i][sample] += 1
    leaves = []
    for (path, name, size), c, done in zip(shape, counts, passes):
        base = min(done) if repeat and done else 0     # with repeat: relative to the lowest pass
        c = np.clip(c - base, 0, None)
        if c.max(initial=0) > 255:
            raise ConfigError(f"dataset {name}: a sample was consumed {int(c.max())} times; at most 255 are stored")
        leaves.append({"path": path, "name": name, "size": size, "counts": encode_counts(c.astype(np.uint8)),
                       "consumed": int(np.count_nonzero(c))})
    return {"fingerprint": common, "merged": {"version": VERSION, "repeat": repeat, "leaves": leaves,
                                              "saved_dp_size": records[0][0]["dp_size"],
                                              "saved_num_workers": records[0][0]["num_workers"]}}


def merge_rank_states(states: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One state for the whole run from the states of all N data-parallel ranks (any order), for
    ``load_state_dict(merged, elastic=True)`` on any number of ranks and workers. ``ConfigError``
    when a rank is missing or repeated, the states disagree on anything but the rank layout, a
    state has no elastic record (a Megatron-LM rows loader, or an older version) or a damaged one."""
    try:
        return _merge(states)
    except ConfigError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        raise ConfigError(f"merge_rank_states: an elastic record is damaged ({type(e).__name__}: {e}); "
                          f"{DAMAGED_HINT}") from None

