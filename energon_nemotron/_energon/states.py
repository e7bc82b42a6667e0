"""Energon's saved states (a savable loader's, its workers' checkpoints, the dataset state trees inside)
and the savable loader's own bookkeeping of its workers."""

from __future__ import annotations

from typing import Any, Optional

from megatron.energon.savable_loader import SavableDataLoaderState, SavableDatasetCheckpoint
from megatron.energon.wrappers.base import BaseWrapperDataset


def is_loader_state(state: Any) -> bool:
    """Whether ``state`` is a savable loader's state (``save_state_rank()``)."""
    return isinstance(state, SavableDataLoaderState)


def is_worker_checkpoint(entry: Any) -> bool:
    return isinstance(entry, SavableDatasetCheckpoint)


def worker_dataset_state(entry: Any) -> Any:
    """The saved dataset state tree of one worker's checkpoint (None: a worker that never started);
    without workers the entry is the main process's tree itself."""
    if not is_worker_checkpoint(entry):
        return entry
    return getattr(entry.state, "dataset_state", None) if entry.state is not None else None


def empty_worker_checkpoint() -> Any:
    """The checkpoint of a worker that has not started: its initial state, nothing to skip."""
    return SavableDatasetCheckpoint(state=None, offset=0)


def saved_class(tree: Any) -> Optional[str]:
    """The class name a saved dataset state records (None for anything else)."""
    return tree.get("__class__") if isinstance(tree, dict) else None


def saved_inner(tree: Any) -> tuple[bool, Any]:
    """``(recorded, states)``: whether a saved wrapper state records its inner datasets' states,
    and what it records there (a list when well formed)."""
    if isinstance(tree, dict) and "datasets" in tree:
        return True, tree["datasets"]
    return False, None


def saved_leaf_epoch(state: dict) -> int:
    """The pass a saved leaf state is in."""
    return int(state.get("_epoch_count", 0))


def saved_leaf_slices(state: dict) -> tuple[Optional[list], list, Optional[int]]:
    """``(pending slice indexes, active slice states, pending slices offset)`` of a saved leaf: an
    active state is None (an idle slot) or has ``index`` (its slice) and ``current`` (the next
    sample it reads)."""
    return (state.get("_pending_slice_indexes"), state.get("_active_slice_state") or [],
            state.get("_pending_slices_offset"))


def savable_fields(dataset: Any) -> tuple:
    """The fields a built dataset saves in its state."""
    return tuple(getattr(dataset, "_savable_fields", ()))


def is_wrapper(dataset: Any) -> bool:
    return isinstance(dataset, BaseWrapperDataset)


def worker_root(loader: Any) -> Any:
    """The dataset a savable loader's workers restore their checkpoints into."""
    return loader.dataset.dataset


def worker_sample_counters(loader: Any) -> list[int]:
    """Per worker of a savable loader, the samples the main process has received from it."""
    return list(loader._worker_sample_counters)


def initial_worker_checkpoints(loader: Any) -> Optional[list]:
    """The checkpoints a savable loader starts its workers from (None: their initial state)."""
    return loader.dataset.get_initial_checkpoint()


def shutdown_workers(loader: Any) -> list[Optional[int]]:
    """Stop the worker processes of a savable loader now, and return their exit codes (``[]``
    without workers or before its first ``iter``). A code does not tell a worker that ended on its
    own from one PyTorch terminated: both exit 0.

    The loader keeps PyTorch's multi-process iterator (its ``_iterator``: persistent workers) and
    its epoch generator refers back to the loader, so an abandoned loader is freed by the cyclic
    garbage collector. That one runs the weakref finalizers first, which close the iterator's index
    queues; the iterator's ``__del__`` then cannot reach its workers, waits 5 s for each and kills
    them. Called while the queues are open (``_shutdown_workers``), the workers end at once.
    Idempotent; the loader cannot start its workers again afterwards."""
    iterator = getattr(loader, "_iterator", None)
    if iterator is None or not hasattr(iterator, "_shutdown_workers"):
        return []
    iterator._shutdown_workers()
    return [w.exitcode for w in iterator._workers]
