"""The files ``energon prepare`` writes, as Energon reads them: ``.nv-meta/`` names, YAML parsing,
the ``.info`` shard counts and the split file (``split.yaml``, else a ``split.json``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from energon_nemotron._energon import load_yaml
from energon_nemotron._energon.storage import as_data_path

#: a prepared dataset folder's metadata folder
META = ".nv-meta"
#: the shard-count files Energon writes (the first found is read)
INFO_FILES = (".info.json", ".info.yaml")

__all__ = ["META", "INFO_FILES", "load_yaml_file", "info_file", "info_counts", "split_file", "unprepared"]


def load_yaml_file(path: Path) -> Any:
    """A YAML file parsed as Energon parses it (``_energon.load_yaml``)."""
    return load_yaml(as_data_path(path).read_bytes())


def info_file(meta: Path) -> Path:
    """The ``.info`` file of metadata folder ``meta`` (the JSON one when neither exists)."""
    return next((meta / n for n in INFO_FILES if (meta / n).is_file()), meta / INFO_FILES[0])


def info_counts(meta: Path) -> tuple[str, dict]:
    """(name of the ``.info`` file, its ``shard_counts``) of metadata folder ``meta``; raises what
    reading or parsing raises."""
    if (meta / ".info.json").is_file():
        return ".info.json", json.loads((meta / ".info.json").read_text())["shard_counts"]
    return ".info.yaml", load_yaml_file(meta / ".info.yaml")["shard_counts"]


def split_file(meta: Path, name: str = "split.yaml") -> Path:
    """The split file Energon reads in ``meta`` for a reference's ``split_config`` ``name``: the
    default ``split.yaml`` falls back to ``split.json`` when only that exists."""
    if name == "split.yaml" and not (meta / name).is_file() and (meta / "split.json").is_file():
        return meta / "split.json"
    return meta / name


def unprepared(path: Path, jsonl_index: bool = True) -> Optional[tuple[str, str]]:
    """Why a ``path`` (local or ``msc://``) cannot be an Energon data reference, as ``(kind, why)``: kind
    ``missing`` (``why``: "does not exist"), ``unprepared`` (a folder without ``.nv-meta`` or its
    ``.info`` file, a ``.jsonl`` without its ``.jsonl.idx`` when ``jsonl_index``) or ``unknown``
    (another file). None: a prepared folder, a ``.jsonl`` or a metadataset ``.yaml``."""
    path = as_data_path(path)
    if path.is_dir():
        if not (path / META).is_dir():
            return "unprepared", f"is not a prepared Energon dataset (it has no {META} folder)"
        if not any((path / META / name).is_file() for name in INFO_FILES):
            return "unprepared", f"is not a prepared Energon dataset (no {META}/{INFO_FILES[0]})"
        return None
    if path.is_file() and path.name.endswith(".jsonl"):
        if jsonl_index and not path.with_name(path.name + ".idx").is_file():
            return "unprepared", f"is not prepared (no {path.name}.idx beside it)"
        return None
    if path.is_file() and path.name.endswith(".yaml"):
        return None
    if path.exists():
        return "unknown", "is neither a dataset folder, a .jsonl nor a metadataset .yaml"
    return "missing", "does not exist"
