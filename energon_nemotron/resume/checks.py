"""A saved loader state checked against the loader restoring it, and Energon's part restored.

Every key of a state is checked before Energon sees it (its own checks are bare ``AssertionError``s
inside the workers): the ``fingerprint`` and ``position`` parts (:func:`state_parts`), a
Megatron-LM rows position (:func:`rows_position`), an Energon position decoded and matched to the
loader's workers (:func:`energon_position`) and dataset tree (:func:`check_state_tree`). Each
failure is a ``ConfigError`` naming the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from energon_nemotron._energon import (inner_datasets, is_loader_state, is_worker_checkpoint, is_wrapper, savable_fields,
                                      saved_class, saved_inner, worker_dataset_state, worker_root)
from energon_nemotron.config import describe_value as _kind
from energon_nemotron.errors import ConfigError
from energon_nemotron.resume.codec import decode_state
from energon_nemotron.resume.fingerprint import DAMAGED

__all__ = ["state_parts", "rows_position", "energon_position", "check_state_tree", "restore_energon"]


def _shorter(text: str, limit: int = 300) -> str:
    """``text`` with its middle elided past ``limit`` characters (deep state paths)."""
    return text if len(text) <= limit else f"{text[:limit // 3]}...{text[-2 * limit // 3:]}"


def state_parts(state: Any, origin: str = "the loader state") -> tuple[dict, dict]:
    """The ``fingerprint`` and ``position`` of a loader state (a ``ConfigError`` naming the key
    when one is missing or not a mapping)."""
    if not isinstance(state, dict):
        raise ConfigError(f"{origin}: expected a mapping with fingerprint and position, got {_kind(state)}; {DAMAGED}")
    if "merged" in state and "position" not in state:
        raise ConfigError(f"{origin}: a merged state of several ranks (energon_nemotron.resume.merge_rank_states): "
                          "load it with load_state_dict(state, elastic=True)")
    for key in ("fingerprint", "position"):
        if key not in state:
            raise ConfigError(f"{origin}: no {key!r} key; {DAMAGED}")
        if not isinstance(state[key], dict):
            raise ConfigError(f"{origin}: {key} is {_kind(state[key])}, not a mapping; {DAMAGED}")
    return state["fingerprint"], state["position"]


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def rows_position(position: dict, num_workers: int, origin: str = "the loader state") -> tuple[dict[int, int], int]:
    """``({worker: rows consumed}, next worker)`` of a Megatron-LM rows loader's ``position``, checked
    against the loader's ``num_workers`` (a ``ConfigError`` naming the key otherwise)."""
    if "workers" not in position:
        other = " (it is the position of an Energon loader)" if "energon" in position else ""
        raise ConfigError(f"{origin}: position has no 'workers' key{other}; {DAMAGED}")
    workers, nxt, streams = position["workers"], position.get("next_worker", 0), max(num_workers, 1)
    if not isinstance(workers, dict):
        raise ConfigError(f"{origin}: position.workers is {_kind(workers)}, not a mapping; {DAMAGED}")
    out = {}
    for key, rows in workers.items():
        worker = int(key) if isinstance(key, str) and key.isdigit() else None
        if worker is None or worker >= streams:
            raise ConfigError(f"{origin}: position.workers has worker {key!r}; this loader has {streams} worker "
                              f"stream(s) (loader.num_workers {num_workers}); {DAMAGED}")
        if not _count(rows):
            raise ConfigError(f"{origin}: position.workers.{key} is {_kind(rows)}, not a row count; {DAMAGED}")
        out[worker] = rows
    if not _count(nxt) or nxt >= streams:
        raise ConfigError(f"{origin}: position.next_worker is {_kind(nxt)}, not a worker below {streams}; {DAMAGED}")
    return out, nxt


def energon_position(position: dict, num_workers: int, origin: str = "the loader state") -> Any:
    """The decoded Energon ``SavableDataLoaderState`` (or None: saved before any worker started) of
    an Energon loader's ``position``: a ``ConfigError`` naming the entry when it does not decode or
    holds the states of another number of workers."""
    if "energon" not in position:
        other = " (it is the position of a Megatron-LM rows loader)" if "workers" in position else ""
        raise ConfigError(f"{origin}: position has no 'energon' key{other}; {DAMAGED}")
    try:
        state = decode_state(position["energon"], "position.energon")
    except (ValueError, TypeError, RecursionError) as e:
        raise ConfigError(f"{origin}: {_shorter(str(e))}; {DAMAGED}") from None
    if state is None:
        return None
    if not is_loader_state(state):
        raise ConfigError(f"{origin}: position.energon is {_kind(state)}, not an Energon loader state; {DAMAGED}")
    states, streams = state.worker_states, max(num_workers, 1)
    if not isinstance(states, list) or len(states) != streams:
        n = len(states) if isinstance(states, list) else _kind(states)
        raise ConfigError(f"{origin}: position.energon holds the states of {n} worker stream(s); this loader has "
                          f"{streams} (loader.num_workers {num_workers}); {DAMAGED}")
    return state


def check_state_tree(dataset: Any, state: Any, path: str, origin: str = "the loader state") -> None:
    """What Energon asserts when a worker restores ``state`` into ``dataset`` (there, inside the
    worker, as a bare ``AssertionError``), checked here first: at every level the class name, the
    savable fields, and the number of inner datasets."""
    name = type(dataset).__name__
    if saved_class(state) != name:
        found = saved_class(state) if isinstance(state, dict) else _kind(state)
        raise ConfigError(f"{origin}: {_shorter(path)} is the state of {found}, and the loader has a {name} "
                          f"there; {DAMAGED}")
    missing = [k for k in savable_fields(dataset) if k not in state]
    if missing:
        raise ConfigError(f"{origin}: {path} ({name}) lacks {', '.join(missing)}; {DAMAGED}")
    recorded, inner = saved_inner(state)
    if is_wrapper(dataset) and recorded:
        mine = inner_datasets(dataset)
        if not isinstance(inner, list) or len(inner) != len(mine):
            raise ConfigError(f"{origin}: {path}.datasets does not match the {len(mine)} inner "
                              f"dataset(s) of {name}; {DAMAGED}")
        for i, (ds, sub) in enumerate(zip(mine, inner)):
            check_state_tree(ds, sub, f"{path}.datasets[{i}]", origin)


def restore_energon(loader: Any, position: dict, origin: str = "the loader state") -> None:
    """Restore an Energon ``SavableDataLoader`` (before iterating) from ``position``; every failure
    (decoding, the structure Energon expects, ``restore_state_rank`` itself) is a ``ConfigError``."""
    import traceback

    state = energon_position(position, loader.num_workers, origin)
    if state is not None and not loader.num_workers:      # the main process's whole tree
        check_state_tree(loader.dataset, state.worker_states[0], "position.energon.worker_states[0]", origin)
    elif state is not None:                                # per worker, restored in the worker
        for w, ckpt in enumerate(state.worker_states):
            if not is_worker_checkpoint(ckpt):
                raise ConfigError(f"{origin}: position.energon.worker_states[{w}] is {_kind(ckpt)}; {DAMAGED}")
            inner = worker_dataset_state(ckpt)
            if inner is not None:
                where = f"position.energon.worker_states[{w}].state.dataset_state"
                check_state_tree(worker_root(loader), inner, where, origin)
    try:
        loader.restore_state_rank(state)
    except Exception as e:      # noqa: BLE001 - Energon asserts (often without a message) on a foreign state
        frame = traceback.extract_tb(e.__traceback__)[-1]
        raise ConfigError(f"{origin}: position.energon: Energon cannot restore it ({type(e).__name__} "
                          f"{str(e)[:200] or 'without a message'} at {Path(frame.filename).name}:{frame.lineno}); "
                          f"{DAMAGED}") from None
