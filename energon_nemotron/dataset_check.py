"""What the loader reads about an Energon data source at start: its tree of (meta)datasets, the
subflavors that reach the cookers, and the files that determine the stream.

A source is a prepared dataset folder (``.nv-meta/``: ``dataset.yaml``, ``split.yaml``, ``.info.json``
or ``.info.yaml``, ``index.uuid``; shards ``*.tar`` with ``*.tar.idx``), a prepared ``.jsonl`` (with
its ``.jsonl.idx``) or a metadataset YAML (``Metadataset`` / ``MetadatasetV2``: per split a dataset
reference, a ``blend``, a ``blend_epochized`` or a ``join``; a reference's ``path`` is relative to its
YAML and may name a nested metadataset). :func:`walk` follows it as Energon does: a reference's
``split_part`` applies below it; subflavors merge down, an outer reference's overriding an inner one's,
and both overriding the leaf's own ``dataset.yaml`` subflavors.

At start (:func:`check_source`, before Energon builds anything): every referenced dataset exists and
is prepared; every leaf's merged subflavors name a registered cooker (or ``data.default_cooker``
applies) and hold only keys that cooker reads, with values of the declared type
(``cookers.base.COOKER_SUBFLAVORS``); every shard and index agrees with ``.info`` (``shard_check``).
:func:`stream_digests` hashes the files that determine the stream, for the resume fingerprint.
"""

from __future__ import annotations

import difflib
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from energon_nemotron.errors import ConfigError

META = ".nv-meta"
INFO_FILES = (".info.json", ".info.yaml")
BLENDS = ("blend", "blend_epochized", "datasets")   # V2 blends; V1 ``datasets``
MAX_LISTED = 12


@dataclass
class Leaf:
    """A dataset the stream reads: ``kind`` is ``webdataset`` (a prepared folder), ``jsonl`` or
    ``remote`` (a URL, not checked here). ``origin`` maps each subflavor key to the file that set its
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


def load_yaml_file(path: Path) -> Any:
    """A YAML file parsed as Energon parses it (rapidyaml via ``megatron.energon.eyaml``)."""
    from megatron.energon.eyaml import load_yaml

    return load_yaml(path.read_bytes())


def walk(path: Path, split: str) -> Tree:
    """The tree below ``path`` for ``split``; problems are collected, not raised."""
    tree = Tree()
    _reference(tree, Path(path), split, {}, {}, None, {}, False, ())
    return tree


def _reference(tree: Tree, path: Path, split: str, subflavors: dict, origin: dict, where: Optional[Path],
               configs: dict, joined: bool, stack: tuple) -> None:
    """A dataset, a .jsonl or a nested metadataset, referenced from ``where`` (None: the loader
    config); ``configs``: the reference's ``dataset_config`` / ``split_config`` file names."""
    by = f"{where}: " if where else "data path: "
    if "://" in str(path):
        tree.leaves.append(Leaf(path, "remote", split, dict(subflavors), dict(origin), joined=joined))
        return
    if path.is_file() and path.name.endswith(".jsonl"):
        tree.leaves.append(Leaf(path, "jsonl", split, dict(subflavors), dict(origin), joined=joined))
        tree.files.append(path.with_name(path.name + ".idx"))
    elif path.is_file() and path.name.endswith(".yaml"):
        if path.resolve() in stack:
            tree.problems.append(f"{by}metadataset {path} includes itself")
        else:
            _metadataset(tree, path, split, subflavors, origin, stack + (path.resolve(),))
    elif path.is_dir() and any((path / META / name).is_file() for name in INFO_FILES):
        _webdataset(tree, path, split, subflavors, origin, configs, joined)
    elif path.is_dir():
        tree.problems.append(f"{by}{path} is not a prepared Energon dataset (no {META}/.info.json): run "
                             f"`energon prepare {path}`")
    elif path.exists():
        tree.problems.append(f"{by}{path} is neither a dataset folder, a .jsonl nor a metadataset .yaml")
    else:
        tree.problems.append(f"{by}dataset {path} does not exist" + (" (paths in a metadataset are relative "
                                                                     "to its folder)" if where else ""))


def _webdataset(tree: Tree, path: Path, split: str, subflavors: dict, origin: dict, configs: dict,
                joined: bool) -> None:
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
    merged = {**own, **subflavors}
    where = {**{k: config for k in own}, **origin}
    tree.leaves.append(Leaf(path, "webdataset", split, merged, where, split_config, joined))
    splits = meta / split_config
    if split_config == "split.yaml" and not splits.is_file() and (meta / "split.json").is_file():
        splits = meta / "split.json"
    info = next((meta / n for n in INFO_FILES if (meta / n).is_file()), meta / INFO_FILES[0])
    tree.files += [config, splits, info, meta / "index.uuid"]


def _metadataset(tree: Tree, path: Path, split: str, subflavors: dict, origin: dict, stack: tuple) -> None:
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
    if split not in splits:
        tree.problems.append(f"{path}: no split {split!r} (splits: {', '.join(map(str, splits))}); set the "
                             "data source's split")
        return
    _node(tree, path, splits[split], split, subflavors, origin, stack, False)


def _node(tree: Tree, path: Path, node: Any, split: str, subflavors: dict, origin: dict, stack: tuple,
          joined: bool) -> None:
    """One entry of metadataset ``path``: a blend (its entries), a join, or a reference."""
    if not isinstance(node, dict):
        tree.problems.append(f"{path}: split {split!r}: expected a mapping, got {node!r:.80}")
        return
    blend = next((k for k in BLENDS if k in node), None)
    if blend is not None:
        entries = node[blend]
        if not isinstance(entries, list):
            tree.problems.append(f"{path}: `{blend}` must be a list")
            return
        for entry in entries:
            _node(tree, path, entry, split, subflavors, origin, stack, joined)
        return
    own = node.get("subflavors") or {}
    if not isinstance(own, dict):
        tree.problems.append(f"{path}: subflavors must be a mapping, got {own!r:.80}")
        return
    if node.get("subflavor") is not None and "__subflavor__" not in own:     # V1 legacy key
        own = {"__subflavor__": node["subflavor"], **own}
    merged = {**own, **subflavors}
    where = {**{k: path for k in own}, **origin}
    split = node.get("split_part") or split
    if "join" in node:
        parts = node["join"]
        parts = list(parts.values()) if isinstance(parts, dict) else parts
        for part in parts if isinstance(parts, list) else []:
            _node(tree, path, part, split, merged, where, stack, True)
        return
    if "path" not in node:
        tree.problems.append(f"{path}: split {split!r}: an entry with none of path, blend, blend_epochized, "
                             f"join: {node!r:.120}")
        return
    target = node["path"]
    target = Path(target) if "://" in str(target) else path.parent / str(target)
    configs = {k: node.get(k) for k in ("dataset_config", "split_config")}
    _reference(tree, target, split, merged, where, path, configs, joined, stack)


def _type_name(t: type) -> str:
    return {bool: "true or false", str: "a string", int: "an integer", float: "a number"}.get(t, t.__name__)


def _has_type(value: Any, t: type) -> bool:
    if t is bool:
        return isinstance(value, bool)
    if t in (int, float):
        return isinstance(value, (int, float) if t is float else int) and not isinstance(value, bool)
    return isinstance(value, t)


def subflavor_problems(leaf: Leaf, default_cooker: Optional[str]) -> list[str]:
    """What is wrong with the subflavors that reach a leaf's cooker (empty: nothing)."""
    from energon_nemotron.cookers.base import COOKER_SUBFLAVORS, subflavor_keys
    from energon_nemotron.registry import COOKERS

    sub, out = leaf.subflavors, []
    named = leaf.origin.get("cooker", leaf.path)
    if "cooker" not in sub:
        if default_cooker is None:
            return [f"{leaf.path}: the dataset's subflavors name no registered cooker; set subflavors: "
                    f"{{cooker: NAME}} in its {META}/dataset.yaml or metadataset, or data.default_cooker in "
                    f"the loader config (cookers: {', '.join(COOKERS.names())})"]
        cooker = default_cooker
    else:
        cooker = sub["cooker"]
        if not isinstance(cooker, str) or cooker not in COOKERS:
            close = difflib.get_close_matches(str(cooker), COOKERS.names(), n=1)
            return [f"{named}: subflavor cooker: {cooker!r} (dataset {leaf.path}): the subflavors name no "
                    f"registered cooker; known: {', '.join(COOKERS.names())}"
                    + (f"; did you mean {close[0]!r}?" if close else "")]
    keys = subflavor_keys(cooker)
    every = sorted({k for c in COOKERS.names() for k in subflavor_keys(c)} | set(COOKER_SUBFLAVORS.get(cooker, {})))
    for key, value in sub.items():
        file = leaf.origin.get(key, leaf.path)
        if isinstance(key, str) and key.startswith("__") and key.endswith("__"):
            continue                                             # Energon's own (e.g. __subflavor__)
        if key not in keys:
            readers = [c for c in COOKERS.names() if key in subflavor_keys(c)]
            if readers:
                out.append(f"{file}: subflavor {key!r} (dataset {leaf.path}) is read only by the cooker(s) "
                           f"{', '.join(readers)}, not by this dataset's cooker {cooker!r}; remove it")
                continue
            close = difflib.get_close_matches(str(key), sorted(keys), n=1) or \
                difflib.get_close_matches(str(key), every, n=1)
            out.append(f"{file}: unknown subflavor {key!r} (dataset {leaf.path}, cooker {cooker!r}); valid keys: "
                       f"{', '.join(sorted(keys))}" + (f"; did you mean {close[0]!r}?" if close else ""))
        elif not _has_type(value, keys[key]):
            out.append(f"{file}: subflavor {key!r} (dataset {leaf.path}) must be {_type_name(keys[key])}, got "
                       f"{value!r} ({type(value).__name__})" + ("; write it unquoted" if keys[key] is bool else ""))
    return out


def _raise(kind: type, what: str, problems: list[str], fix: str = "") -> None:
    if problems:
        unique = list(dict.fromkeys(problems))
        listed = unique[:MAX_LISTED] + ([f"... and {len(unique) - MAX_LISTED} more"] if len(unique) > MAX_LISTED else [])
        raise kind(f"{what}:\n  " + "\n  ".join(listed) + (f"\n{fix}" if fix else ""))


def check_source(path: Path, split: str, default_cooker: Optional[str]) -> Tree:
    """Check an Energon source before it is read (see the module docstring): a ``ConfigError`` for
    the tree or the subflavors, a ``DatasetError`` for damaged shards or indexes."""
    from energon_nemotron.errors import DatasetError
    from energon_nemotron.shard_check import leaf_problems

    tree = walk(Path(path), split)
    _raise(ConfigError, f"the data source {path} cannot be read", tree.problems)
    cooked = [leaf for leaf in tree.leaves if leaf.kind != "remote" and not leaf.joined]
    _raise(ConfigError, f"invalid subflavors in the data source {path}",
           [p for leaf in cooked for p in subflavor_problems(leaf, default_cooker)])
    damaged = {leaf.path: leaf_problems(leaf) for leaf in tree.leaves if leaf.kind != "remote"}
    redo = [str(p) for p, found in damaged.items() if found]
    _raise(DatasetError, f"the data source {path} is damaged", [p for found in damaged.values() for p in found],
           "Restore any missing or damaged shard, then re-run `energon prepare` on: " + ", ".join(redo))
    return tree


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
    what cannot be followed is left to :func:`check_source`."""
    if path is None:
        return {}
    files = dict.fromkeys(p.resolve() for p in walk(Path(path), split).files)
    return {f"{prefix} file {p}": file_sha256(p) for p in files}
