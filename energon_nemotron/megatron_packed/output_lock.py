"""One ``pack-megatron`` run per output at a time.

Two runs writing the same output would use the same temporary file names and manifest: one dies
with a ``FileNotFoundError`` and the manifest may record the other's shards. :func:`output_lock`
takes an exclusive ``flock`` on ``OUTPUT.lock`` (beside the output) for the whole run; a second run
is a ``ConfigError`` naming the holder (pid, host, start time). The kernel releases the lock when
the holder exits, also when it is killed, so a crashed run never blocks the next one. The lock file
itself stays (removing it would let a third run lock a new file while the second holds the old),
saying so in its second line (:data:`RELEASED`): a finished run leaves a released lock naming a dead pid.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from energon_nemotron.errors import ConfigError


#: the lock file's second line: what it means once its run has ended
RELEASED = ("# the run above holds an exclusive flock(2) lock on this file while it writes the output; the "
            "kernel releases it when the run exits (also when it is killed). A file left after the run is a "
            "released lock: its pid is dead, the next run takes the lock; do not delete it while a run holds it.\n")


def lock_path(output: Path) -> Path:
    """``OUTPUT.lock`` beside the output file."""
    return output.with_name(output.name + ".lock")


@contextmanager
def output_lock(output: Path) -> Iterator[Path]:
    """Hold the exclusive lock of ``output`` while the block runs (see the module docstring)."""
    path = lock_path(output)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            said = os.pread(fd, 400, 0).decode("utf-8", "replace").strip()
            holder = said.splitlines()[0] if said else "another process"
            raise ConfigError(f"{output}: another pack-megatron run is writing it ({holder}); wait for it to end "
                              f"(the lock {path.name} is released when it exits), or write another --output") from None
        os.ftruncate(fd, 0)
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
        os.pwrite(fd, (f"pid {os.getpid()} on {socket.gethostname()}, started {started}\n{RELEASED}").encode(), 0)
        yield path
    finally:
        os.close(fd)
