"""Counters shared across DataLoader workers.

``SharedCounter`` is a small int64 table in shared memory (one row per worker, one column per
name), created before the workers fork: each worker adds to its own row and the main process reads
the sums at any time, so counts from workers that yield nothing afterwards are never lost. The
loader's running statistics over them are ``loading.stats.LoaderStats``.

What a process counted is also kept in that process until it is *reported*
(``take_unreported``: its producer attaches it to the next batch it makes, e.g. a skip to
``PackedBatch.skipped``); the reported sums are shared too, so that what no batch carried (a
worker's counts after its last batch) is ``unreported_totals``. A count travels with a batch once,
and only the batches a consumer takes report it: a resumed run that re-reads what a worker had read
ahead counts it once.

``SharedGauge`` is the same kind of table for a level (each worker's latest value and its peak):
the media bytes a worker's packing buffer holds.
"""

from __future__ import annotations

import os
from typing import Sequence

import torch
import torch.utils.data


def _worker_row(rows: int) -> int:
    """This process's row of a shared table of ``rows`` rows (0: the main process)."""
    info = torch.utils.data.get_worker_info()
    return 0 if info is None else min(info.id + 1, rows - 1)


class SharedGauge:
    """A level per worker process, shared across workers: its latest value and its peak."""

    def __init__(self, num_workers: int = 0) -> None:
        self.table = torch.zeros(num_workers + 1, 2, dtype=torch.int64).share_memory_()

    def set(self, value: int) -> None:
        row = self.table[_worker_row(self.table.shape[0])]
        row[0] = int(value)
        row[1] = max(int(row[1]), int(value))

    def now(self) -> int:
        """The sum of the workers' latest values."""
        return int(self.table[:, 0].sum())

    def peak(self) -> int:
        """The largest value one worker reached."""
        return int(self.table[:, 1].max())


class SharedCounter:
    """Counts by name across worker processes (see the module docstring); an unknown name counts
    as ``other`` when that column exists, else it is an error."""

    def __init__(self, names: Sequence[str], num_workers: int = 0) -> None:
        self.names = tuple(names)
        self.table = torch.zeros(num_workers + 1, len(self.names), dtype=torch.int64).share_memory_()
        self.reported = torch.zeros_like(self.table).share_memory_()
        self._unreported: dict[str, int] = {}       # this process's, not shared (module docstring)
        self._pid = os.getpid()                     # a forked worker starts with none of its parent's

    def _row(self) -> int:
        return _worker_row(self.table.shape[0])

    def add(self, name: str, n: int = 1) -> None:
        name = name if name in self.names else "other"
        self.table[self._row(), self.names.index(name)] += n
        mine = self._mine()
        mine[name] = mine.get(name, 0) + n

    def _mine(self) -> dict[str, int]:
        """This process's unreported counts."""
        if self._pid != os.getpid():
            self._pid, self._unreported = os.getpid(), {}
        return self._unreported

    def totals(self) -> dict[str, int]:
        """Non-zero sums over all workers."""
        return {name: int(n) for name, n in zip(self.names, self.table.sum(0).tolist()) if n}

    def take_unreported(self) -> dict[str, int]:
        """This process's counts since its last call, by name; from now on they are reported."""
        out = self._mine()
        self._unreported = {}
        row = self._row()
        for name, n in out.items():
            self.reported[row, self.names.index(name)] += n
        return out

    def unreported_totals(self) -> dict[str, int]:
        """Non-zero sums, over all workers, of the counts no ``take_unreported`` has taken."""
        left = (self.table - self.reported).sum(0).tolist()
        return {name: int(n) for name, n in zip(self.names, left) if n}


#: the sample this process began last (its shown key) and when (``time.monotonic()``): what a
#: watchdog timeout names (``guards.stalls``); per process, so per DataLoader worker
_LAST_BEGUN: list = [None, 0.0]


def began(key: str) -> None:
    """Record that this process begins reading the sample ``key``."""
    import time

    _LAST_BEGUN[0], _LAST_BEGUN[1] = key, time.monotonic()


def last_begun() -> tuple:
    """``(key, seconds since)`` of the sample this process began last; ``(None, None)`` before any."""
    import time

    key, at = _LAST_BEGUN
    return (None, None) if key is None else (key, time.monotonic() - at)
