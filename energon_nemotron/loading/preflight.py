"""What a loader checks before Energon builds anything: the configured paths, then the whole source.

:func:`check_source_path` (a source's ``path``) and :func:`check_media_roots` (``data.media_roots``)
name the config field; :func:`check_source` walks an Energon source (``guards.source_tree``):
every referenced dataset exists and is prepared, and its split has shards; every leaf's merged
subflavors name a registered cooker (or ``data.default_cooker`` applies) and hold only keys that
cooker reads, with values of the declared type (``cookers.subflavors``); every shard and index
agrees with ``.info`` (``guards.shards``).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Optional

from energon_nemotron.config import DataConfig, MegatronSource, Source
from energon_nemotron._energon.storage import DataPath, RemotePath, as_data_path, listed
from energon_nemotron.cookers.selection import CookerSelection
from energon_nemotron.cookers.subflavors import subflavor_problems
from energon_nemotron.errors import ConfigError, DatasetError
from energon_nemotron.guards.energon_files import META, unprepared
from energon_nemotron.guards.shards import empty_split, leaf_problems
from energon_nemotron.guards.source_tree import Tree, walk

#: problems listed in one error (the rest counted)
MAX_LISTED = 12

__all__ = ["check_source_path", "check_media_roots", "check_source"]


def check_source_path(src: Source, field: str) -> None:
    """``ConfigError`` naming ``field`` (``data.train``) unless ``src.path`` is there and, for an
    Energon source, prepared (checked when a loader is built, not when the config is read)."""
    path = as_data_path(src.path)
    if isinstance(src, MegatronSource):
        if not path.is_file():
            what = "is a folder" if path.is_dir() else "does not exist"
            manifest = path.with_name(path.name + ".manifest.json")
            if manifest.is_file():
                what += f" (it was packed into shards: set path to their manifest {manifest.name})"
            raise ConfigError(f"{field}.path: {str(path)!r} {what}; a megatron_sft_packed source is a .jsonl.packed "
                              "file of packed rows or the OUT.manifest.json of its shards (write them with "
                              "`energon-nemotron pack-megatron`)")
        return
    problem = unprepared(path)
    if problem is None or problem[0] == "unknown" or (path / META).is_dir():
        return                  # another file, or metadata without its .info: named by the tree walk
    kind, why = problem
    fix = (f"prepare it with `energon prepare {path}`" if kind == "unprepared" else "set it to an Energon dataset: "
           "a folder prepared with `energon prepare FOLDER`, a metadataset .yaml or a prepared .jsonl")
    raise ConfigError(f"{field}.path: {str(path)!r} {why}; {fix}")


def check_media_roots(data: DataConfig) -> None:
    """``ConfigError`` naming ``data.media_roots[i]`` unless every media root is an existing folder
    (checked when a loader or task encoder is built)."""
    for i, root in enumerate(data.media_roots or ()):
        path = Path(root)
        if not path.is_dir():
            what = "is a file, not a folder" if path.exists() else "does not exist"
            raise ConfigError(f"data.media_roots[{i}]: {str(path)!r} {what}; a media root is a folder that media "
                              "paths in samples may name (relative paths resolve against the config's folder)")


def _raise(kind: type, what: str, problems: list[str], fix: str = "") -> None:
    if problems:
        unique = list(dict.fromkeys(problems))
        listed = unique[:MAX_LISTED] + ([f"... and {len(unique) - MAX_LISTED} more"] if len(unique) > MAX_LISTED else [])
        raise kind(f"{what}:\n  " + "\n  ".join(listed) + (f"\n{fix}" if fix else ""))


def cooker_selection(data: DataConfig) -> CookerSelection:
    """The loader's cooker rules: ``data.cookers``, else ``subflavors.cooker`` / ``data.default_cooker``."""
    rules = None if data.cookers is None else [c.model_dump() for c in data.cookers]
    return CookerSelection(rules, data.default_cooker)


def _check_splits(path: Path, tree: Tree) -> None:
    """A one-line ``ConfigError`` when a prepared folder's split has no shards (Energon's bare
    ``EmptyDatasetError`` otherwise), naming the dataset, the split, the splits that have shards and
    the fix."""
    empty = [(leaf, why) for leaf in tree.leaves if leaf.kind == "webdataset" for why in [empty_split(leaf)] if why]
    if empty:
        leaf = empty[0][0]
        redo = f"energon-nemotron prepare {leaf.path} --cooker {leaf.subflavors.get('cooker') or 'NAME'} " \
               "--reindex --split-ratio 8,1,1"
        within = "" if all(as_data_path(leaf.path) == as_data_path(path) for leaf, _ in empty) \
            else f"the data source {path}: "
        raise ConfigError(within + "; ".join(why for _, why in empty)
                          + f"; set the source's split to one that has shards, or split the shards again (`{redo}`)")


def check_source(path: Path, split: str, data: Optional[DataConfig] = None) -> Tree:
    """Check an Energon source before it is read (see the module docstring): a ``ConfigError`` for
    the tree or the subflavors, a ``DatasetError`` for damaged shards or indexes; the walked tree.
    ``data``: the config's data section (its cooker rules and ``other_subflavors``; None: defaults)."""
    root = as_data_path(path)
    folder = isinstance(root, RemotePath) and root.suffix not in (".yaml", ".yml", ".json", ".jsonl")
    with listed(root) if folder else contextlib.nullcontext():      # a folder on the store: one listing
        return _check_source(root, split, data)


def _check_source(path: DataPath, split: str, data: Optional[DataConfig]) -> Tree:
    tree = walk(path, split)
    _raise(ConfigError, f"the data source {path} cannot be read", tree.problems)
    _check_splits(path, tree)
    cooked = [leaf for leaf in tree.leaves if leaf.kind != "remote" and not leaf.joined]
    selection = CookerSelection() if data is None else cooker_selection(data)
    other = "error" if data is None else data.other_subflavors
    _raise(ConfigError, f"invalid subflavors in the data source {path}",
           [p for leaf in cooked for p in subflavor_problems(leaf, selection, other)])
    damaged = {leaf.path: leaf_problems(leaf) for leaf in tree.leaves if leaf.kind != "remote"}
    redo = [str(p) for p, found in damaged.items() if found]
    _raise(DatasetError, f"the data source {path} is damaged", [p for found in damaged.values() for p in found],
           "Restore any missing or damaged shard, then re-run `energon prepare` on: " + ", ".join(redo))
    return tree
