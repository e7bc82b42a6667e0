"""Energon's metadata files and aux sources (file stores): YAML as Energon parses it, and entries of an
aux source found without reading them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from megatron.energon import SourceInfo
from megatron.energon.cache.file_store import SystemFileStore, WebdatasetFileStore
from megatron.energon.epathlib import epath as _epath
from megatron.energon.eyaml import load_yaml as _load_yaml
from megatron.energon.flavors.webdataset.config import split_name_re
from megatron.energon.source_info import add_source_info as _add_source_info


def load_yaml(data: bytes) -> Any:
    """YAML parsed as Energon parses its metadata (rapidyaml, ``megatron.energon.eyaml``)."""
    return _load_yaml(data)


def store_kind(store: Any) -> str:
    """An aux source's kind: ``webdataset`` (a prepared dataset: sqlite index), ``filesystem`` (a
    folder) or ``other``."""
    if isinstance(store, WebdatasetFileStore):
        return "webdataset"
    if isinstance(store, SystemFileStore) and store.base_dir is not None:
        return "filesystem"
    return "other"


def store_local_base(store: Any) -> Optional[Path]:
    """The local folder of a filesystem aux source (None for a remote one)."""
    return store.base_dir.local_path() if store.base_dir.is_local() else None


def webdataset_entry(store: Any, key: str) -> Optional[SourceInfo]:
    """The source info of entry ``key`` (``SAMPLE.member``) of a prepared-dataset aux source, as its
    ``FileStore.get`` would record it, without reading it; None when there is no such entry."""
    m = split_name_re.match(key)
    if not m:
        return None
    reader = store.sqlite_reader
    try:
        if store.db_has_sample_parts:
            tar_id = reader.get_sample_part(m.group(1), m.group(2)).tar_file_id
        else:                               # an index without the part table: the sample must exist
            tar_id = reader.get_sample_pointer_by_key(m.group(1)).tar_file_id
    except KeyError:
        return None
    return SourceInfo(dataset_path=store.base_path, index=key, shard_name=store.tar_filenames[tar_id],
                      file_names=(key,))


def entry_size(store: Any, key: str) -> Optional[int]:
    """The byte size of entry ``key`` of an aux source, without reading it: a prepared dataset's
    from its index (sample part table), a local folder's from the file system; None when unknown
    (a remote folder, an index without parts, no such entry)."""
    kind = store_kind(store)
    if kind == "webdataset" and store.db_has_sample_parts:
        m = split_name_re.match(key)
        if not m:
            return None
        try:
            return int(store.sqlite_reader.get_sample_part(m.group(1), m.group(2)).raw_byte_size)
        except KeyError:
            return None
    if kind == "filesystem" and store.base_dir.is_local():
        try:
            return os.path.getsize(store.base_dir.local_path() / key)
        except OSError:
            return None
    return None


def remote_entry_range(store: Any, key: str) -> Optional[tuple[str, int, int]]:
    """``(shard URL, byte offset, byte size)`` of entry ``key`` of a prepared-dataset aux source on
    object storage, from its index (None: a local source, an index without its part table, no such
    entry). One ranged read of these bytes fetches the entry; Energon's own read opens the shard,
    which on object storage downloads the whole shard for each entry."""
    if store_kind(store) != "webdataset" or store.base_path.is_local() or not store.db_has_sample_parts:
        return None
    m = split_name_re.match(key)
    if not m:
        return None
    try:
        part = store.sqlite_reader.get_sample_part(m.group(1), m.group(2))
    except KeyError:
        return None
    shard = store.base_path / store.tar_filenames[part.tar_file_id]
    return str(shard), int(part.raw_byte_offset), int(part.raw_byte_size)


def filesystem_entry(store: Any, key: str) -> SourceInfo:
    """The source info a folder aux source records for entry ``key``."""
    return SourceInfo(dataset_path=store.base_dir, index=key, shard_name=str(store.base_dir), file_names=(key,))


def store_entry_names(store: Any) -> Optional[list[str]]:
    """Every entry name of a prepared-dataset aux source with a part table, or of a folder aux source
    on object storage (one recursive listing; ``.nv-meta`` left out); None otherwise (a local
    folder is walked by the caller)."""
    kind = store_kind(store)
    if kind == "webdataset" and store.db_has_sample_parts:
        return [full for full, _, _ in store.list_all_sample_parts()]
    if kind == "filesystem" and not store.base_dir.is_local():
        base = store.base_dir
        names = (path.relative_to(base) for path in base.walk())
        return sorted(name for name in names if name.split("/", 1)[0] != ".nv-meta")
    return None


def add_source_info(sample: Any, info: SourceInfo) -> None:
    """Record ``info`` in a crude sample's ``__sources__`` (as Energon's own aux reads do)."""
    _add_source_info(sample, info)


def index_file(meta: Path) -> Path:
    """The sample index ``energon prepare`` writes in a prepared dataset's metadata folder ``meta``
    (an SQLite database)."""
    return meta / "index.sqlite"


def indexed_sample_key(meta: Path, shard: int, position: int) -> Optional[str]:
    """The key of the ``position``-th sample of shard number ``shard`` (in ``.info`` order) of a
    prepared dataset, from the ``index.sqlite`` that ``energon prepare`` writes in its metadata
    folder ``meta`` (None when it has no such sample); raises what sqlite raises."""
    import sqlite3

    uri = index_file(meta).resolve().as_uri() + "?mode=ro"
    with sqlite3.connect(uri, uri=True) as db:
        row = db.execute("SELECT sample_key FROM samples WHERE tar_file_id = ? AND sample_index = ?",
                         (shard, position)).fetchone()
    return row[0] if row else None


def set_nvdataset_cache_dir(path: Path) -> None:
    """The root of ``dss://NAME@VERSION/PATH`` dataset paths (Energon reads ``PATH`` under
    ``ROOT/NAME/VERSION/``): the environment variable ``NVDATASET_CACHE_DIR``, which Energon reads
    once at import (and worker processes inherit), and the module global of ``megatron.energon.epathlib.epath``
    it was read into."""
    os.environ["NVDATASET_CACHE_DIR"] = str(path)
    _epath.NVDATASET_CACHE_DIR = _epath.EPath(str(path))
