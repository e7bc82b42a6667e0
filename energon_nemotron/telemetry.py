"""Counters shared across DataLoader workers.

``SharedCounter`` is a small int64 table in shared memory (one row per worker, one column per
name), created before the workers fork: each worker adds to its own row and the main process reads
the sums at any time, so counts from workers that yield nothing afterwards are never lost. The
loader's running statistics over them are ``loading.stats.LoaderStats``.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.utils.data


class SharedCounter:
    """Counts by name across worker processes (see the module docstring); an unknown name counts
    as ``other`` when that column exists, else it is an error."""

    def __init__(self, names: Sequence[str], num_workers: int = 0) -> None:
        self.names = tuple(names)
        self.table = torch.zeros(num_workers + 1, len(self.names), dtype=torch.int64).share_memory_()

    def add(self, name: str, n: int = 1) -> None:
        info = torch.utils.data.get_worker_info()
        row = 0 if info is None else min(info.id + 1, self.table.shape[0] - 1)
        col = self.names.index(name) if name in self.names else self.names.index("other")
        self.table[row, col] += n

    def totals(self) -> dict[str, int]:
        """Non-zero sums over all workers."""
        return {name: int(n) for name, n in zip(self.names, self.table.sum(0).tolist()) if n}


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
