"""The bytes of aux entries on object storage: fetched once, then read from memory or local disk.

An entry of a prepared aux dataset on the store (``msc://``) is one ranged GET of its bytes (their
offset and size from the index; ``_energon.files.remote_entry_range``). Two layers keep a GET from
being repeated:

- **the handoff** (always on): the plan reads an entry for its header, and the pack reads it again
  for its pixels a buffer later. The bytes of the first read are kept in memory until the second,
  at most :data:`HANDOFF_BYTES` a process and entries up to :data:`HANDOFF_ENTRY_BYTES` (the oldest
  dropped first; the second read drops them).
- **the entry cache** (:class:`EntryCache`, when ``loader.cache_pool`` is set): each fetched entry
  is also written to a file in a folder of this loader's own, under the cache pool's folder, so the
  epochs after the first read it from local disk. Each process writes at most its share of
  ``cache_pool.max_gbytes`` (the bound over the worker processes); once its share is full it stops
  adding entries (a later epoch reads the same entries in another order, so keeping the first ones
  gives the same hit rate as evicting, without rewriting). The folder is removed when the loader's
  process exits; a folder left by a killed process of this host is removed by the next loader that
  makes one beside it.

Within one loader the shards do not change (the start-up checks read them as they are), so an
entry is named by its shard URL, offset and size.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import tempfile
import uuid
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import Callable, Optional

from energon_nemotron.guards.orphans import process_alive

__all__ = ["HANDOFF_BYTES", "HANDOFF_ENTRY_BYTES", "EntryCache", "remote_entry_bytes", "FOLDER_PREFIX"]

#: the bytes the handoff holds at most, per process
HANDOFF_BYTES = 64 << 20
#: larger entries (videos, long audio) are not held by the handoff
HANDOFF_ENTRY_BYTES = 4 << 20
#: the entry cache's folders under the cache pool's folder: ``PREFIX-HOST-PID-RANDOM``
FOLDER_PREFIX = "energon-nemotron-aux"

#: (shard URL, offset, size) -> bytes read once in this process and not yet again
_HANDOFF: "OrderedDict[tuple[str, int, int], bytes]" = OrderedDict()
_HANDOFF_HELD = 0


class EntryCache:
    """A folder of aux entries fetched from object storage, each in a file of its own, written by
    the loader's processes and read by any of them.

    ``parent``: the cache pool's folder (None: the system's temporary folder); ``max_bytes``: the
    bound over all ``processes`` (each writes at most ``max_bytes // processes``). The folder is
    made on the first write; it and its files are removed when the process that made this object
    exits (or :meth:`remove` is called there)."""

    def __init__(self, parent: Optional[Path], max_bytes: int, processes: int) -> None:
        self.parent = Path(parent) if parent is not None else Path(tempfile.gettempdir())
        self.share = max(0, int(max_bytes)) // max(1, int(processes))
        self.owner = os.getpid()
        self.folder = self.parent / f"{FOLDER_PREFIX}-{_host()}-{self.owner}-{uuid.uuid4().hex[:8]}"
        self.written = 0                      # bytes this process has written
        self._made = False
        weakref.finalize(self, _remove_if_owner, self.folder, self.owner)

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("written", "_made")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, written=0, _made=False)

    def _file(self, url: str, offset: int, size: int) -> Path:
        name = hashlib.sha256(f"{url}\0{offset}\0{size}".encode()).hexdigest()[:40]
        return self.folder / name[:2] / name

    def get(self, url: str, offset: int, size: int) -> Optional[bytes]:
        """The entry's bytes if a process of this loader has written them (None: not cached)."""
        try:
            with open(self._file(url, offset, size), "rb") as f:
                data = f.read()
        except OSError:
            return None
        return data if len(data) == size else None

    def put(self, url: str, offset: int, size: int, data: bytes) -> bool:
        """Write the entry (atomically: a reader sees all of it or nothing) unless this process's
        share is full; True when written. A failing disk only stops the caching (reads go on
        fetching from the store)."""
        if len(data) != size or self.written + size > self.share:
            return False
        target = self._file(url, offset, size)
        try:
            if not self._made:
                self._make()
            target.parent.mkdir(exist_ok=True)
            tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, target)
        except OSError:
            self.share = 0                    # the disk is full or gone: cache no more
            return False
        self.written += size
        return True

    def _make(self) -> None:
        self.parent.mkdir(parents=True, exist_ok=True)
        if os.getpid() == self.owner:
            _remove_dead_folders(self.parent)
        self.folder.mkdir(exist_ok=True)
        self._made = True

    def remove(self) -> None:
        """Remove the folder and its files (only in the process that made this object)."""
        _remove_if_owner(self.folder, self.owner)


def remote_entry_bytes(url: str, offset: int, size: int, fetch: Callable[[], bytes],
                       cache: Optional[EntryCache] = None) -> bytes:
    """The ``size`` bytes at ``offset`` of the shard ``url``: from the handoff, else from the entry
    cache, else ``fetch()`` (one ranged GET), then kept in both."""
    global _HANDOFF_HELD
    key = (url, offset, size)
    if key in _HANDOFF:
        _HANDOFF_HELD -= size
        return _HANDOFF.pop(key)                # its second read: held no longer
    data = cache.get(url, offset, size) if cache is not None else None
    if data is None:
        data = fetch()
        if cache is not None:
            cache.put(url, offset, size, data)
    if len(data) == size <= HANDOFF_ENTRY_BYTES:
        _HANDOFF[key] = data
        _HANDOFF_HELD += size
        while _HANDOFF_HELD > HANDOFF_BYTES:
            _HANDOFF_HELD -= len(_HANDOFF.popitem(last=False)[1])
    return data


def handoff_held() -> int:
    """The bytes the handoff holds now (for tests)."""
    return _HANDOFF_HELD


def _host() -> str:
    return "".join(c if c.isalnum() else "_" for c in socket.gethostname())[:32] or "host"


def _remove_if_owner(folder: Path, owner: int) -> None:
    if os.getpid() == owner:
        shutil.rmtree(folder, ignore_errors=True)


def _remove_dead_folders(parent: Path) -> None:
    """Remove the entry-cache folders under ``parent`` left by processes of this host that are gone."""
    prefix = f"{FOLDER_PREFIX}-{_host()}-"
    for folder in parent.glob(f"{prefix}*"):
        pid = folder.name[len(prefix):].split("-", 1)[0]
        if pid.isdigit() and not process_alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


