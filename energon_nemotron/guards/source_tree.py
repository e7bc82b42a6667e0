"""An Energon data source as a tree: its (meta)datasets, the subflavors that reach the cookers, and
the files that determine the stream.

A source is a prepared dataset folder (``.nv-meta/``: ``dataset.yaml``, ``split.yaml``, ``.info.json``
or ``.info.yaml``, ``index.uuid``; shards ``*.tar`` with ``*.tar.idx``), a prepared ``.jsonl`` (with
its ``.jsonl.idx``) or a metadataset YAML (``Metadataset`` / ``MetadatasetV2``: per split a dataset
reference, a ``blend``, a ``blend_epochized`` or a ``join``; a reference's ``path`` is relative to its
YAML and may name a nested metadataset). :func:`walk` follows it as Energon does: a reference's
``split_part`` applies below it; subflavors merge down, an outer reference's overriding an inner one's,
and both overriding the leaf's own ``dataset.yaml`` subflavors.

What cannot be followed (a reference that does not exist or is not prepared, a malformed
metadataset) is collected as a problem, not raised: ``loading.preflight.check_source`` reports
them, with the subflavor checks (``cookers.subflavors``) and the shard checks (``guards.shards``),
before Energon builds anything. :func:`stream_digests` hashes the files that determine the stream,
for the resume fingerprint.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from energon_nemotron._energon import index_file
from energon_nemotron._energon.storage import (READ_SCHEMES, DataPath, RemotePath, as_data_path,
                                              data_location, is_url, read_range)
from energon_nemotron.guards.energon_files import META, info_file, load_yaml_file, split_file, unprepared

BLENDS = ("blend", "blend_epochized", "datasets")   # V2 blends; V1 ``datasets``


@dataclass
class Leaf:
    """A dataset the stream reads: ``kind`` is ``webdataset`` (a prepared folder), ``jsonl`` or
    ``remote`` (a URL of a scheme not read here, not checked). An ``msc://`` one is checked as a
    local one is, through Energon's path layer. ``origin`` maps each subflavor key to the file that set its
    value; ``joined`` leaves feed a ``join`` (read by its joiner, not by a cooker)."""

    path: Path
    kind: str
    split: str
    subflavors: dict = field(default_factory=dict)
    origin: dict = field(default_factory=dict)
    split_config: str = "split.yaml"
    joined: bool = False


@dataclass
class Tree:
    """A walked source: its leaves, the files that determine the stream (metadataset YAMLs and each
    leaf's metadata, in walk order) and what could not be followed (one message each)."""

    leaves: list = field(default_factory=list)
    files: list = field(default_factory=list)
    problems: list = field(default_factory=list)


@dataclass(frozen=True)
class _Scope:
    """What a reference inherits from the references above it: the split (a ``split_part`` applies
    below it), the subflavors merged so far and the file that set each (``origin``), the
    metadatasets being walked (``stack``, resolved: a cycle is a problem) and whether it feeds a
    ``join``."""

    split: str
    subflavors: dict = field(default_factory=dict)
    origin: dict = field(default_factory=dict)
    stack: tuple = ()
    joined: bool = False

    def leaf(self, path: Path, kind: str) -> Leaf:
        return Leaf(path, kind, self.split, dict(self.subflavors), dict(self.origin), joined=self.joined)


def walk(path: Path, split: str) -> Tree:
    """The tree below ``path`` for ``split``; problems are collected, not raised."""
    tree = Tree()
    _reference(tree, as_data_path(path), _Scope(split), None, {})
    return tree


def _reference(tree: Tree, path: Path, scope: _Scope, where: Optional[Path], configs: dict) -> None:
    """A dataset, a .jsonl or a nested metadataset, referenced from ``where`` (None: the loader
    config); ``configs``: the reference's ``dataset_config`` / ``split_config`` file names."""
    by = f"{where}: " if where else "data path: "
    if isinstance(path, RemotePath) and path.url.split("://", 1)[0] not in READ_SCHEMES:
        tree.leaves.append(scope.leaf(path, "remote"))
        return
    problem = unprepared(path, jsonl_index=False)      # a .jsonl's index: checked with its shards
    if problem is not None:
        kind, why = problem
        fix = {"unprepared": f": run `energon prepare {path}`",
               "missing": " (paths in a metadataset are relative to its folder)" if where else ""}.get(kind, "")
        tree.problems.append(f"{by}{'dataset ' if kind == 'missing' else ''}{path} {why}{fix}")
    elif path.name.endswith(".jsonl"):
        tree.leaves.append(scope.leaf(path, "jsonl"))
        tree.files.append(path.with_name(path.name + ".idx"))
    elif path.name.endswith(".yaml"):
        if path.resolve() in scope.stack:
            tree.problems.append(f"{by}metadataset {path} includes itself")
        else:
            _metadataset(tree, path, replace(scope, stack=scope.stack + (path.resolve(),), joined=False))
    else:
        _webdataset(tree, path, scope, configs)


def _webdataset(tree: Tree, path: Path, scope: _Scope, configs: dict) -> None:
    meta = path / META
    own: Any = {}
    config = meta / (configs.get("dataset_config") or "dataset.yaml")
    split_config = configs.get("split_config") or "split.yaml"
    try:
        own = (load_yaml_file(config) or {}).get("subflavors") or {}
    except FileNotFoundError:
        tree.problems.append(f"{config} is missing: re-run `energon prepare {path}`")
    except Exception as e:
        tree.problems.append(f"{config} cannot be read ({type(e).__name__}: {e}); fix it or re-run `energon prepare`")
    if not isinstance(own, dict):
        tree.problems.append(f"{config}: subflavors must be a mapping, got {own!r}")
        own = {}
    merged = {**own, **scope.subflavors}
    where = {**{k: config for k in own}, **scope.origin}
    tree.leaves.append(Leaf(path, "webdataset", scope.split, merged, where, split_config, scope.joined))
    tree.files += [config, split_file(meta, split_config), info_file(meta), meta / "index.uuid"]


def _metadataset(tree: Tree, path: Path, scope: _Scope) -> None:
    tree.files.append(path)
    try:
        data = load_yaml_file(path)
    except Exception as e:
        tree.problems.append(f"{path}: the metadataset cannot be read ({type(e).__name__}: {e})")
        return
    splits = data.get("splits") if isinstance(data, dict) else None
    if not isinstance(splits, dict):
        tree.problems.append(f"{path}: a metadataset needs `splits:` (a mapping of split names)")
        return
    split = scope.split
    if split not in splits:
        tree.problems.append(f"{path}: no split {split!r} (splits: {', '.join(map(str, splits))}); set the "
                             "data source's split")
        return
    _node(tree, path, splits[split], scope)


def _node(tree: Tree, path: Path, node: Any, scope: _Scope) -> None:
    """One entry of metadataset ``path``: a blend (its entries), a join, or a reference."""
    if not isinstance(node, dict):
        tree.problems.append(f"{path}: split {scope.split!r}: expected a mapping, got {node!r:.80}")
        return
    blend = next((k for k in BLENDS if k in node), None)
    if blend is not None:
        entries = node[blend]
        if not isinstance(entries, list):
            tree.problems.append(f"{path}: `{blend}` must be a list")
            return
        for entry in entries:
            _node(tree, path, entry, scope)
        return
    own = node.get("subflavors") or {}
    if not isinstance(own, dict):
        tree.problems.append(f"{path}: subflavors must be a mapping, got {own!r:.80}")
        return
    if node.get("subflavor") is not None and "__subflavor__" not in own:     # V1 legacy key
        own = {"__subflavor__": node["subflavor"], **own}
    below = replace(scope, split=node.get("split_part") or scope.split, subflavors={**own, **scope.subflavors},
                    origin={**{k: path for k in own}, **scope.origin})
    if "join" in node:
        parts = node["join"]
        parts = list(parts.values()) if isinstance(parts, dict) else parts
        for part in parts if isinstance(parts, list) else []:
            _node(tree, path, part, replace(below, joined=True))
        return
    if "path" not in node:
        tree.problems.append(f"{path}: split {below.split!r}: an entry with none of path, blend, blend_epochized, "
                             f"join: {node!r:.120}")
        return
    target = node["path"]
    target = as_data_path(str(target)) if is_url(str(target)) else path.parent / str(target)
    tree.problems += aux_problems(path, node.get("aux"))
    configs = {k: node.get(k) for k in ("dataset_config", "split_config")}
    _reference(tree, target, below, path, configs)


#: the first bytes of an SQLite database file
SQLITE_HEADER = b"SQLite format 3\x00"


def _aux_location(metadataset: Path, text: str) -> DataPath:
    """Where an aux source's path points: an ``msc://`` location, else a local path (relative to
    the metadataset's folder). ``ValueError`` naming another scheme."""
    where = data_location(text)
    if isinstance(where, str):
        return as_data_path(where)
    return where if where.is_absolute() else metadataset.parent / where


def aux_problems(path: Path, aux: Any) -> list[str]:
    """What is wrong with a dataset reference's ``aux`` sources in metadataset ``path`` (each named):
    a ``filesystem://`` folder that does not exist, a prepared dataset without a readable
    ``.nv-meta/index.sqlite``, a scheme that is not read, a store that cannot be read. Sources on
    object storage (``msc://``, ``filesystem://msc://``) are checked on the store: a listing, or a
    metadata request and a 16-byte ranged read of the index."""
    if aux is None:
        return []
    if not isinstance(aux, dict):
        return [f"{path}: aux must map names to sources, got {aux!r:.80}"]
    out = []
    for name, source in aux.items():
        where = f"{path}: aux source {name!r} ({source!r})"
        if not isinstance(source, str) or not source:
            out.append(f"{where}: expected a path, or filesystem://FOLDER")
            continue
        try:
            problem = _aux_problem(path, source)
        except ValueError as e:                 # ConfigError (the store) or ValueError (the scheme)
            problem = str(e)
        if problem:
            out.append(f"{where}: {problem}")
    return out


def _aux_problem(metadataset: Path, source: str) -> Optional[str]:
    """What is wrong with one aux source (None: nothing)."""
    if source.startswith("filesystem://"):
        folder = _aux_location(metadataset, source[len("filesystem://"):])
        return None if folder.is_dir() else f"the folder {folder} does not exist"
    folder = _aux_location(metadataset, source)
    index = index_file(folder / META)
    try:
        header = read_range(index, 0, len(SQLITE_HEADER)) if index.is_file() else None
    except OSError:
        header = None
    if header is None:
        kind = "is not a prepared dataset" if folder.is_dir() else "does not exist"
        return (f"{folder} {kind} (no {META}/{index.name}): run `energon prepare` on it, or name a plain folder "
                "as filesystem://FOLDER")
    if header != SQLITE_HEADER:
        return f"{index} is not an SQLite index (damaged): re-run `energon prepare` on {folder}"
    return None


def file_sha256(path: Path) -> Optional[str]:
    """sha256 of a file (None when it does not exist); a YAML or JSON file is hashed by its parsed
    content, so comments and layout do not count."""
    import json

    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    if path.suffix in (".yaml", ".json"):
        try:
            parsed = json.loads(data) if path.suffix == ".json" else load_yaml_file(path)
            data = json.dumps(parsed, sort_keys=True, default=str).encode()
        except Exception:
            pass
    return hashlib.sha256(data).hexdigest()


def stream_digests(prefix: str, path: Optional[Path], split: str = "train") -> dict[str, Optional[str]]:
    """Fingerprint entries ``"{prefix} file {path}": sha256`` for every file that determines the stream
    of an Energon source: each metadataset YAML of the tree, and per leaf its ``dataset.yaml``,
    split file, ``.info`` file and ``index.uuid`` (a ``.jsonl``: its ``.jsonl.idx``); YAML and JSON by
    content (:func:`file_sha256`). Never raises:
    what cannot be followed is left to ``loading.preflight.check_source``."""
    if path is None:
        return {}
    files = dict.fromkeys(p.resolve() for p in walk(as_data_path(path), split).files)
    return {f"{prefix} file {p}": file_sha256(p) for p in files}
