"""A loader that makes no progress becomes an error, never a wait without end.

Energon's watchdog (``loader.watchdog_timeout_seconds``, on by default) watches every loader
process (each DataLoader worker, or the main process without workers): when one yields no sample
for that long, it prints the stacks of the process's threads and ends the process with the
message of :func:`describe_stall` (which worker, its pid, the sample it began last and how long
ago); the loader in the main process then fails with :func:`worker_exit_error` instead of
PyTorch's bare "worker exited unexpectedly". A timeout without workers ends the main process
itself (Energon's behaviour: a thread cannot interrupt a main thread stuck in native code).
"""

from __future__ import annotations

import os
from typing import Optional

import torch.utils.data

from energon_nemotron._energon import name_watchdog_timeouts, stop_watchdog_threads
from energon_nemotron.errors import LoaderError
from energon_nemotron.telemetry import last_begun

__all__ = ["install", "describe_stall", "worker_exit_error"]


def describe_stall(timeout: float) -> str:
    """What a watchdog timeout of ``timeout`` seconds in this process says."""
    info = torch.utils.data.get_worker_info()
    who = (f"loader worker {info.id} of {info.num_workers} (pid {os.getpid()})" if info is not None
           else f"the loader (pid {os.getpid()}, no workers)")
    key, ago = last_begun()
    what = (f"the last sample it began is {key}, {ago:.0f} s ago" if key is not None
            else "it has begun no sample yet (opening its shards, or filling its buffers)")
    return (f"{who} made no progress for {timeout:g} s (loader.watchdog_timeout_seconds): {what}; the stacks of "
            "its threads are printed above; the process ends now")


def install() -> None:
    """Energon's watchdog says :func:`describe_stall`, and its thread ends with the iteration it
    watches (idempotent)."""
    name_watchdog_timeouts(describe_stall)
    stop_watchdog_threads()


def worker_exit_error(error: BaseException) -> Optional[LoaderError]:
    """The library error for PyTorch's "DataLoader worker ... exited unexpectedly" (None for any
    other error): a worker ended, by a watchdog timeout (its message is above) or a crash."""
    text = str(error)
    if not isinstance(error, RuntimeError) or "exited unexpectedly" not in text:
        return None
    return LoaderError(f"{text.rstrip('. ')}: a loader worker ended; if a watchdog timeout ended it, its "
                        "message and thread stacks are printed above (loader.watchdog_timeout_seconds), "
                        "else it crashed (out of memory, a signal)")
