"""Where the cookers find media named by path: the loader's media roots and Energon aux sources.

Cookers are stateless free functions that Energon runs in its worker processes. The task encoder
opens a :func:`media_scope` around each cook call (``cook_crude_sample``): a context variable that
holds the configured ``data.media_roots``, the dataset's auxiliary sources (what Energon passes to
``cook(sample, **aux)``) and the lookup counter. ``cookers.media.path_media`` reads it, so every
cooker that names media by path (and any user cooker calling ``path_media``/``media_ref``) gets the
same resolution without new arguments. Outside a scope (a cooker called directly) there are no
roots and no aux sources: paths resolve inside the dataset folder only.

Binding (which aux source holds a dataset's media), per dataset reference of a metadataset:
``subflavors.media_source: NAME`` selects the aux source ``NAME``; else the aux source named
``media_source`` (NeMo-RL's convention: ``aux: {media_source: ...}``); else, for a path that starts
with a prefix of ``subflavors.aux_data_prefixes`` (``{prefix: aux name}``, NeMo-RL's), that aux
source, the prefix stripped; else the aux source named ``media``; else the dataset's only aux
source; else none (paths resolve in the dataset folder and the media roots). A path is looked up
in the bound source as named; when it is not there, by its file name (basename): exactly one entry
of that name is used (counted as ``basename_fallback``), several are a ``missing_media`` error
naming them. The bytes are read lazily through the source's
``FileStore`` (:class:`AuxMedia`): when phase 1 needs a header and when phase 2 decodes.
"""

from __future__ import annotations

import os
import posixpath
import re
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Sequence

from energon_nemotron._energon import (add_source_info, entry_size, filesystem_entry, remote_entry_range,
                                      store_entry_names, store_kind, store_local_base, webdataset_entry)
from energon_nemotron._energon.storage import RemotePath
from energon_nemotron.cookers.remote_entries import EntryCache, remote_entry_bytes
from energon_nemotron.errors import ConfigError, DataError, MediaError
from energon_nemotron.types import MediaRef

#: the subflavor that names the aux source holding a dataset's media
MEDIA_SOURCE_SUBFLAVOR = "media_source"
#: the aux sources used when the subflavor ``media_source`` is not set, in order: NeMo-RL's name
#: (before ``aux_data_prefixes``), then this library's (after them)
NEMO_RL_SOURCE, DEFAULT_SOURCE = "media_source", "media"
#: the subflavor mapping path prefixes to aux sources (NeMo-RL's ``aux_data_prefixes``)
PREFIXES_SUBFLAVOR = "aux_data_prefixes"
#: keys Energon itself adds to a cooker's keyword arguments (never media sources)
ENERGON_KEYS = ("primary", "cache")
#: columns of the media lookup counter (``NemotronMultimodalTaskEncoder.media_lookups``)
LOOKUP_COUNTERS = ("basename_fallback",)
#: how many candidates an ambiguous basename error lists
MAX_LISTED = 5


@dataclass(frozen=True)
class MediaScope:
    """What path resolution may use during one cook call: ``roots`` (resolved folders, in order),
    ``aux`` (the dataset's aux sources by name: Energon ``FileStore``s), ``lookups`` (a
    ``telemetry.SharedCounter`` with ``LOOKUP_COUNTERS``, or None) and ``entry_cache`` (where aux
    entries fetched from object storage are kept: ``remote_entries.EntryCache``, or None)."""

    roots: tuple[Path, ...] = ()
    aux: Mapping[str, Any] = field(default_factory=dict)
    lookups: Any = None
    entry_cache: Optional[EntryCache] = None


_SCOPE: ContextVar[MediaScope] = ContextVar("energon_nemotron_media_scope", default=MediaScope())


@contextmanager
def media_scope(roots: Sequence[Path] = (), aux: Optional[Mapping[str, Any]] = None,
                lookups: Any = None, entry_cache: Optional[EntryCache] = None) -> Iterator[MediaScope]:
    """Make ``roots``, the aux sources ``aux``, the counter ``lookups`` and the ``entry_cache``
    available to ``path_media`` while the block runs (a custom task encoder wraps its cook calls in
    this)."""
    scope = MediaScope(tuple(Path(r).resolve() for r in roots), aux_sources(aux or {}), lookups, entry_cache)
    token = _SCOPE.set(scope)
    try:
        yield scope
    finally:
        _SCOPE.reset(token)


def current_scope() -> MediaScope:
    """The innermost :func:`media_scope` (an empty one outside any)."""
    return _SCOPE.get()


def aux_sources(aux: Mapping[str, Any]) -> dict[str, Any]:
    """The aux sources of a cooker's keyword arguments (without Energon's ``primary``/``cache``)."""
    return {k: v for k, v in aux.items() if k not in ENERGON_KEYS}


def bound_source(aux: Mapping[str, Any], subflavors: Optional[Mapping], dataset: str = "the dataset",
                 path: Optional[str] = None) -> tuple[Optional[str], Optional[str]]:
    """(name of the aux source that holds the media at ``path``, the path to look up there), or
    (None, path); see the module docstring. Without ``path`` the prefixes are not consulted. A
    ``media_source`` that names no aux source is a ``ConfigError``; a matching prefix whose aux source
    the dataset lacks is a ``DataError`` (``missing_media``) naming both."""
    names = [k for k in aux if k not in ENERGON_KEYS]
    chosen = (subflavors or {}).get(MEDIA_SOURCE_SUBFLAVOR)
    if chosen is not None:
        if chosen not in names:
            raise ConfigError(f"{dataset}: subflavor {MEDIA_SOURCE_SUBFLAVOR}: {chosen!r} names no aux source of the "
                              f"dataset (its aux sources: {', '.join(names) or 'none'}); set it to a key of the "
                              "dataset reference's aux: mapping in the metadataset")
        return chosen, path
    if NEMO_RL_SOURCE in names:
        return NEMO_RL_SOURCE, path
    if path is not None:
        clean = re.sub(r"^(\./)+", "", path).replace("/./", "/")
        for prefix, name in ((subflavors or {}).get(PREFIXES_SUBFLAVOR) or {}).items():
            if clean.startswith(prefix):
                if name not in names:
                    raise DataError(dataset, f"media path {path!r}: subflavor {PREFIXES_SUBFLAVOR} maps its prefix "
                                             f"{prefix!r} to {name!r}, which is not an aux source of the dataset (its "
                                             f"aux sources: {', '.join(names) or 'none'})", "missing_media")
                return name, clean[len(prefix):]
    if DEFAULT_SOURCE in names:
        return DEFAULT_SOURCE, path
    return (names[0] if len(names) == 1 else None), path


def check_binding(aux: Mapping[str, Any], subflavors: Optional[Mapping], dataset: str) -> None:
    """At start: ``media_source`` and every aux source named by ``aux_data_prefixes`` must be aux
    sources of the dataset (``ConfigError`` naming the dataset, the key and its aux sources)."""
    bound_source(aux, subflavors, dataset)
    names = [k for k in aux if k not in ENERGON_KEYS]
    prefixes = (subflavors or {}).get(PREFIXES_SUBFLAVOR) or {}
    if not isinstance(prefixes, Mapping):
        raise ConfigError(f"{dataset}: subflavor {PREFIXES_SUBFLAVOR} must map path prefixes to aux source names, "
                          f"got {prefixes!r}")
    for prefix, name in prefixes.items():
        if not isinstance(prefix, str) or name not in names:
            raise ConfigError(f"{dataset}: subflavor {PREFIXES_SUBFLAVOR}: {prefix!r}: {name!r} names no aux source of "
                              f"the dataset (its aux sources: {', '.join(names) or 'none'})")


def within(path: Path, folders: Sequence[Path]) -> bool:
    """Whether ``path`` (resolved) lies inside one of ``folders`` (resolved)."""
    return any(path == f or f in path.parents for f in folders)


# -- one entry of an aux source -------------------------------------------------------------------
class AuxMedia:
    """A lazy media payload: entry ``key`` of the aux source ``source`` (an Energon ``FileStore``);
    ``get()`` reads its bytes through the store (the task encoder has ``decoder = None``, so aux
    stores are not wrapped in a ``DecodeFileStore`` and return raw bytes)."""

    __slots__ = ("store", "key", "source", "cache")

    def __init__(self, store: Any, key: str, source: str, cache: Optional[EntryCache] = None) -> None:
        self.store, self.key, self.source, self.cache = store, key, source, cache

    def size(self) -> Optional[int]:
        """The entry's byte size from the source's index or file system, without reading it (None:
        unknown)."""
        return entry_size(self.store, self.key)

    def origin(self) -> str:
        """Where the entry is read from, for messages: its shard of a prepared-dataset source (a
        damaged shard is then named by every error about its entries), else the source's path."""
        info = webdataset_entry(self.store, self.key) if store_kind(self.store) == "webdataset" else None
        shard = f"shard {info.shard_name} of " if info is not None else ""
        return f"{shard}aux source {self.source!r} ({self.store.get_path()})"

    def get(self) -> bytes:
        """The entry's bytes: from a prepared dataset on object storage, one ranged read of the
        entry's bytes in its shard (from the index), fetched once (``cookers.remote_entries``: the
        handoff and, with the cache pool set, the entry cache ``cache``); else through the store."""
        try:
            at = remote_entry_range(self.store, self.key)
            data = self.store.get(self.key) if at is None else remote_entry_bytes(
                *at, fetch=lambda: RemotePath(at[0]).read_range(at[1], at[2]), cache=self.cache)
            if at is not None and len(data) != at[2]:
                raise ValueError(f"{len(data)} of its {at[2]} bytes are in the shard (truncated)")
        except (KeyError, OSError) as e:
            raise MediaError(f"{self.key} in {self.origin()} cannot be read: {e}", code="missing_media") from None
        except Exception as e:              # a damaged shard: whatever its reader raises, named
            raise MediaError(f"{self.key} in {self.origin()} cannot be read (is the shard damaged?): "
                             f"{type(e).__name__}: {e}") from None
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise MediaError(f"{self.key} in aux source {self.source!r}: got {type(data).__name__}, not bytes (the "
                             "task encoder must keep decoder = None so that aux sources return raw bytes)")
        return bytes(data)

    def __repr__(self) -> str:
        return f"AuxMedia({self.source!r}, {self.key!r})"


def _lookup(store: Any, key: str, modality: str, value: str, where: str, allowed: Sequence[Path]):
    """``(found, source_info)`` of entry ``key`` without reading it; ``source_info`` is what
    Energon's ``FileStore.get`` would record (None when unknown). A filesystem entry whose
    symlinks lead outside the source folder and ``allowed`` is ``path_escape``."""
    kind = store_kind(store)
    if kind == "webdataset":
        info = webdataset_entry(store, key)
        return info is not None, info
    if kind == "filesystem":
        base = store_local_base(store)
        if base is None:
            found = (store.base_dir / key).is_file()
        else:
            target = (base / key).resolve()
            found = target.is_file()
            folders = [base.resolve(), *allowed]
            if found and not within(target, folders):
                raise DataError(where, f"{modality} path {value!r} in aux source {store.get_path()} resolves to "
                                       f"{target}, outside the allowed folders ({', '.join(map(str, folders))})",
                                "path_escape")
        return found, filesystem_entry(store, key) if found else None
    return True, None                           # unknown store: read (and fail) lazily


#: basename -> entry keys, per aux source (built on the first fallback, once per process)
_INDEXES: dict[tuple[str, str], dict[str, tuple[str, ...]]] = {}


def basename_index(store: Any) -> Optional[dict[str, tuple[str, ...]]]:
    """Every entry of an aux source by basename (None: the source cannot be listed: an index
    without its part table, an unknown store). A folder on object storage is listed once."""
    kind = store_kind(store)
    cache_key = (kind, store.get_path())
    if cache_key in _INDEXES:
        return _INDEXES[cache_key]
    names: Optional[list[str]] = store_entry_names(store)
    if kind == "filesystem" and store_local_base(store) is not None:
        base = store_local_base(store)
        names = []
        for folder, dirs, files in os.walk(base):
            dirs[:] = sorted(d for d in dirs if d != ".nv-meta")
            rel = Path(folder).relative_to(base).as_posix()
            names += [f if rel == "." else f"{rel}/{f}" for f in sorted(files)]
    if names is None:
        return None
    index: dict[str, list[str]] = {}
    for name in names:
        index.setdefault(posixpath.basename(name), []).append(name)
    _INDEXES[cache_key] = {k: tuple(v) for k, v in index.items()}
    return _INDEXES[cache_key]


def _clean_key(value: str) -> Optional[str]:
    """The entry key a sample's path names directly (None for an absolute path or one leaving the
    source with ``..``: those are found by basename only)."""
    if value.startswith("/"):
        return None
    key = posixpath.normpath(value)
    return None if key == ".." or key.startswith("../") else key


def aux_media(sample: dict, value: str, modality: str, where: str, source: str, scope: MediaScope):
    """``MediaRef`` of the media named ``value``, read from the aux source ``source``: the entry of
    that name, else the only entry with its basename (``basename_fallback``); else
    ``missing_media``. The entry's source info is added to the sample's ``__sources__``."""
    store = scope.aux[source]
    allowed = list(scope.roots)
    key = _clean_key(value)
    found, info = _lookup(store, key, modality, value, where, allowed) if key else (False, None)
    if not found:
        base = posixpath.basename(value.rstrip("/"))
        index = basename_index(store)
        where_looked = f"aux source {source!r} ({store.get_path()})"
        if index is None:
            raise DataError(where, f"{modality} {value!r} not found in {where_looked}; this source cannot be listed, "
                                   "so no basename fallback was tried", "missing_media")
        candidates = index.get(base, ())
        if len(candidates) > 1:
            shown = ", ".join(candidates[:MAX_LISTED]) + (", ..." if len(candidates) > MAX_LISTED else "")
            raise DataError(where, f"{modality} {value!r} not found in {where_looked}, and its basename {base!r} is "
                                   f"ambiguous there: {len(candidates)} entries ({shown})", "missing_media")
        if not candidates:
            raise DataError(where, f"{modality} {value!r} not found in {where_looked}, not even by its basename "
                                   f"{base!r}", "missing_media")
        key = candidates[0]
        found, info = _lookup(store, key, modality, value, where, allowed)
        if scope.lookups is not None:
            scope.lookups.add("basename_fallback")
    if info is not None:
        add_source_info(sample, info)
    return MediaRef(modality, AuxMedia(store, key, source, scope.entry_cache), {}, name=value)
