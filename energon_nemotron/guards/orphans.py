"""Loader workers die with the process that started them.

Energon's loader forks its workers (a torch ``DataLoader`` with the ``fork`` context). When the main
process is killed (``SIGKILL``, the OOM killer, a ``SIGTERM`` it does not handle), a forked worker
would live on, reparented and asleep on a futex, holding its memory, forever. :func:`install`
registers an at-fork hook once per process: every child forked after it asks the kernel
(``prctl(PR_SET_PDEATHSIG, SIGKILL)``) to be killed when the thread that forked it ends, and exits at
once if that parent is already gone (it died between the fork and the request). The loader calls it
before it starts workers.

Linux only (elsewhere nothing is done). The kernel ties the signal to the forking *thread*: a loader
iterated in a thread that ends while the process goes on loses its workers with it, which the
``DataLoader`` then reports as workers that exited.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

#: ``PR_SET_PDEATHSIG`` of ``<linux/prctl.h>``
PR_SET_PDEATHSIG = 1
_state = {"installed": False, "parent": 0}


def _before_fork() -> None:
    _state["parent"] = os.getpid()


def _in_child() -> None:
    """In a fresh child: the parent-death signal, then exit if the parent already went."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return
    except (OSError, AttributeError):
        return
    if os.getppid() != _state["parent"]:
        os._exit(1)


def install() -> bool:
    """Register the hook (once; later calls do nothing); returns whether it is active (Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    if not _state["installed"]:
        os.register_at_fork(before=_before_fork, after_in_child=_in_child)
        _state["installed"] = True
    return True


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host still exists (one that is not ours to signal counts as
    alive): how a lock or folder left by a killed process is told from a live one's."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
