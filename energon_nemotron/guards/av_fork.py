"""A forked loader worker never reuses the video scaler its parent built.

PyAV 18.1.1 caches one ``VideoReformatter`` per thread (``VideoFrame.reformat`` reuses it) and
creates its FFmpeg scaler with ``threads=0``: swscale starts its own thread pool. A child forked
after its parent converted a frame (a ``num_workers: 0`` loader, a preview, a test, then a loader
with workers) inherits that cached scaler but not its threads, and its first ``reformat`` waits
forever on threads that do not exist: the worker stalls until the watchdog ends it. :func:`install`
registers an at-fork hook once per process that makes every forked child drop the inherited cache,
so its first ``reformat`` builds a fresh scaler with live threads. The dropped scaler is kept
referenced, never freed: freeing it would join the threads that are not there.

PyAV versions without the cache (18.1.0 and older) have nothing to drop; the hook then does nothing.
The cache is PyAV's private ``av.video.frame._thread_local``; this module is its only reader.
"""

from __future__ import annotations

import os
import sys

_state = {"installed": False}
#: scalers inherited through a fork: held, never freed (their thread pool is not in this process)
_inherited: list = []


def _in_child() -> None:
    """In a fresh child: forget the parent thread's cached reformatter, if PyAV has one."""
    module = sys.modules.get("av.video.frame")
    local = getattr(module, "_thread_local", None)
    reformatter = getattr(local, "reformatter", None)
    if reformatter is not None:
        _inherited.append(reformatter)
        local.reformatter = None


def install() -> None:
    """Register the hook (once; later calls do nothing)."""
    if not _state["installed"]:
        os.register_at_fork(after_in_child=_in_child)
        _state["installed"] = True
