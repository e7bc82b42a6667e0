"""Energon's per-worker checkpoints, settled for workers that have delivered nothing yet.

Energon 7.4's savable loader answers a save from each worker process with the latest checkpoint at
or before the worker's next sample, plus an offset of samples to skip. A worker that has not yet
started iterating (a state saved right after the first batch, while the second worker is still
starting: seen with 2 workers on a loaded machine) still holds only its constructor's placeholder,
"sample index -1, no state": its answer is "the initial state, then skip one sample", and a loader
restored from it silently drops that worker's first batch. After a restore the same race answers
with the placeholder instead of the restored checkpoint.

A worker that has delivered nothing since the loader started (its sample counter in the main
process is where it started) is, exactly, where the loader started it: the initial state, or the
checkpoint it was restored from. :func:`settle` puts that in place of whatever the worker answered.
"""

from __future__ import annotations

from typing import Any, Optional

from energon_nemotron._energon import empty_worker_checkpoint, initial_worker_checkpoints, worker_sample_counters


def start_point(loader: Any) -> tuple[list[int], Optional[list]]:
    """What an Energon ``SavableDataLoader`` starts its workers from, before iterating: each
    worker's sample counter, and the checkpoints it restores (None: the initial state)."""
    if not loader.num_workers:
        return [], None
    return worker_sample_counters(loader), initial_worker_checkpoints(loader)


def settle(state: Any, loader: Any, start: tuple[list[int], Optional[list]]) -> Any:
    """``state`` (``loader.save_state_rank()``) with the checkpoint of every worker that has
    delivered nothing since ``start`` (:func:`start_point`) replaced by the one it started from."""
    counters, checkpoints = start
    if state is None or not counters:
        return state
    for w, count in enumerate(worker_sample_counters(loader)):
        if count == counters[w]:
            state.worker_states[w] = checkpoints[w] if checkpoints else empty_worker_checkpoint()
    return state
