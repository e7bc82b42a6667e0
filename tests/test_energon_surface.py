"""Energon's private surface (``energon_nemotron._energon``), held to the installed Energon.

Two kinds of check:

- a static guard: no module of the library outside ``energon_nemotron/_energon/`` imports a name
  Energon does not export, or names one of Energon's private attributes, saved-state keys,
  restore-key tokens or message strings (and the surface itself does use each of them, so the list
  stays honest); ``check_version`` holds the supported range;
- every accessor of ``_energon.__all__`` run against the real thing: datasets written and prepared
  with the real ``energon prepare``, built by Energon's own ``get_train_dataset`` / the library's
  ``build_train_loader`` (0 and 1 worker), their batches, restore keys and saved states, and the
  errors Energon itself raises. An Energon upgrade that moves any of it fails here, naming the
  accessor (docs/energon_surface.md says what to do then).
"""

from __future__ import annotations

import ast
import builtins
import gc
import importlib
import inspect
import json
import os
import re
import sqlite3
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

import megatron.energon
import megatron.energon.errors as energon_errors
from megatron.energon import (DefaultCrudeJsonlDatasetFactory, MapDataset, SourceInfo, WorkerConfig,
                              get_train_dataset, load_dataset, stateless)

import energon_nemotron._energon as surface
import energon_nemotron.guards.jsonl_guard as jsonl_guard
from energon_data import energon, tar_keys, text_config
from energon_nemotron._energon import (LEAF, SELECTORS, SUPPORTED, BufferContext, CarryingPackingDataset, DatasetHook,
                                       WrapperDataset, add_source_info, packing_stage,
                                       basic_loader, batch_worker, check_version, empty_leaf_sample,
                                       empty_worker_checkpoint, filesystem_entry, filter_leaf_samples,
                                       guard_jsonl_lines, indexed_sample_key, initial_worker_checkpoints,
                                       inner_datasets, is_leaf, is_loader_state, is_no_cooker_error,
                                       is_weighted_blend_error, is_worker_checkpoint, is_wrapper, leaf_epoch,
                                       leaf_readers, leaf_shuffle_over_epochs, leaf_size, leaf_worker_slices,
                                       load_yaml, names_samples, one_line_shard_failures, quiet_error_prints, quiet_progress, raw_sample_key, set_nvdataset_cache_dir,
                                       read_leaf_sample, reader_jsonl, reader_location, reader_position,
                                       pass_in_restore_keys, sample_index, sample_pass, sample_refs, savable_fields, saved_class, saved_inner,
                                       saved_leaf_epoch, saved_leaf_slices, saves, set_default_failure_tolerance,
                                       stage_error_context, stage_failure_tolerance, store_entry_names, entry_size, index_file,
                                       remote_entry_range,
                                       store_kind, store_local_base, webdataset_entry, worker_dataset_state,
                                       shutdown_workers, worker_root, worker_sample_counters, wrap_leaf_readers)
from energon_nemotron.demo.conversations import make_conversations
from energon_nemotron.demo.datasets import text_dataset
from energon_nemotron.errors import ConfigError, DataError
from energon_nemotron.loading import build_task_encoder, build_train_loader

PACKAGE = Path(surface.__file__).resolve().parent.parent          # energon_nemotron/
SURFACE = Path(surface.__file__).resolve().parent                  # energon_nemotron/_energon/

N_A, N_B = 20, 8            # samples of the two prepared tar datasets
PER_SHARD = 6               # dataset a: shards of 6, 6, 6, 2 samples
DEEP_LINE = 2               # the line of the prepared .jsonl nested far past json.loads' recursion limit

# -- the static guard --------------------------------------------------------------------------------

#: Energon's private identifiers: attributes, methods, saved-state keys (none may appear outside
#: the surface as a name, an attribute, a definition, a keyword or a string)
PRIVATE_NAMES = ("_get_sample", "_epoch_count", "_pending_slice_indexes", "_active_slice_state",
                 "_pending_slices_offset", "_worker_sample_counters", "join_readers", "_load_dataset",
                 "_savable_fields", "workers_slice_offsets", "shard_count_cumsum", "shard_infos", "_load_sample",
                 "__default_failure_tolerance__", "get_initial_checkpoint", "sqlite_reader", "db_has_sample_parts",
                 "list_all_sample_parts", "_shutdown_workers")
#: Energon's message strings, restore-key tokens, class names and file names (in a string constant)
PRIVATE_STRINGS = ("Cannot blend with dataset weights", "No cooker found", "Webdataset", "SavableDatasetWrapper",
                   "WebdatasetSampleLoaderDataset", "index.sqlite")
#: Energon methods that may be defined (a wrapper implements them) but never replaced on an instance
PRIVATE_ASSIGNED = ("restore_sample",)


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring constants of a module and of its classes and functions."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                out.add(id(first.value))
    return out


def _in_text(token: str, text: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(token)}(?!\w)", text) is not None


def private_uses(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, item)`` for every private identifier, string or instance replacement in ``tree``."""
    docs, found = _docstrings(tree), []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        names: list[str] = []
        if isinstance(node, ast.Attribute):
            names = [node.attr]
            if node.attr in PRIVATE_ASSIGNED and isinstance(node.ctx, ast.Store):
                found.append((line, node.attr))
        elif isinstance(node, ast.Name):
            names = [node.id]
            if node.id in PRIVATE_ASSIGNED and isinstance(node.ctx, ast.Store):
                found.append((line, node.id))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, (ast.arg, ast.keyword)):
            names = [node.arg] if node.arg else []
        elif isinstance(node, ast.alias):
            names = [node.name.rsplit(".", 1)[-1], node.asname or ""]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                and node.args[1].value in PRIVATE_ASSIGNED:
            found.append((line, node.args[1].value))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            found += [(line, token) for token in PRIVATE_NAMES + PRIVATE_STRINGS if _in_text(token, node.value)]
        found += [(line, name) for name in names if name in PRIVATE_NAMES]
    return found


def _public_in(module: str, name: str) -> bool:
    """Whether ``name`` is exported by ``module`` (its ``__all__``; a module without one exports nothing)."""
    exported = getattr(importlib.import_module(module), "__all__", None)
    return exported is not None and name in exported


def _public_path(dotted: str) -> bool:
    """Whether ``megatron.energon.A.B...`` reaches only exported names: each step is in the current
    module's ``__all__`` (then anything below it is public), or a submodule that has an ``__all__``."""
    module = "megatron.energon"
    for part in dotted.split(".")[2:]:
        if _public_in(module, part):
            return True
        try:
            importlib.import_module(f"{module}.{part}")
        except ImportError:
            return False
        module = f"{module}.{part}"
    return getattr(importlib.import_module(module), "__all__", None) is not None


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([aliases.get(node.id, node.id), *reversed(parts)])


def private_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, what)`` for every import of (and dotted access to) a name Energon does not export."""
    found, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("megatron.energon."):
                    if not _public_path(alias.name):
                        found.append((node.lineno, f"import {alias.name}"))
                if alias.asname and alias.name.startswith("megatron.energon"):
                    aliases[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            module = node.module
            if module == "megatron":
                aliases.update({a.asname or a.name: f"megatron.{a.name}" for a in node.names if a.name == "energon"})
            elif module == "megatron.energon" or module.startswith("megatron.energon."):
                for alias in node.names:
                    if not _public_in(module, alias.name):
                        found.append((node.lineno, f"from {module} import {alias.name}"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            dotted = _dotted(node, aliases)
            if dotted and dotted.startswith("megatron.energon.") and not _public_path(dotted):
                found.append((node.lineno, dotted))
    return found


def library_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if SURFACE not in p.parents)


def test_no_private_energon_surface_outside_energon_nemotron_energon():
    problems = []
    for path in library_files():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        where = path.relative_to(PACKAGE.parent)
        problems += [f"{where}:{line}: imports {what}, which Energon does not export"
                     for line, what in private_imports(tree)]
        problems += [f"{where}:{line}: uses Energon's private {what!r}" for line, what in private_uses(tree)]
    assert len(library_files()) > 50
    assert not problems, ("Energon's private surface belongs in energon_nemotron/_energon/ "
                          "(docs/energon_surface.md):\n" + "\n".join(sorted(set(problems))))


def test_the_forbidden_list_is_what_the_surface_uses():
    """Each forbidden item occurs in the surface's own modules (a stale entry would guard nothing);
    the surface imports private Energon modules (the guard sees those too)."""
    used, imports = set(), []
    for path in sorted(SURFACE.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        used |= {what for _, what in private_uses(tree)}
        imports += [what for _, what in private_imports(tree)]
    assert set(PRIVATE_NAMES + PRIVATE_STRINGS + PRIVATE_ASSIGNED) <= used, \
        sorted(set(PRIVATE_NAMES + PRIVATE_STRINGS + PRIVATE_ASSIGNED) - used)
    assert "from megatron.energon.savable_loader import BasicDataLoader" in imports
    assert "from megatron.energon import SourceInfo" not in imports          # exported: not flagged
    # the detectors themselves: a docstring may name a private attribute, code may not
    probe = ast.parse('"""_epoch_count in a docstring"""\nx.join_readers\ny = "No cooker found here"\n'
                      'leaf.restore_sample = f\nsetattr(leaf, "restore_sample", f)\nz = "CrudeWebdataset"\n')
    assert sorted(private_uses(probe)) == [(2, "join_readers"), (3, "No cooker found"), (4, "restore_sample"),
                                           (5, "restore_sample")]
    probe = ast.parse("import megatron.energon as me\nfrom megatron.energon.av import AVDecoder\n"
                      "from megatron.energon.errors import ErrorContext\nme.errors.ErrorContext\nme.WorkerConfig\n")
    assert sorted(private_imports(probe)) == [(3, "from megatron.energon.errors import ErrorContext"),
                                      (4, "megatron.energon.errors"), (4, "megatron.energon.errors.ErrorContext")]


def test_check_version_holds_the_supported_range():
    for version in ("7.3.9", "7.5.0", "unknown", "8.0.0"):
        with pytest.raises(ConfigError, match=rf"megatron-energon {re.escape(version)} is installed.*"
                                              r">=7\.4\.1,<7\.5\.0"):
            check_version(version)
    check_version(megatron.energon.__version__)
    check_version("7.4.1")
    assert SUPPORTED == ((7, 4, 1), (7, 5, 0))


# -- real datasets and loaders -----------------------------------------------------------------------

pytestmark = pytest.mark.usefixtures("quick_worker_shutdown")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Two prepared tar datasets (a: 20 samples in shards of 6, b: 8), a prepared .jsonl of 4 lines
    (line 2 nested 3000 levels deep), a media folder, and metadatasets over them."""
    root = tmp_path_factory.mktemp("surface")
    _, keys_a = text_dataset(root / "a", "general_conversations", N_A, seed=1, per_shard=PER_SHARD)
    _, keys_b = text_dataset(root / "b", "general_conversations", N_B, seed=2, per_shard=5)
    lines = [json.dumps({"messages": conv}) for conv in make_conversations(4, seed=3)]
    lines[DEEP_LINE] = '{"messages": ' + "[" * 3000 + "]" * 3000 + "}"
    jsonl = root / "lines.jsonl"
    jsonl.write_text("\n".join(lines) + "\n")
    energon("prepare", str(jsonl))
    (root / "media" / "pics").mkdir(parents=True)
    (root / "media" / "pics" / "a.jpg").write_bytes(b"not decoded here")
    head = {"__module__": "megatron.energon", "__class__": "MetadatasetV2"}
    metadatasets = {
        "mix": {"blend_epochized": [{"repetitions": 1, "path": "a"}, {"repetitions": 1, "path": "b"}]},
        "weighted": {"blend": [{"weight": 1, "path": "a"}, {"weight": 2, "path": "b"}]},
        "no_cooker": {"path": "a", "subflavors": {"cooker": "no_such_cooker"}},
        "aux": {"path": "lines.jsonl", "aux": {"shards": "a", "media": "filesystem://media"},
                "subflavors": {"cooker": "openai_messages"}},
    }
    for name, train in metadatasets.items():
        (root / f"{name}.yaml").write_text(yaml.safe_dump({**head, "splits": {"train": train}}))
    return SimpleNamespace(root=root, a=root / "a", b=root / "b", jsonl=jsonl, keys_a=keys_a, keys_b=keys_b)


def cfg(path: Path, workers: int = 0, **loader) -> dict:
    config = text_config(path, workers=workers)
    config["loader"].update(loader)
    if str(path).endswith(".jsonl"):
        config["data"]["default_cooker"] = "openai_messages"
    return config


def leaves_of(dataset, path: tuple = ()) -> list[tuple[tuple, object]]:
    """``(path, leaf)`` of every leaf below a built dataset (the path: the inner index at each selector)."""
    if is_leaf(dataset):
        return [(path, dataset)]
    step = type(dataset).__name__ in SELECTORS
    return [found for i, child in enumerate(inner_datasets(dataset))
            for found in leaves_of(child, path + ((i,) if step else ()))]


def nodes_of(dataset) -> list:
    return [dataset] + [n for child in inner_datasets(dataset) for n in nodes_of(child)]


def keys_of(batch) -> list[str]:
    return [k for row in batch.sample_keys for k in row]


def energon_train_dataset(path: Path, encoder, repeat: bool = False):
    """Energon's own ``get_train_dataset`` with the library's task encoder, in this process."""
    return get_train_dataset(str(path), split_part="train", worker_config=WorkerConfig(rank=0, world_size=1,
                             num_workers=0), batch_size=1, task_encoder=encoder, shuffle_buffer_size=None,
                             max_samples_per_sequence=None, repeat=repeat)


# -- tree: the built dataset, its leaves and readers ------------------------------------------------

@pytest.mark.parametrize("workers", [0, 1, 2])
def test_tree_leaves_readers_and_worker_slices(data, workers):
    loader = build_train_loader(cfg(data.a, workers), repeat=False)             # built, not iterated
    tree = loader.inner.dataset
    (path, leaf), = leaves_of(tree)
    assert path == () and type(leaf).__name__ == LEAF and is_leaf(leaf) and not is_wrapper(leaf)
    assert inner_datasets(leaf) == []
    assert all(is_wrapper(node) for node in nodes_of(worker_root(loader.inner))[:-1])
    assert any(type(node).__name__ == "MapDataset" for node in nodes_of(tree))
    assert leaf_size(leaf) == N_A
    assert leaf_shuffle_over_epochs(leaf) == 1                                  # a training split: one pass
    reader, = leaf_readers(leaf)
    assert reader_location(reader) == str(data.a) and reader_jsonl(reader) is None
    assert reader_position(reader, 0) == (data.a / "parts/data-0.tar", "parts/data-0.tar", PER_SHARD, 0, data.a)
    assert reader_position(reader, 13) == (data.a / "parts/data-2.tar", "parts/data-2.tar", PER_SHARD, 1, data.a)
    assert reader_position(reader, 19) == (data.a / "parts/data-3.tar", "parts/data-3.tar", 2, 1, data.a)
    assert reader_position(reader, N_A) is None
    slices = [list(map(int, offsets)) for offsets in leaf_worker_slices(leaf)]
    assert len(slices) == max(workers, 1)
    assert all(o == sorted(o) and len(o) > 1 for o in slices)
    assert slices[0][0] == 0 and slices[-1][-1] == N_A                          # consecutive, all samples
    assert all(a[-1] == b[0] for a, b in zip(slices, slices[1:]))


def test_wrap_leaf_readers_counts_and_replaces(data):
    class Marked:
        def __init__(self, reader):
            self.reader = reader

        def __len__(self):
            return len(self.reader)

    mix = build_train_loader(cfg(data.root / "mix.yaml"), repeat=False)
    tree = mix.inner.dataset
    done = lambda reader: isinstance(reader, Marked)                            # noqa: E731
    before = [leaf_readers(leaf)[0] for _, leaf in leaves_of(tree)]
    assert wrap_leaf_readers(tree, Marked, done) == 2                           # one reader per leaf, 2 leaves
    assert wrap_leaf_readers(tree, Marked, done) == 0
    after = [leaf_readers(leaf)[0] for _, leaf in leaves_of(tree)]
    assert [r.reader for r in after] == before
    assert [leaf_size(leaf) for _, leaf in leaves_of(tree)] == [N_A, N_B]
    one = build_train_loader(cfg(data.a, workers=1), repeat=False)
    assert wrap_leaf_readers(worker_root(one.inner), Marked, done) == 1


def test_jsonl_reader_and_raw_samples(data):
    loader = build_train_loader(cfg(data.jsonl), repeat=False)
    (_, leaf), = leaves_of(loader.inner.dataset)
    reader, = leaf_readers(leaf)
    assert reader_jsonl(reader) == str(data.jsonl) and reader_location(reader) == str(data.jsonl)
    assert reader_position(reader, 0) is None                                   # not a tar-shard reader
    assert leaf_size(leaf) == 4
    raw = read_leaf_sample(leaf, 1)
    assert raw_sample_key(raw) == "lines.jsonl:2" and sample_index(raw) == 1    # shown 1-based, with its file
    deep = read_leaf_sample(leaf, DEEP_LINE)                                     # read, not parsed
    assert raw_sample_key(deep) == f"lines.jsonl:{DEEP_LINE + 1}" and isinstance(deep.data[0]["json"], bytes)
    assert raw_sample_key(object()) is None and raw_sample_key(SimpleNamespace(data=())) is None
    assert sample_index({"__restore_key__": ("MapDataset", 0, "Webdataset", 7)}) == 7
    info = SourceInfo(dataset_path=str(data.jsonl), index=3, shard_name="lines.jsonl", file_names=("3.json",))
    assert sample_index({"__sources__": (info,)}) == 3 and sample_index({}) is None


def test_leaf_epoch_counts_passes(data):
    loader = build_train_loader(cfg(data.a), repeat=True)
    (_, leaf), = leaves_of(loader.inner.dataset)
    assert leaf_epoch(leaf) == 0
    seen: list[str] = []
    for batch in loader:
        key, = keys_of(batch)
        if key in seen:                                          # the first sample of the second pass
            break
        seen.append(key)
        assert leaf_epoch(leaf) == 0
        assert len(seen) <= N_A
    assert sorted(seen) == sorted(data.keys_a)
    assert leaf_epoch(leaf) == 1


def test_restore_keys_name_the_pass_each_sample_was_read_in(data):
    """With ``pass_in_restore_keys`` (the task encoder installs it), a leaf's sample names the pass it
    was read in at the end of its restore key: 0 in the first pass, 1 in the next. A key read back
    keeps its pass, a key saved without one reads as pass 0, and ``sample_pass`` finds it under the
    wrappers' tokens (``sample_index`` still finds the index)."""
    pass_in_restore_keys()
    loader = build_train_loader(cfg(data.a), repeat=True)
    (_, leaf), = leaves_of(loader.inner.dataset)
    assert read_leaf_sample(leaf, 3).__restore_key__ == ("Webdataset", 3, 0)
    batches = iter(loader)
    for _ in range(N_A + 1):                                     # a pass, and the first sample of the next
        next(batches)
    assert leaf_epoch(leaf) == 1 and read_leaf_sample(leaf, 3).__restore_key__ == ("Webdataset", 3, 1)
    again = leaf.restore_sample(("Webdataset", 3, 5))
    assert again.__restore_key__ == ("Webdataset", 3, 5) and raw_sample_key(again) == data.keys_a[3]
    assert leaf.restore_sample(("Webdataset", 3)).__restore_key__ == ("Webdataset", 3, 0)
    with pytest.raises(ValueError, match="not a sample's restore key"):
        leaf.restore_sample(("Webdataset", 3, 1, 2))
    assert sample_pass(("MapDataset", 4, "MapDataset", 4, "Webdataset", 3, 2)) == 2
    assert sample_pass(("MapDataset", 4, "Webdataset", 3)) == 0 and sample_pass(None) == 0
    assert sample_index({"__restore_key__": ("MapDataset", 4, "Webdataset", 3, 2)}) == 3


@pytest.mark.parametrize("workers", [0, 1])
def test_filter_leaf_samples_skips_what_the_filter_empties(data, workers):
    loader = build_train_loader(cfg(data.a, workers), repeat=False)
    (_, leaf), = leaves_of(loader.inner.dataset)
    asked: list[int] = []

    def odd_only(index: int):
        asked.append(index)
        return empty_leaf_sample(leaf, index) if index % 2 == 0 else read_leaf_sample(leaf, index)

    filter_leaf_samples(leaf, odd_only)
    keys = [k for batch in loader for k in keys_of(batch)]
    assert sorted(keys) == data.keys_a[1::2]
    if not workers:                                              # the leaf of this process read them
        assert sorted(asked) == list(range(N_A))
    empty = empty_leaf_sample(leaf, 4)
    assert empty.__restore_key__ == ("Webdataset", 4) and empty.data == (None,)
    restored = leaf.restore_sample(("Webdataset", 4))               # named by a restore key: read as it is
    assert raw_sample_key(restored) == data.keys_a[4] and sample_index(restored) == 4
    assert raw_sample_key(read_leaf_sample(leaf, 2)) == data.keys_a[2]


# -- restore keys ---------------------------------------------------------------------------------

def test_restore_keys_name_leaf_samples_through_blends(data):
    loader = build_train_loader(cfg(data.root / "mix.yaml"), repeat=False)
    found = leaves_of(loader.inner.dataset)
    assert [(path, leaf_size(leaf)) for path, leaf in found] == [((0,), N_A), ((1,), N_B)]
    keys = {(0,): data.keys_a, (1,): data.keys_b}
    selectors_seen = set()
    n = 0
    for batch in loader:
        key = batch.__restore_key__
        assert key[0] == "SimpleSavableDatasetWrapper" and names_samples(key)
        worker, own = batch_worker(key)
        assert worker == 0 and own == key[2:]
        (path, index), = sample_refs(key)
        assert [keys[path][index]] == keys_of(batch)
        selectors_seen |= {t for t in json.dumps(key).split('"') if t in SELECTORS}
        n += 1
    assert n == N_A + N_B and selectors_seen == {"BlendDataset"}
    assert not names_samples(("MapDataset", 0)) and names_samples((("MapDataset", 0),))
    assert list(sample_refs(("ConcatDataset", 1, ("Webdataset", 3), ("Webdataset", 4)))) == [((1,), 3), ((1,), 4)]


def test_restore_keys_with_a_worker(data):
    loader = build_train_loader(cfg(data.a, workers=1), repeat=False)
    keys = []
    for batch in loader:
        key = batch.__restore_key__
        assert key[0] == "SavableDatasetWrapper"
        worker, own = batch_worker(key)
        assert worker == 0 and own == key[2:]
        (path, index), = sample_refs(own)
        assert path == () and [data.keys_a[index]] == keys_of(batch)
        keys += keys_of(batch)
    assert sorted(keys) == data.keys_a
    # on data-parallel rank 1 of 2 the key carries the *global* worker id (rank * workers + worker)
    second = build_train_loader(cfg(data.a, workers=1), repeat=False, dp_rank=1, dp_size=2)
    batch = next(iter(second))
    assert batch.__restore_key__[:2] == ("SavableDatasetWrapper", 1) and batch_worker(batch.__restore_key__)[0] == 1


# -- saved states -----------------------------------------------------------------------------------

def _leaf_state(tree):
    if saved_class(tree) == LEAF:
        return tree
    recorded, inner = saved_inner(tree)
    return next((s for s in map(_leaf_state, inner if recorded else []) if s is not None), None)


def _check_tree(dataset, state) -> None:
    """The saved tree mirrors the built one: class names, savable fields, inner states."""
    assert saved_class(state) == type(dataset).__name__
    assert all(field in state for field in savable_fields(dataset)), (type(dataset).__name__, list(state))
    recorded, inner = saved_inner(state)
    assert recorded == is_wrapper(dataset)
    if recorded:
        assert isinstance(inner, list) and len(inner) == len(inner_datasets(dataset))
        for child, sub in zip(inner_datasets(dataset), inner):
            _check_tree(child, sub)


def _tuples(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _tuples(v)
    elif isinstance(value, list):
        for v in value:
            yield from _tuples(v)
    elif isinstance(value, tuple):
        yield value


def test_saved_state_without_workers(data):
    loader = build_train_loader(cfg(data.a, shuffle_buffer_size=4), repeat=False)
    it = iter(loader)
    delivered = [k for _ in range(3) for k in keys_of(next(it))]
    state = loader.inner.save_state_rank()
    assert is_loader_state(state) and not is_loader_state({"worker_states": []})
    entry, = state.worker_states
    assert not is_worker_checkpoint(entry) and worker_dataset_state(entry) is entry   # the main process's tree
    _check_tree(loader.inner.dataset, entry)
    (_, leaf), = leaves_of(loader.inner.dataset)
    assert {"_pending_slice_indexes", "_active_slice_state", "_pending_slices_offset", "_epoch_count"} \
        <= set(savable_fields(leaf))
    leaf_state = _leaf_state(entry)
    assert saved_leaf_epoch(leaf_state) == 0
    pending, active, offset = saved_leaf_slices(leaf_state)
    assert isinstance(pending, list) and all(isinstance(i, int) for i in pending)
    assert isinstance(offset, int) and offset >= 1
    open_now = [a for a in active if a is not None]
    assert open_now and all(isinstance(a.index, int) and isinstance(a.current, int) for a in open_now)
    offsets, = leaf_worker_slices(leaf)
    read = sum(offsets[k + 1] - offsets[k] for k in range(len(offsets) - 1)
               if k not in pending and k not in {a.index for a in open_now})
    read += sum(a.current - offsets[a.index] for a in open_now)
    # what the leaf has read is what was delivered plus what the buffers hold (restore keys in the state)
    buffered = [ref for t in _tuples(entry) if names_samples(t) for ref in sample_refs(t)]
    assert read == len(delivered) + len(buffered)
    assert {data.keys_a[i] for _, i in buffered}.isdisjoint(delivered)
    assert saved_class(None) is None and saved_inner({}) == (False, None) and saved_leaf_epoch({}) == 0
    assert saved_leaf_slices({}) == (None, [], None)
    # the library's own stage (declared with `saves`) is saved by Energon with its field
    one_pass, = [n for n in nodes_of(loader.inner.dataset) if type(n).__name__ == "OnePassEnd"]
    assert savable_fields(one_pass) == ("_ended",) and isinstance(one_pass, WrapperDataset)


def test_worker_checkpoints(data):
    loader = build_train_loader(cfg(data.a, workers=1), repeat=False)
    inner = loader.inner
    assert worker_sample_counters(inner) == [-1] and initial_worker_checkpoints(inner) is None
    it = iter(loader)
    first = [keys_of(next(it)) for _ in range(3)]
    assert worker_sample_counters(inner) == [2]                     # the last sample index received
    state = inner.save_state_rank()
    ckpt, = state.worker_states
    assert is_loader_state(state) and is_worker_checkpoint(ckpt)
    tree = worker_dataset_state(ckpt)
    assert saved_class(tree) == type(worker_root(inner)).__name__
    _check_tree(worker_root(inner), tree)
    assert saved_leaf_epoch(_leaf_state(tree)) == 0
    assert shutdown_workers(inner) == [0] and shutdown_workers(inner) == [0]     # ended on its own; idempotent
    del it, loader
    plain = build_train_loader(cfg(data.a), repeat=False)
    next(iter(plain))
    assert shutdown_workers(plain.inner) == []                     # no workers: nothing to stop
    restored = build_train_loader(cfg(data.a, workers=1), repeat=False)
    restored.inner.restore_state_rank(state)
    start, = initial_worker_checkpoints(restored.inner)
    assert is_worker_checkpoint(start) and start.offset == ckpt.offset and worker_dataset_state(start) is tree
    assert len(worker_sample_counters(restored.inner)) == 1
    assert shutdown_workers(restored.inner) == []                  # not iterated: no workers yet
    empty = empty_worker_checkpoint()
    assert is_worker_checkpoint(empty) and worker_dataset_state(empty) is None and empty.offset == 0
    # Energon restores an empty checkpoint as the worker's initial state: the epoch from its start
    state.worker_states[0] = empty_worker_checkpoint()
    fresh = build_train_loader(cfg(data.a, workers=1), repeat=False)
    fresh.inner.restore_state_rank(state)
    assert [keys_of(b) for b in fresh][:3] == first


# -- stages -----------------------------------------------------------------------------------------

def test_stage_failure_tolerance(data):
    encoder = build_task_encoder(cfg(data.a))

    def plain(sample):
        return sample

    @stateless(failure_tolerance=3)
    def marked(sample):
        return sample

    assert stage_failure_tolerance(encoder, plain) == 100                       # Energon's default
    assert stage_failure_tolerance(encoder, marked) == 3
    set_default_failure_tolerance(encoder, 7)
    assert stage_failure_tolerance(encoder, plain) == 7 and stage_failure_tolerance(encoder, marked) == 3
    set_default_failure_tolerance(encoder, 0)
    assert stage_failure_tolerance(encoder, plain) == 0
    assert stage_failure_tolerance(build_task_encoder(cfg(data.a)), plain) == 100   # per encoder
    # Energon builds the task encoder's stages with the default the library sets (loader.on_error:
    # skip -> 0); the dataset's own sample-loading map (right above the leaf, built by Energon's
    # dataset factory, where the JSONL line guard runs) keeps Energon's fixed 100
    for on_error, expected in (("skip", {0}), ("raise", {100})):
        loader = build_train_loader(cfg(data.a, on_error=on_error), repeat=False)
        (_, leaf), = leaves_of(loader.inner.dataset)
        maps = [n for n in nodes_of(loader.inner.dataset) if isinstance(n, MapDataset)]
        loading = maps.pop()
        assert loading.dataset is leaf and loading.failure_tolerance == 100
        assert len(maps) >= 3 and {m.failure_tolerance for m in maps} == expected, on_error


def test_stage_error_context_hands_errors_to_the_handler():
    handled = []
    context = stage_error_context("surface.stage", lambda e, sample, sources: handled.append((e, sample)), 2)
    sample = {"__key__": "k1"}
    with context.handle_errors(sample):
        raise ValueError("first")
    assert [(str(e), s) for e, s in handled] == [("first", sample)]
    with context.handle_errors(sample):
        pass                                                     # a success resets the run of failures
    with context.handle_errors(sample):
        raise ValueError("again")
    with pytest.raises(Exception) as failed:                     # 2 in a row: fatal
        with context.handle_errors(sample):
            raise ValueError("third")
    assert type(failed.value).__name__ == "FatalSampleError" and len(handled) == 3
    never = stage_error_context("surface.never", lambda *a: None, 0)
    for _ in range(5):
        with never.handle_errors(sample):
            raise ValueError("x")


def test_one_line_shard_failures_turns_energons_per_shard_traceback_into_a_line(tmp_path):
    """Energon's real prepare, one forked indexing process, a shard that is no tar: the record its
    logger writes is one line with the cause inside the block, and Energon's traceback after it."""
    import logging

    from megatron.energon import BaseWebdatasetFactory

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "bad.tar").write_bytes(bytes(range(256)) * 8)
    logger = logging.getLogger("megatron.energon.flavors.webdataset.prepare")   # written in the forked process

    def prepare(log: Path) -> list[str]:
        handler = logging.FileHandler(log)
        logger.addHandler(handler)
        try:
            with pytest.raises((SystemExit, Exception)):
                BaseWebdatasetFactory.prepare_dataset(tmp_path / "data", ["bad.tar"], split_parts_ratio=[("train", 1.0)],
                                                      shuffle_seed=None, workers=1, progress_fn=lambda it, length=None: it)
        finally:
            logger.removeHandler(handler)
            handler.close()
        return log.read_text().splitlines()

    with one_line_shard_failures():
        lines = prepare(tmp_path / "inside.log")
    assert len(lines) == 1 and lines[0].startswith("Shard failed to load: 'bad.tar' (ReadError: "), lines
    after = prepare(tmp_path / "after.log")
    assert after[0] == "Shard failed to load: 'bad.tar'. Skipping it." and "Traceback" in after[1], after


def test_quiet_error_prints(monkeypatch, capsys):
    def fail_twice():
        context = stage_error_context("surface.quiet", lambda *a: None, 0)
        for _ in range(2):
            with context.handle_errors({"__key__": "q"}):
                raise ValueError("boom")

    monkeypatch.setattr(energon_errors, "print", builtins.print, raising=False)   # Energon's own prints
    fail_twice()
    out = capsys.readouterr().out.splitlines()
    assert "Except boom in surface.quiet" in out
    assert "ErrorContext surface.quiet failed 2/0 times in a row." in out
    quiet_error_prints()
    quiet_error_prints()                                                          # idempotent
    assert energon_errors.print is not builtins.print
    fail_twice()
    energon_errors.print("another line of Energon's")
    print("Except this one: not Energon's")
    assert capsys.readouterr().out.splitlines() == ["another line of Energon's", "Except this one: not Energon's"]


def test_quiet_progress_drops_the_shard_lines_and_the_buffer_bar(tmp_path, capsys, monkeypatch):
    """The quiet default: no ``rank=0, worker=0: sample_range=...`` line and no ``Filling reading
    buffer`` bar; ``quiet_progress(False)`` (the loader's with ENERGON_NEMOTRON_VERBOSE=1, the
    command line's ``--verbose``) shows both again."""
    import megatron.energon.flavors.webdataset.base_webdataset as base

    from energon_nemotron.loading import build_train_loader
    from energon_nemotron.loading.loader import VERBOSE_ENV

    rows = tmp_path / "rows.jsonl"                       # JSONL datasets print the shard line always
    rows.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"},
                                                     {"role": "assistant", "content": f"a{i}"}]}) + "\n"
                            for i in range(6)))
    energon("prepare", str(rows))
    cfg = text_config(rows, workers=0, packing={"algorithm": "first_fit_decreasing", "buffer_size": 4})
    cfg["data"]["default_cooker"] = "openai_messages"
    try:
        for verbose in (True, False, False):            # a second quiet call changes nothing
            monkeypatch.setenv(VERBOSE_ENV, "1" if verbose else "0")
            next(iter(build_train_loader(cfg, repeat=False)))
            captured = capsys.readouterr()
            assert ("sample_range=" in captured.out, "Filling reading buffer" in captured.err) == (verbose, verbose)
            assert (base.print is builtins.print) is verbose
        quiet_progress(False)
        assert base.print is builtins.print
    finally:
        quiet_progress(True)


def test_dataset_hook_sees_each_dataset_once(data):
    calls = []

    def spying(cls):
        class Spy(cls):
            def dataset_loading(self, loaded):
                calls.append(("loading", loaded, None))
                super().dataset_loading(loaded)

            def dataset_loaded(self, loaded, built, worker_config):
                out = super().dataset_loaded(loaded, built, worker_config)
                calls.append(("loaded", loaded, out))
                return out
        return Spy

    encoder = build_task_encoder(cfg(data.a), subclass=spying)
    assert isinstance(encoder, DatasetHook)
    dataset = energon_train_dataset(data.root / "mix.yaml", encoder)
    assert [c[0] for c in calls] == ["loading", "loaded", "loading", "loaded"]
    assert calls[0][1] is calls[1][1] and calls[2][1] is calls[3][1] and calls[0][1] is not calls[2][1]
    assert [Path(str(c[1].dataset.path)).name for c in calls[::2]] == ["a", "b"]
    in_tree = {id(n) for n in nodes_of(dataset)}
    assert all(id(c[2]) in in_tree for c in calls[1::2])              # what dataset_loaded returned is used
    assert sum(1 for _ in basic_loader(dataset)) == N_A + N_B


def test_build_errors_are_recognised_from_energon(data):
    encoder = build_task_encoder(cfg(data.a))
    with pytest.raises(AssertionError) as weighted:
        energon_train_dataset(data.root / "weighted.yaml", encoder, repeat=False)
    assert is_weighted_blend_error(weighted.value) and not is_no_cooker_error(weighted.value)
    energon_train_dataset(data.root / "weighted.yaml", encoder, repeat=True)      # with repeat: fine
    with pytest.raises(ValueError) as no_cooker:
        energon_train_dataset(data.root / "no_cooker.yaml", encoder)
    assert is_no_cooker_error(no_cooker.value) and not is_weighted_blend_error(no_cooker.value)
    assert not is_weighted_blend_error(AssertionError("other")) and not is_no_cooker_error(ValueError("other"))
    assert not is_no_cooker_error(AssertionError(str(no_cooker.value)))          # the type matters too
    with pytest.raises(ConfigError, match="a weighted blend has no epoch"):      # what the loader makes of it
        build_train_loader(cfg(data.root / "weighted.yaml"), repeat=False)


def test_saves_declares_what_energon_saves_and_restores(data):
    @saves("_count")
    class Counting(WrapperDataset):
        def __init__(self, dataset, *, worker_config):
            super().__init__(dataset, worker_config=worker_config)
            self.reset_state_own()

        def reset_state_own(self):
            self._count = 0

        def len_worker(self, worker_idx=None):
            return self.dataset.len_worker(worker_idx)

        def __iter__(self):
            for sample in self.dataset:
                self._count += 1
                yield sample

        def config(self):
            return {"type": "Counting"}

    assert savable_fields(Counting) == ("_count",)
    worker_config = WorkerConfig(rank=0, world_size=1, num_workers=0)

    def built():
        loaded, = load_dataset(str(data.a)).get_datasets(training=False, split_part="train",
                                                          worker_config=worker_config).datasets
        return Counting(loaded.dataset.build(), worker_config=worker_config)

    counting = built()
    assert is_wrapper(counting) and savable_fields(counting) == ("_count",)
    it = iter(basic_loader(counting))
    got = [next(it) for _ in range(3)]
    assert [s["__key__"] for s in got] == tar_keys(data.keys_a[:3]) and [sample_index(s) for s in got] == [0, 1, 2]
    state = counting.save_state()
    assert saved_class(state) == "Counting" and state["_count"] == 3
    again = built()
    again.restore_state(state)
    assert again._count == 3


def test_packing_stage_carries_samples_into_the_next_buffer_and_saves_them(data):
    """Energon's ``build_batch`` under ``packing_stage`` builds a ``CarryingPackingDataset``; its
    pre-packer gets a ``BufferContext`` per buffer; what it carries comes back at the front of the
    next buffer, counted; every sample leaves in exactly one pack; the state saves the counts."""
    config = text_config(data.a, workers=0, packing={"algorithm": "first_fit_decreasing", "buffer_size": 5,
                                                     "max_sequences_per_bin": 2}, seq_length=4096)
    encoder = build_task_encoder(config)
    contexts: list = []
    chosen = encoder.select_samples_to_pack

    def carrying(samples, context=None):
        assert isinstance(context, BufferContext)
        contexts.append((list(context.carried), context.final, context.first_pack, context.worker,
                         context.num_workers, context.batch_size, [s.__key__ for s in samples]))
        packs = chosen(samples, None)        # the encoder's packs, then carry the first one (once)
        times = {s.__key__: t for s, t in zip(samples, context.carried)}
        if not context.final and len(packs) > 1 and times[packs[0][0].__key__] == 0:
            context.carry = [(s, 1) for s in packs[0]]
            packs = packs[1:]
        return packs

    encoder.select_samples_to_pack = carrying
    with packing_stage(3) as build:
        assert callable(build)
    dataset = get_train_dataset(str(data.a), split_part="train", worker_config=WorkerConfig(rank=0, world_size=1,
                                num_workers=0), batch_size=3, task_encoder=encoder, shuffle_buffer_size=None,
                                max_samples_per_sequence=None, repeat=False, packing_buffer_size=5)
    stage, = [n for n in nodes_of(dataset) if isinstance(n, CarryingPackingDataset)]
    assert stage.batch_size == 3 and {"_carried", "_density", "_packs_planned"} <= set(savable_fields(stage))
    keys, saved = [], None
    for batch in basic_loader(dataset):
        keys += keys_of(batch)
        if stage._carried and saved is None:
            saved = stage.save_state()
    assert sorted(keys) == sorted(data.keys_a)                     # each sample once, carried ones too
    assert contexts[0][0] == [0] * 5 and contexts[0][2] == 0 and contexts[0][3:6] == (0, 1, 3)
    assert not any(c[1] for c in contexts[:-1])            # only a last buffer read after the source's end is final
    for before, after in zip(contexts, contexts[1:]):
        carried = [t for t in after[0] if t]
        assert after[0][:len(carried)] == [1] * len(carried)       # carried samples first, counted once
        assert set(after[6][:len(carried)]) <= set(before[6])
        assert after[2] > before[2]                                # the worker's pack count goes on
    assert any(any(c[0]) for c in contexts) and saved is not None and all(t == 1 for t in saved["_carried"])
    assert saved_class(saved) == "CarryingPackingDataset"



class LeaveAllOut:
    """A media-bytes policy for the packing stage that leaves every sample's bytes out (by key)."""

    def __init__(self):
        self.left, self.refilled, self.admitted = set(), [], []

    def nbytes(self, sample):
        return 0 if sample.__key__ in self.left else 1

    def admits(self, nbytes, held, count):
        return False

    def leave_out(self, sample):
        self.admitted.append(sample.__key__)
        self.left.add(sample.__key__)

    def is_light(self, sample):
        return sample.__key__ in self.left

    def refill(self, sample, fresh):
        assert fresh.__key__ == sample.__key__ and fresh is not sample
        self.refilled.append(sample.__key__)
        return sample

    def report(self, held):
        assert held == 0


def test_packing_stage_admits_each_sample_and_refills_it_through_energons_restore(data):
    """With a ``held`` policy, each sample read or restored from a state passes its admission, and
    one left out is read again by ``dataset.restore_sample`` of its restore key before the sample
    encoder sees it; a state restored mid-stream admits its buffers' samples again."""
    config = text_config(data.a, workers=0, packing={"algorithm": "first_fit_decreasing", "buffer_size": 5},
                         seq_length=4096)

    def build(held, state=None):
        encoder = build_task_encoder(config)
        encoder.held_media = held               # what its build_batch gives packing_stage
        dataset = get_train_dataset(str(data.a), split_part="train", worker_config=WorkerConfig(
            rank=0, world_size=1, num_workers=0), batch_size=1, task_encoder=encoder, shuffle_buffer_size=None,
            max_samples_per_sequence=None, repeat=False, packing_buffer_size=5)
        stage, = [n for n in nodes_of(dataset) if isinstance(n, CarryingPackingDataset)]
        if state is not None:
            stage.restore_state(state)
        return dataset, stage

    held = LeaveAllOut()
    dataset, stage = build(held)
    keys, state = [], None
    for i, batch in enumerate(basic_loader(dataset)):
        keys += keys_of(batch)
        if i == 2:
            state, done = stage.save_state(), len(keys)
    assert sorted(keys) == sorted(data.keys_a)
    assert sorted(held.admitted) == sorted(held.refilled) == sorted(data.keys_a)    # each once
    again = LeaveAllOut()
    dataset, stage = build(again, state)
    rest = [k for batch in basic_loader(dataset) for k in keys_of(batch)]
    assert rest == keys[done:] and sorted(again.refilled) == sorted(rest)

def test_basic_loader_reads_a_built_dataset(data):
    worker_config = WorkerConfig(rank=0, world_size=1, num_workers=0)
    loaded, = load_dataset(str(data.a)).get_datasets(training=False, split_part="train",
                                                      worker_config=worker_config).datasets
    samples = list(basic_loader(loaded.dataset.build()))
    assert [s["__key__"] for s in samples] == tar_keys(data.keys_a)
    assert [sample_index(s) for s in samples] == list(range(N_A))


# -- patches ----------------------------------------------------------------------------------------

def test_guard_jsonl_lines_checks_each_line_before_energon_parses_it(data, monkeypatch):
    seen = []
    real_check = jsonl_guard.check_json_text

    def spy(raw, where, what):
        seen.append(type(raw))
        return real_check(raw, where, what)

    monkeypatch.setattr(jsonl_guard, "check_json_text", spy)
    loader = build_train_loader(cfg(data.jsonl, on_error="raise"), repeat=False)
    keys = []
    with pytest.raises(DataError) as too_deep:                   # not the RecursionError json.loads would raise
        for batch in loader:
            keys += keys_of(batch)
    assert too_deep.value.code == "json_too_deep" and "nested 3001 levels deep" in str(too_deep.value)
    assert keys == ["lines.jsonl:1", "lines.jsonl:2"] and seen == [bytes] * 3     # raw lines 0, 1, 2: unparsed
    installed = DefaultCrudeJsonlDatasetFactory._load_sample
    guard_jsonl_lines(lambda sample: 1 / 0)                      # installed once: later calls do nothing
    assert DefaultCrudeJsonlDatasetFactory._load_sample is installed
    # the mechanism on its own: the check runs first, then the method it wraps
    order = []
    monkeypatch.setattr(DefaultCrudeJsonlDatasetFactory, "_load_sample",
                        lambda self, sample: order.append(("parse", sample["json"])) or "parsed")
    guard_jsonl_lines(lambda sample: order.append(("check", sample["json"])))
    guard_jsonl_lines(lambda sample: order.append(("twice", sample["json"])))
    assert DefaultCrudeJsonlDatasetFactory._load_sample(None, {"json": b"{}"}) == "parsed"
    assert order == [("check", b"{}"), ("parse", b"{}")]


# -- files and aux sources --------------------------------------------------------------------------

def test_dss_paths_resolve_under_the_nvdataset_cache_dir(data, tmp_path, monkeypatch):
    """``dss://NAME@VERSION/PATH`` reads ``ROOT/NAME/VERSION/PATH`` once the root is set."""
    import shutil

    from megatron.energon.epathlib import epath as energon_epath

    monkeypatch.setattr(energon_epath, "NVDATASET_CACHE_DIR", energon_epath.NVDATASET_CACHE_DIR)
    monkeypatch.setenv("NVDATASET_CACHE_DIR", os.environ.get("NVDATASET_CACHE_DIR", ""))
    shutil.copytree(data.a, tmp_path / "corpus" / "v0" / "a")
    set_nvdataset_cache_dir(tmp_path)
    assert os.environ["NVDATASET_CACHE_DIR"] == str(tmp_path)
    worker_config = WorkerConfig(rank=0, world_size=1, num_workers=0)
    loaded, = load_dataset("dss://corpus@v0/a").get_datasets(training=False, split_part="train",
                                                              worker_config=worker_config).datasets
    assert len(loaded.dataset) == N_A


def test_files_and_aux_sources(data):
    meta = data.a / ".nv-meta"
    parsed = load_yaml((meta / "dataset.yaml").read_bytes())
    assert parsed == yaml.safe_load((meta / "dataset.yaml").read_text())
    assert parsed == {"__module__": "megatron.energon", "__class__": "CrudeWebdataset",
                      "subflavors": {"cooker": "general_conversations"}}
    worker_config = WorkerConfig(rank=0, world_size=1, num_workers=0)
    loaded, = load_dataset(str(data.root / "aux.yaml")).get_datasets(training=False, split_part="train",
                                                                      worker_config=worker_config).datasets
    shards, media = loaded.aux["shards"], loaded.aux["media"]
    assert (store_kind(shards), store_kind(media), store_kind(loaded.dataset.as_file_store())) \
        == ("webdataset", "filesystem", "other")
    assert store_local_base(media) == data.root / "media"
    # an entry found without reading it is recorded as the store's own read records it
    for store, key, entry in ((shards, "a-00003.json", webdataset_entry), (media, "pics/a.jpg", filesystem_entry)):
        sample = {"__sources__": None}
        store.get(key, sample)
        assert sample["__sources__"] == (entry(store, key),)
    info = webdataset_entry(shards, "a-00013.json")
    assert info.shard_name == "parts/data-2.tar" and info.index == "a-00013.json"
    assert webdataset_entry(shards, "a-99999.json") is None and webdataset_entry(shards, "no_member") is None
    assert store_entry_names(shards) == [f"{k}.json" for k in tar_keys(data.keys_a)] and store_entry_names(media) is None
    # sizes without reading: the index's part size, the file system's
    assert entry_size(shards, "a-00003.json") == len(shards.get("a-00003.json"))
    assert entry_size(media, "pics/a.jpg") == (data.root / "media" / "pics" / "a.jpg").stat().st_size
    assert entry_size(shards, "a-99999.json") is None and entry_size(media, "pics/none.jpg") is None
    sample = {"__sources__": (info,)}
    add_source_info(sample, filesystem_entry(media, "pics/a.jpg"))
    assert sample["__sources__"] == (info, filesystem_entry(media, "pics/a.jpg"))
    assert index_file(meta).read_bytes().startswith(b"SQLite format 3\x00")      # energon prepare's index
    # index.sqlite: the position-th sample of shard number k (in .info order)
    assert [indexed_sample_key(meta, shard, pos) for shard, pos in ((0, 0), (2, 1), (3, 1))] \
        == tar_keys([data.keys_a[0], data.keys_a[13], data.keys_a[19]])
    assert indexed_sample_key(meta, 3, 2) is None and indexed_sample_key(meta, 9, 0) is None
    with pytest.raises(sqlite3.Error):
        indexed_sample_key(data.root / "media", 0, 0)


def test_aux_sources_on_object_storage(data, object_store, tmp_path):
    """The same aux sources uploaded to the store (``msc://``): a folder's entries come from one
    listing; a prepared dataset's entry is located (shard URL, offset, size) from its index, and
    those bytes are the entry's; a local source has no remote range."""
    from energon_nemotron._energon.storage import RemotePath

    object_store.upload(data.a, "surface/a")
    object_store.upload(data.root / "media", "surface/media")
    (tmp_path / "aux.yaml").write_text(yaml.safe_dump({
        "__module__": "megatron.energon", "__class__": "MetadatasetV2", "splits": {"train": {
            "path": str(data.root / "lines.jsonl"), "aux": {"shards": object_store.url("surface/a"),
                                                            "media": f"filesystem://{object_store.url('surface/media')}"}}}}))
    worker_config = WorkerConfig(rank=0, world_size=1, num_workers=0)
    loaded, = load_dataset(str(tmp_path / "aux.yaml")).get_datasets(training=False, split_part="train",
                                                                     worker_config=worker_config).datasets
    shards, media = loaded.aux["shards"], loaded.aux["media"]
    assert (store_kind(shards), store_kind(media)) == ("webdataset", "filesystem")
    assert store_entry_names(media) == ["pics/a.jpg"] and store_local_base(media) is None
    url, offset, size = remote_entry_range(shards, "a-00013.json")
    assert url == object_store.url("surface/a/parts/data-2.tar")
    assert RemotePath(url).read_range(offset, size) == shards.get("a-00013.json")
    assert remote_entry_range(shards, "a-99999.json") is None and remote_entry_range(media, "pics/a.jpg") is None
    local, = load_dataset(str(data.root / "aux.yaml")).get_datasets(training=False, split_part="train",
                                                                     worker_config=worker_config).datasets
    assert remote_entry_range(local.aux["shards"], "a-00013.json") is None


def test_name_watchdog_timeouts_gives_energons_watchdog_our_message(monkeypatch):
    """Energon's ``WatchdogDataset._watchdog_trigger`` raises ``TimeoutError(describe(timeout))``
    with ``fail_on_timeout`` (its watchdog thread prints it and ends the process), else warns."""
    from megatron.energon.wrappers.watchdog_dataset import WatchdogDataset

    from energon_nemotron._energon import name_watchdog_timeouts

    monkeypatch.setattr(WatchdogDataset, "_watchdog_trigger", WatchdogDataset._watchdog_trigger)
    name_watchdog_timeouts(lambda t: f"stuck for {t:g} s")
    watched = SimpleNamespace(timeout_seconds=7, fail_on_timeout=True)
    with pytest.raises(TimeoutError, match=r"^stuck for 7 s$"):
        WatchdogDataset._watchdog_trigger(watched)
    watched.fail_on_timeout = False
    with pytest.warns(RuntimeWarning, match=r"^stuck for 7 s$"):
        WatchdogDataset._watchdog_trigger(watched)



def _watchdog_threads() -> list:
    import threading

    from megatron.energon.watchdog import Watchdog

    return [t for t in threading.enumerate() if isinstance(getattr(getattr(t, "_target", None), "__self__", None),
                                                            Watchdog)]


def test_stop_watchdog_threads_ends_each_passs_watchdog_thread(data):
    """Energon's ``WatchdogDataset`` iteration starts a watchdog thread; with the patch it ends when
    the iteration ends: a pass read to its end, and a pass abandoned after one batch. The thread is
    seen while the pass is open (after its first batch), and its end is waited for with a bound."""
    from energon_nemotron._energon import stop_watchdog_threads

    stop_watchdog_threads()
    stop_watchdog_threads()                                   # idempotent
    for read_to_end in (True, False):
        before = set(_watchdog_threads())
        loader = build_train_loader(text_config(data.a, workers=0, packing=None), repeat=False)
        it = iter(loader)
        assert next(it, None) is not None
        watching = set(_watchdog_threads()) - before
        assert watching, "no watchdog thread while the pass is open"
        if read_to_end:
            for _ in it:
                pass
        del it, loader
        gc.collect()
        deadline = time.monotonic() + 30                      # a bound, not a guess at its timing
        for t in watching:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        assert not [t for t in watching if t.is_alive()], f"read_to_end={read_to_end}"

# -- every accessor is exercised ------------------------------------------------------------------

EXERCISED = {
    "test_name_watchdog_timeouts_gives_energons_watchdog_our_message": ["name_watchdog_timeouts"],
    "test_stop_watchdog_threads_ends_each_passs_watchdog_thread": ["stop_watchdog_threads"],
    "test_check_version_holds_the_supported_range": ["SUPPORTED", "check_version"],
    "test_tree_leaves_readers_and_worker_slices": ["LEAF", "inner_datasets", "is_leaf", "leaf_size",
                                                   "leaf_readers", "reader_location", "reader_jsonl",
                                                   "reader_position", "leaf_worker_slices",
                                                   "leaf_shuffle_over_epochs", "is_wrapper", "worker_root"],
    "test_wrap_leaf_readers_counts_and_replaces": ["wrap_leaf_readers", "leaf_readers", "leaf_size"],
    "test_jsonl_reader_and_raw_samples": ["reader_jsonl", "read_leaf_sample", "raw_sample_key", "sample_index"],
    "test_leaf_epoch_counts_passes": ["leaf_epoch"],
    "test_restore_keys_name_the_pass_each_sample_was_read_in": ["pass_in_restore_keys", "sample_pass", "leaf_epoch",
                                                                "read_leaf_sample", "sample_index"],
    "test_filter_leaf_samples_skips_what_the_filter_empties": ["filter_leaf_samples", "empty_leaf_sample",
                                                               "read_leaf_sample"],
    "test_restore_keys_name_leaf_samples_through_blends": ["sample_refs", "names_samples", "batch_worker",
                                                           "SELECTORS"],
    "test_restore_keys_with_a_worker": ["batch_worker", "sample_refs"],
    "test_saved_state_without_workers": ["is_loader_state", "is_worker_checkpoint", "worker_dataset_state",
                                         "saved_class", "saved_inner", "saved_leaf_epoch", "saved_leaf_slices",
                                         "savable_fields", "WrapperDataset"],
    "test_worker_checkpoints": ["shutdown_workers", "worker_root", "worker_sample_counters", "initial_worker_checkpoints",
                                "empty_worker_checkpoint", "is_worker_checkpoint", "worker_dataset_state"],
    "test_stage_failure_tolerance": ["stage_failure_tolerance", "set_default_failure_tolerance"],
    "test_stage_error_context_hands_errors_to_the_handler": ["stage_error_context"],
    "test_quiet_error_prints": ["quiet_error_prints", "stage_error_context"],
    "test_quiet_progress_drops_the_shard_lines_and_the_buffer_bar": ["quiet_progress"],
    "test_one_line_shard_failures_turns_energons_per_shard_traceback_into_a_line": ["one_line_shard_failures"],
    "test_dataset_hook_sees_each_dataset_once": ["DatasetHook", "basic_loader"],
    "test_build_errors_are_recognised_from_energon": ["is_weighted_blend_error", "is_no_cooker_error"],
    "test_saves_declares_what_energon_saves_and_restores": ["saves", "WrapperDataset", "savable_fields"],
    "test_packing_stage_carries_samples_into_the_next_buffer_and_saves_them": ["BufferContext",
                                                                               "CarryingPackingDataset",
                                                                               "packing_stage", "savable_fields"],
    "test_packing_stage_admits_each_sample_and_refills_it_through_energons_restore": ["CarryingPackingDataset",
                                                                                     "packing_stage"],
    "test_basic_loader_reads_a_built_dataset": ["basic_loader", "sample_index"],
    "test_guard_jsonl_lines_checks_each_line_before_energon_parses_it": ["guard_jsonl_lines"],
    "test_dss_paths_resolve_under_the_nvdataset_cache_dir": ["set_nvdataset_cache_dir"],
    "test_files_and_aux_sources": ["load_yaml", "store_kind", "store_local_base", "webdataset_entry",
                                   "filesystem_entry", "store_entry_names", "add_source_info",
                                   "indexed_sample_key", "entry_size", "index_file"],
    "test_aux_sources_on_object_storage": ["remote_entry_range"],
}


def test_every_accessor_is_exercised():
    covered = {name for names in EXERCISED.values() for name in names}
    assert covered == set(surface.__all__), (f"not exercised: {sorted(set(surface.__all__) - covered)}; "
                                             f"not in __all__: {sorted(covered - set(surface.__all__))}")
    for test, names in EXERCISED.items():                 # the list stays honest: each test uses its names
        source = inspect.getsource(globals()[test])
        missing = [n for n in names if not re.search(rf"(?<!\w){n}(?!\w)", source)]
        assert not missing, f"{test} does not use {missing}"
