"""``energon-nemotron prepare``: WebDataset tar shards, or a ``.jsonl`` file, made an Energon
dataset whose cooker is chosen by name, without editing ``.nv-meta/dataset.yaml`` by hand.

A folder is indexed and split by Energon's own prepare (``BaseWebdatasetFactory.prepare_dataset``,
what ``energon prepare`` runs) as a crude dataset (``CrudeWebdataset``, the sample type cookers
read), and its ``dataset.yaml`` gets ``subflavors: {cooker: NAME}``: the file ``energon prepare
--sample-type CrudeWebdataset`` writes, plus the cooker. A folder prepared already keeps its index
and split (unless ``reindex``): only the cooker subflavor changes, the rest of its ``dataset.yaml``
stays. A ``.jsonl`` file gets Energon's JSONL index (``CrudeJsonlDatasetFactory.prepare_dataset``,
what ``energon prepare FILE.jsonl`` runs); it has no ``dataset.yaml``, so its cooker is named in the
loader config or in a metadataset (:meth:`Prepared.text` says how).
"""

from __future__ import annotations

import contextlib
import difflib
import io
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import yaml
from megatron.energon import BaseWebdatasetFactory, CrudeJsonlDatasetFactory, CrudeWebdataset

from energon_nemotron._energon import one_line_shard_failures
from energon_nemotron._energon.storage import DataPath, RemotePath, as_data_path, energon_path
from energon_nemotron.errors import ConfigError
from energon_nemotron.guards.energon_files import META, info_counts, unprepared
from energon_nemotron.registry import COOKERS

__all__ = ["PrepareOptions", "Prepared", "prepare_dataset", "check_cooker", "set_cooker", "DEFAULT_SPLIT_RATIO"]

#: the split of a folder's shards when neither ratio nor parts are given: all of them in train
DEFAULT_SPLIT_RATIO = "1,0,0"
#: Energon's split names, in the order of a ``train,val,test`` ratio
SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class PrepareOptions:
    """How a folder's shards are indexed and split (a ``.jsonl`` file reads none of these).

    ``split_ratio``: ``"TRAIN,VAL,TEST"`` weights of whole shards, in name order (None:
    :data:`DEFAULT_SPLIT_RATIO`); ``split_parts``: ``"SPLIT:PATTERN"`` entries instead (the shards
    whose path relative to the folder matches PATTERN, a regular expression after brace expansion);
    ``reindex``: index and split a prepared folder again; ``workers``: Energon's indexing processes."""

    split_ratio: Optional[str] = None
    split_parts: tuple[str, ...] = ()
    reindex: bool = False
    workers: int = 4
    progress: bool = True


@dataclass(frozen=True)
class Prepared:
    """What :func:`prepare_dataset` did: ``indexed`` (False: only the cooker of a prepared folder changed),
    the sample and shard counts, and Energon's own printed lines (``energon_output``)."""

    path: Path
    cooker: str
    jsonl: bool
    indexed: bool
    samples: int
    shards: int = 0
    energon_output: str = ""

    def text(self) -> str:
        """The summary ``energon-nemotron prepare`` prints."""
        if self.jsonl:
            return "\n".join([
                f"indexed {self.path}: {self.samples} samples ({self.path.name}.idx beside it)",
                "a .jsonl file has no dataset.yaml: name its cooker in the loader config,",
                f"  data: {{train: {{path: {self.path}}}, default_cooker: {self.cooker}}}",
                "or in its entry of a metadataset:",
                f"  {{path: {self.path}, subflavors: {{cooker: {self.cooker}}}}}"])
        done = "indexed" if self.indexed else "kept the index of"
        return (f"{done} {self.path}: {self.shards} shards, {self.samples} samples\n"
                f"wrote {self.path / META / 'dataset.yaml'}: subflavors.cooker = {self.cooker}")


def check_cooker(name: str) -> str:
    """``name`` if it is a registered cooker; else a ``ConfigError`` with the nearest name."""
    if name in COOKERS:
        return name
    close = difflib.get_close_matches(name, COOKERS.names(), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else "; `energon-nemotron cookers` lists them"
    raise ConfigError(f"unknown cooker {name!r}{hint}")


def _with_cooker(path: Path, cooker: str) -> dict:
    """The content of dataset.yaml ``path`` with ``subflavors.cooker`` set (a crude dataset's
    when there is no file yet), every other key kept; checked to be a crude dataset."""
    crude = {"__module__": "megatron.energon", "__class__": CrudeWebdataset.__name__}
    meta = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else crude
    if not isinstance(meta, dict):
        raise ConfigError(f"{path}: not a mapping; remove it and run prepare again to write a new one")
    if "sample_type" in meta or meta.get("__class__", crude["__class__"]) != crude["__class__"]:
        kind = meta.get("sample_type", meta.get("__class__"))
        raise ConfigError(f"{path}: the dataset's sample type is {kind!r}, not {crude['__class__']}: "
                          "a cooker reads crude samples only")
    subflavors = meta.get("subflavors") or {}
    if not isinstance(subflavors, dict):
        raise ConfigError(f"{path}: subflavors must be a mapping, got {type(subflavors).__name__}")
    return {**meta, "subflavors": {**subflavors, "cooker": cooker}}


def _unwritable(folder: DataPath, why: str) -> Optional[str]:
    """Why ``folder`` cannot take new files (a probe file or object is made and removed: a read-only
    mount, permissions, a full disk, refused credentials), naming it and ``why`` prepare writes
    there; None: it can."""
    if isinstance(folder, RemotePath):
        probe = folder / f".energon-nemotron-write-probe-{uuid.uuid4().hex}"
        try:
            probe.write_bytes(b"")
            probe.delete()
            return None
        except ConfigError as e:
            return f"{folder}: cannot write there ({e}), and prepare writes {why} there"
    try:
        with tempfile.TemporaryFile(dir=folder):
            return None
    except OSError as e:
        return f"{folder}: cannot write there ({e.strerror or type(e).__name__}), and prepare writes {why} there"


def check_writable(folder: DataPath, shards: tuple[str, ...] = ()) -> None:
    """A ``ConfigError`` unless prepare can write what it writes: ``.nv-meta/`` (``folder`` itself
    when it has none yet) and, to index ``shards`` (paths relative to ``folder``), an ``.idx`` beside
    each; checked before Energon runs, which would log a traceback per shard and then fail."""
    meta = folder / META
    needed = {meta: "the dataset's metadata (dataset.yaml, and its index and split files when it indexes)"} \
        if meta.is_dir() else {folder: f"the dataset's metadata folder {META}/"}
    for parent in sorted({(folder / s).parent for s in shards}):
        needed.setdefault(parent, "each shard's index (SHARD.tar.idx)")
    for path, why in needed.items():
        problem = _unwritable(path, why)
        if problem:
            raise ConfigError(f"{problem}; make it writable, or copy the dataset to a writable folder and prepare "
                              "the copy")


def _write(path: Path, meta: dict) -> None:
    """Write dataset.yaml ``path``; an ``OSError`` is a ``ConfigError`` naming the file."""
    try:
        path.write_bytes(yaml.safe_dump(meta, sort_keys=False).encode("utf-8"))
    except OSError as e:
        raise ConfigError(f"{path}: cannot write it ({e.strerror or type(e).__name__}); make {path.parent} writable, "
                          "or copy the dataset to a writable folder and prepare the copy") from None


def set_cooker(folder: Path, cooker: str) -> Path:
    """Write ``subflavors.cooker`` into ``folder``'s ``.nv-meta/dataset.yaml`` (a crude dataset's
    one when there is none yet), keeping every other key; returns the file."""
    path = Path(folder) / META / "dataset.yaml"
    meta = _with_cooker(path, check_cooker(cooker))
    _write(path, meta)
    return path


def _splits(options: PrepareOptions) -> dict:
    """The split keywords of Energon's prepare: a ratio per split name, or patterns."""
    if options.split_parts:
        if options.split_ratio is not None:
            raise ConfigError("give --split-ratio or --split-parts, not both")
        bad = [p for p in options.split_parts if ":" not in p or not p.split(":", 1)[1]]
        if bad:
            raise ConfigError(f"--split-parts {bad[0]!r}: write SPLIT:PATTERN, e.g. 'train:parts/data-{{0..6}}.tar'")
        return {"split_parts_patterns": [tuple(p.split(":", 1)) for p in options.split_parts]}
    text = options.split_ratio or DEFAULT_SPLIT_RATIO
    try:
        ratio = [float(x) for x in text.split(",")]
    except ValueError:
        ratio = []
    if len(ratio) != len(SPLITS) or min(ratio) < 0 or sum(ratio) <= 0:
        raise ConfigError(f"--split-ratio {text!r}: write three weights TRAIN,VAL,TEST, e.g. 8,1,1 or 1,0,0")
    return {"split_parts_ratio": list(zip(SPLITS, ratio))}


def _energon_prepare(call, *args, **kwargs) -> tuple[object, str]:
    """Run one of Energon's prepare functions: (what it returns, the lines it printed); a stop
    (Energon exits on duplicate sample keys) or a failed assertion becomes a ``ConfigError``."""
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), one_line_shard_failures():
            result = call(*args, **kwargs)
    except (SystemExit, AssertionError) as e:
        said = " ".join(out.getvalue().split()[:40]) or " ".join(str(e).split())[:300]
        raise ConfigError(f"{args[0]}: Energon's prepare stopped: {said}") from None
    return result, out.getvalue()


def _progress(enabled: bool):
    def progress_fn(items, length=None):
        from tqdm import tqdm

        return iter(tqdm(items, total=length, desc="indexing shards", unit="shard", disable=not enabled))

    return progress_fn


def _index_folder(folder: Path, options: PrepareOptions) -> str:
    """Energon's index and split of every ``.tar``/``.tgz`` shard under ``folder``; its printed lines."""
    splits = _splits(options)
    if options.workers < 1:
        raise ConfigError(f"--num-workers {options.workers}: Energon indexes with at least one process")
    shards = sorted(_shard_names(folder))
    if not shards:
        raise ConfigError(f"{folder}: no .tar shards in it or below it; write the samples as WebDataset "
                          "tar shards first (docs/tutorial.md)")
    check_writable(folder, tuple(shards))
    return _energon_prepare(BaseWebdatasetFactory.prepare_dataset, energon_path(folder), shards, shuffle_seed=None,
                            workers=options.workers, progress_fn=_progress(options.progress), **splits)[1]


def _shard_names(folder: DataPath) -> list[str]:
    """The ``.tar``/``.tgz`` shards at any depth under ``folder``, relative to it (a folder on the
    store: one listing)."""
    if isinstance(folder, RemotePath):
        return [p.url[len(folder.url) + 1:] for p in folder.glob("**") if p.name.endswith((".tar", ".tgz"))]
    return [p.relative_to(folder).as_posix() for pattern in ("*.tar", "*.tgz") for p in folder.rglob(pattern)]


def _prepare_folder(folder: DataPath, cooker: str, options: PrepareOptions) -> Prepared:
    indexed = unprepared(folder) is None
    if indexed and not options.reindex and (options.split_ratio is not None or options.split_parts):
        raise ConfigError(f"{folder} is prepared already: add --reindex to index and split its shards again")
    dataset_yaml = folder / META / "dataset.yaml"
    meta = _with_cooker(dataset_yaml, cooker)               # checked before Energon writes anything
    check_writable(folder)
    output = ""
    if options.reindex or not indexed:
        output = _index_folder(folder, options)
    _write(dataset_yaml, meta)
    counts = info_counts(folder / META)[1]
    return Prepared(folder, cooker, jsonl=False, indexed=options.reindex or not indexed,
                    samples=sum(counts.values()), shards=len(counts), energon_output=output)


def prepare_dataset(path: Path | str, cooker: str, options: PrepareOptions = PrepareOptions()) -> Prepared:
    """Prepare ``path`` (a folder of WebDataset tar shards, or a ``.jsonl`` file) for cooker
    ``cooker`` (see the module docstring); every problem is a one-line ``ConfigError``."""
    path = as_data_path(path)
    check_cooker(cooker)
    if path.is_dir():
        return _prepare_folder(path, cooker, options)
    if path.is_file() and path.name.endswith(".jsonl"):
        if options.split_ratio is not None or options.split_parts or options.reindex:
            raise ConfigError(f"{path}: a .jsonl file has no shards to split (--split-ratio, --split-parts "
                              "and --reindex apply to a folder)")
        problem = _unwritable(path.parent, f"the file's index ({path.name}.idx)")
        if problem:
            raise ConfigError(f"{problem}; make it writable, or copy the file to a writable folder and prepare the copy")
        count, output = _energon_prepare(CrudeJsonlDatasetFactory.prepare_dataset, energon_path(path))
        return Prepared(path, cooker, jsonl=True, indexed=True, samples=int(count), energon_output=output)
    if not path.exists():
        raise ConfigError(f"{path} does not exist")
    raise ConfigError(f"{path}: give a folder of WebDataset .tar shards or a .jsonl file")
