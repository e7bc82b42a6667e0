"""What a hostile run hit (issue 46, crash items): each ends in one clear line, exit 2 from the CLI
and a typed error from the API.

- ``prepare`` on a folder that cannot be written (a read-only mount of raw tars, of a prepared
  folder, of the shards' subfolder, of a ``.jsonl``'s folder): the folder and why are named before
  Energon runs, none of Energon's per-shard tracebacks get through;
- a split with no shards (``split: val`` where ``split.yaml`` lists none): ``stats``, ``preview``
  and the loader API (0 and 2 workers) name the dataset, the split and the splits that have shards.

The read-only mount is real: a bind mount with ``ro`` in a private mount namespace (``unshare``;
a user namespace maps the caller to root there). Where the kernel refuses namespaces, the folder
is made read-only by permissions (which root would ignore: then the test fails, saying so).
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from conftest import DEMO_TOKENIZER
from energon_data import text_dataset
from energon_nemotron.errors import ConfigError
from energon_nemotron.loading import build_train_loader

CLI = [sys.executable, "-m", "energon_nemotron.cli"]
API = ("import sys\nfrom energon_nemotron.errors import ConfigError\nfrom energon_nemotron.loading import "
       "PrepareOptions, prepare_dataset\ntry:\n    prepare_dataset(sys.argv[1], sys.argv[2], "
       "PrepareOptions(workers=int(sys.argv[3]), reindex=sys.argv[4] == '1', progress=False))\n"
       "except ConfigError as e:\n    print('ConfigError:', e)\n    sys.exit(3)\n")


@functools.lru_cache(maxsize=None)
def _namespaces_work() -> bool:
    """Whether a read-only bind mount in a private mount namespace can be made here."""
    with tempfile.TemporaryDirectory() as probe:
        res = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                              f"mount --bind -o ro {probe} {probe} && ! touch {probe}/x 2>/dev/null"],
                             capture_output=True, timeout=60)
    return res.returncode == 0


def read_only_run(folder: Path, argv: list[str]) -> subprocess.CompletedProcess:
    """``argv`` run with ``folder`` read-only (see the module docstring)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    if _namespaces_work():
        script = f"mount --bind -o ro {shlex.quote(str(folder))} {shlex.quote(str(folder))} && exec \"$@\""
        argv = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, "sh", *argv]
        return subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert os.getuid() != 0, "a read-only folder needs a mount namespace (unshare) or a user other than root"
    subprocess.run(["chmod", "-R", "a-w", str(folder)], check=True)
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(folder)], check=True)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A prepared crude dataset: 24 samples in 3 shards, all in train."""
    return text_dataset(tmp_path_factory.mktemp("hostile") / "ds", "openai_messages", n=24, per_shard=8)[0]


def raw_copy(prepared: Path, to: Path) -> Path:
    """The dataset's tar shards alone (no ``.nv-meta``, no ``.idx``) under ``to``."""
    shutil.copytree(prepared / "parts", to / "parts", ignore=shutil.ignore_patterns("*.idx"))
    return to


def one_error_line(res: subprocess.CompletedProcess, code: int = 2) -> str:
    """The command's single line of error output, checked: exit ``code``, no traceback."""
    said = (res.stdout + res.stderr).strip()
    assert res.returncode == code, said[-3000:]
    assert "Traceback" not in said and "Skipping it" not in said, said[-3000:]
    assert len(said.splitlines()) == 1, said[-3000:]
    return said


@pytest.mark.parametrize("workers", [1, 2])
def test_prepare_on_a_read_only_mount_of_raw_tars_names_the_folder(prepared, tmp_path, workers):
    raw = raw_copy(prepared, tmp_path / "raw")
    cli = one_error_line(read_only_run(raw, [*CLI, "prepare", str(raw), "--cooker", "openai_messages",
                                             "--num-workers", str(workers), "--no-progress"]))
    assert cli.startswith(f"error: {raw}: cannot write there (") and ".nv-meta/" in cli, cli
    api = one_error_line(read_only_run(raw, [sys.executable, "-c", API, str(raw), "openai_messages",
                                             str(workers), "0"]), code=3)
    assert api == "ConfigError: " + cli.removeprefix("error: "), api
    assert not (raw / ".nv-meta").exists() and not list(raw.rglob("*.idx"))


def test_prepare_names_a_read_only_shard_folder(prepared, tmp_path):
    raw = raw_copy(prepared, tmp_path / "raw")
    cli = one_error_line(read_only_run(raw / "parts", [*CLI, "prepare", str(raw), "--cooker", "openai_messages",
                                                       "--num-workers", "2", "--no-progress"]))
    assert cli.startswith(f"error: {raw / 'parts'}: cannot write there (") and "SHARD.tar.idx" in cli, cli


@pytest.mark.parametrize("reindex", [False, True])
def test_prepare_cooker_on_a_read_only_prepared_folder_names_its_metadata(prepared, tmp_path, reindex):
    ds = Path(shutil.copytree(prepared, tmp_path / "ds"))
    before = (ds / ".nv-meta" / "dataset.yaml").read_text()
    argv = [*CLI, "prepare", str(ds), "--cooker", "general_conversations", "--no-progress"]
    cli = one_error_line(read_only_run(ds, argv + (["--reindex"] if reindex else [])))
    assert cli.startswith(f"error: {ds / '.nv-meta'}: cannot write there (") and "dataset.yaml" in cli, cli
    api = one_error_line(read_only_run(ds, [sys.executable, "-c", API, str(ds), "general_conversations", "2",
                                            "1" if reindex else "0"]), code=3)
    assert api == "ConfigError: " + cli.removeprefix("error: "), api
    assert (ds / ".nv-meta" / "dataset.yaml").read_text() == before


def test_prepare_of_a_jsonl_in_a_read_only_folder_names_it(tmp_path):
    folder = tmp_path / "j"
    folder.mkdir()
    (folder / "data.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    cli = one_error_line(read_only_run(folder, [*CLI, "prepare", str(folder / "data.jsonl"), "--cooker",
                                                "openai_messages"]))
    assert cli.startswith(f"error: {folder}: cannot write there (") and "data.jsonl.idx" in cli, cli


def loader_config(path: Path, workers: int, split: str = "val") -> dict:
    return {"tokenizer": str(DEMO_TOKENIZER),
            "task_encoder": {"name": "nemotron_multimodal", "options": {"prompt_format": "nemotron6",
                                                                        "seq_length": 1024}},
            "data": {"train": {"path": str(path), "split": split}},
            "loader": {"batch_size": 1, "num_workers": workers, "seed": 7}}


def expected_empty_split(ds: Path) -> str:
    return (f"{ds}: split 'val' has no shards (split.yaml lists none for it; splits with shards: train "
            "(3 shards)); set the source's split to one that has shards")


@pytest.mark.parametrize("command", ["stats", "preview"])
def test_stats_and_preview_of_a_split_without_shards_name_it(prepared, tmp_path, command):
    cfg = tmp_path / "loader.yaml"
    cfg.write_text(yaml.safe_dump(loader_config(prepared, 0)))
    res = subprocess.run([*CLI, command, str(cfg), "--no-progress"] if command == "stats" else [*CLI, command, str(cfg)],
                         capture_output=True, text=True, timeout=300)
    said = one_error_line(res)
    assert said.startswith("error: " + expected_empty_split(prepared)), said
    assert "--reindex --split-ratio" in said


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_on_a_split_without_shards_is_a_config_error(prepared, workers):
    with pytest.raises(ConfigError) as e:
        build_train_loader(loader_config(prepared, workers))
    assert str(e.value).startswith(expected_empty_split(prepared)), e.value
    assert "\n" not in str(e.value)


def test_a_metadataset_leaf_with_an_empty_split_is_named_within_the_source(prepared, tmp_path):
    mix = tmp_path / "mix.yaml"
    mix.write_text("__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
                   f"      - weight: 1\n        path: {prepared}\n        split_part: val\n")
    with pytest.raises(ConfigError) as e:
        build_train_loader(loader_config(mix, 0, split="train"))
    assert str(e.value).startswith(f"the data source {mix}: " + expected_empty_split(prepared)), e.value


@pytest.mark.parametrize("workers", [1, 2])
def test_prepare_of_an_unreadable_shard_says_so_in_one_line_per_shard(prepared, tmp_path, workers):
    raw = raw_copy(prepared, tmp_path / "raw")
    (raw / "parts" / "data-1.tar").write_bytes(bytes(range(256)) * 80)       # not a tar in any compression
    res = subprocess.run([*CLI, "prepare", str(raw), "--cooker", "openai_messages", "--num-workers", str(workers),
                          "--no-progress"], capture_output=True, text=True, timeout=300)
    said = (res.stdout + res.stderr).strip()
    assert res.returncode == 2 and "Traceback" not in said, said[-3000:]
    shard, error = said.splitlines()
    assert shard.startswith("Shard failed to load: 'parts/data-1.tar' (ReadError: ") and "invalid header" in shard
    assert error == f"error: {raw}: Energon's prepare stopped: Shard parts/data-1.tar has no samples.", said
