"""What the loader reads about an Energon dataset at start (issue 14, items 2, 3, 6 and 10).

Damaged shards and indexes end in one ``DatasetError`` naming the shard, what is wrong and the fix
(found at start when cheap, else at read, with 0 and 2 workers, under ``on_error`` raise and skip);
a metadataset naming a missing dataset, unknown or mistyped subflavor keys and unknown cookers are a
``ConfigError`` at start naming the file; the resume fingerprint covers every file that shapes the
stream (dataset.yaml, metadatasets), so a changed one refuses the old state naming the file.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bad_inputs import SHARD_DAMAGE, change_count, damage_shard
from conftest import DEMO_TOKENIZER
from energon_data import jsonl_dataset, text_dataset
from energon_nemotron.errors import ConfigError
from energon_nemotron.loading import build_train_loader

SHARD = "parts/data-1.tar"          # the middle one of three shards of 8 samples
MIX = "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend_epochized:\n"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A real prepared crude dataset (write_shards + energon prepare): 24 samples, 3 shards."""
    ds, keys = text_dataset(tmp_path_factory.mktemp("prepared") / "ds", "openai_messages", n=24, per_shard=8)
    return ds, keys


def copy(prepared, tmp_path: Path, name: str = "ds") -> Path:
    return Path(shutil.copytree(prepared[0], tmp_path / name))


def config(path: Path, workers: int = 0, on_error: str = "raise", default_cooker=None) -> dict:
    return {"tokenizer": str(DEMO_TOKENIZER),
            "task_encoder": {"name": "nemotron_multimodal", "options": {"prompt_format": "tokenizer",
                                                                        "seq_length": 1024}},
            "data": {"train": {"path": str(path)}, "default_cooker": default_cooker},
            "loader": {"batch_size": 1, "num_workers": workers, "shuffle_buffer_size": 10, "seed": 7,
                       "on_error": on_error}}


def set_subflavors(ds: Path, subflavors: dict) -> Path:
    path = ds / ".nv-meta" / "dataset.yaml"
    meta = yaml.safe_load(path.read_text())
    meta["subflavors"] = subflavors
    path.write_text(yaml.safe_dump(meta))
    return path


def dataset_error(excinfo) -> str:
    assert type(excinfo.value).__name__ == "DatasetError", f"{type(excinfo.value).__name__}: {excinfo.value}"
    return str(excinfo.value)


# --- items 6 and 10: damaged shards and indexes -------------------------------------------------

START_CASES = {**SHARD_DAMAGE, "raise_count": "counts 10 samples but the index data-1.tar.idx lists 8",
               "lower_count": "counts 6 samples but the index data-1.tar.idx lists 8 (the last 2 samples would be"}


@pytest.mark.parametrize("on_error", ["raise", "skip"])
@pytest.mark.parametrize("how", list(START_CASES))
def test_damage_found_at_start_names_the_shard(prepared, tmp_path, how, on_error):
    ds = copy(prepared, tmp_path)
    if how.endswith("_count"):
        change_count(ds, SHARD, 2 if how == "raise_count" else -2)
    else:
        damage_shard(ds / SHARD, how)
    with pytest.raises(ConfigError) as e:
        build_train_loader(config(ds, on_error=on_error), repeat=False)      # before any sample is read
    msg = dataset_error(e)
    assert f"{ds / SHARD}: " in msg and START_CASES[how] in msg
    assert "data-0.tar" not in msg and "data-2.tar" not in msg            # only the damaged shard
    assert f"re-run `energon prepare` on: {ds}" in msg


@pytest.mark.parametrize("on_error", ["raise", "skip"])
@pytest.mark.parametrize("workers", [0, 2])
def test_garbage_header_inside_a_shard_stops_the_run_naming_shard_and_sample(prepared, tmp_path, workers, on_error):
    ds = copy(prepared, tmp_path)
    damage_shard(ds / SHARD, "garbage_header")            # the header of the shard's sample 4 (key ds-00012)
    loader = build_train_loader(config(ds, workers, on_error), repeat=False)   # cheap checks pass
    with pytest.raises(ConfigError) as e:
        for _ in loader:
            pass
    msg = dataset_error(e)
    assert msg.startswith(f"{ds / SHARD}: sample 4 of the shard (key 'ds-00012') cannot be read: no valid tar "
                          "header at byte ")
    assert f"re-run `energon prepare {ds}`" in msg and "Traceback" not in msg
    assert loader.skipped() == {}                          # a damaged shard is never a counted skip


def test_shard_deleted_after_start_is_named_at_read(prepared, tmp_path):
    ds = copy(prepared, tmp_path)
    loader = build_train_loader(config(ds), repeat=False)
    damage_shard(ds / SHARD, "delete")
    with pytest.raises(ConfigError) as e:
        list(loader)
    msg = dataset_error(e)
    assert msg.startswith(f"{ds / SHARD}: sample ") and "the shard is missing" in msg and "energon prepare" in msg


def test_preview_reports_one_error_line_from_a_worker(prepared, tmp_path):
    ds = copy(prepared, tmp_path)
    damage_shard(ds / SHARD, "garbage_header")
    cfg = tmp_path / "loader.yaml"
    cfg.write_text(yaml.safe_dump(config(ds, workers=2, on_error="skip")))
    res = subprocess.run([sys.executable, "-m", "energon_nemotron.cli", "preview", str(cfg), "--json"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    assert re.search(rf"^error: {re.escape(str(ds / SHARD))}: sample 4 of the shard .*energon prepare",
                     res.stderr, re.M), res.stderr[-2000:]


def test_changed_jsonl_is_found_at_start(tmp_path):
    path, _ = jsonl_dataset(tmp_path / "chat.jsonl", n=5)
    with open(path, "a") as f:
        f.write('{"messages": [{"role": "user", "content": "added after prepare"}]}\n')
    with pytest.raises(ConfigError) as e:
        build_train_loader(config(path, default_cooker="openai_messages"), repeat=False)
    assert "the file changed after `energon prepare`" in dataset_error(e)


def test_metadataset_naming_a_missing_dataset(prepared, tmp_path):
    copy(prepared, tmp_path)
    (tmp_path / "inner").mkdir()
    (tmp_path / "inner" / "inner.yaml").write_text(MIX + "      - {repetitions: 1, path: ../ds}\n"
                                                         "      - {repetitions: 1, path: ../gone}\n")
    (tmp_path / "outer.yaml").write_text(MIX + "      - {repetitions: 1, path: inner/inner.yaml}\n")
    with pytest.raises(ConfigError, match=re.escape(f"{tmp_path / 'inner' / 'inner.yaml'}: dataset "
                                                    f"{tmp_path / 'inner' / '..' / 'gone'} does not exist")):
        build_train_loader(config(tmp_path / "outer.yaml"), repeat=False)


# --- item 3: subflavor keys ---------------------------------------------------------------------

SUBFLAVOR_CASES = [
    ({"train_only_on_last_asistant_turn": True},
     r"unknown subflavor 'train_only_on_last_asistant_turn' .*valid keys: aux_data_prefixes, cooker, data_augment, "
     r"media_source, skip_chat_template, tool_response_as_turn_boundary, train_only_on_last_assistant_turn; did you "
     r"mean 'train_only_on_last_assistant_turn'\?"),
    ({"skip_chat_template": "true"}, r"subflavor 'skip_chat_template' .*must be true or false, got 'true' \(str\)"),
    ({"cooker": "openai_message"}, r"subflavor cooker: 'openai_message' .*no registered cooker.*did you mean "
                                   r"'openai_messages'\?"),
    ({"asr_prompt": "Transcribe."}, r"subflavor 'asr_prompt' .*read only by the cooker\(s\) granary_asr, not by this "
                                    r"dataset's cooker 'openai_messages'"),
]


@pytest.mark.parametrize("where", ["dataset.yaml", "metadataset"])
@pytest.mark.parametrize("subflavors, expected", SUBFLAVOR_CASES, ids=["typo", "quoted_bool", "cooker", "other_cookers"])
def test_bad_subflavors_are_a_config_error_at_start_naming_the_file(prepared, tmp_path, where, subflavors, expected):
    ds = copy(prepared, tmp_path)
    if where == "dataset.yaml":
        file, source = set_subflavors(ds, {"cooker": "openai_messages", **subflavors}), ds
    else:
        source = file = tmp_path / "mix.yaml"
        inline = yaml.safe_dump(subflavors, default_flow_style=True).strip()
        file.write_text(MIX + f"      - {{repetitions: 1, path: ds, subflavors: {inline}}}\n")
    with pytest.raises(ConfigError, match=re.escape(str(file)) + ": " + expected):
        build_train_loader(config(source, on_error="skip"), repeat=False)


def test_subflavors_merge_as_energon_does(prepared, tmp_path):
    """An outer level overrides an inner one: the dataset.yaml's quoted "true" never reaches the
    cooker, so the source is valid; Energon's own ``__name__`` keys are allowed."""
    ds = copy(prepared, tmp_path)
    set_subflavors(ds, {"cooker": "openai_messages", "skip_chat_template": "true"})
    (tmp_path / "mix.yaml").write_text(MIX + "      - {repetitions: 1, path: ds, subflavors: "
                                             "{skip_chat_template: false, __subflavor__: legacy}}\n")
    keys = [k for b in build_train_loader(config(tmp_path / "mix.yaml"), repeat=False) for row in b.sample_keys
            for k in row]
    assert sorted(keys) == sorted(prepared[1])
    with pytest.raises(ConfigError, match=r"dataset.yaml: subflavor 'skip_chat_template'"):
        build_train_loader(config(ds), repeat=False)


def test_declared_subflavor_keys_per_cooker():
    from energon_nemotron.cookers import subflavor_keys
    from energon_nemotron.cookers.selection import CookerSelection
    from energon_nemotron.cookers.subflavors import subflavor_problems
    from energon_nemotron.guards import Leaf
    from energon_nemotron.registry import COOKERS

    assert subflavor_keys("granary_asr") == {"cooker": str, "skip_chat_template": bool, "media_source": str,
                                             "aux_data_prefixes": dict, "data_augment": bool, "asr_prompt": str}
    assert all(subflavor_keys(c)["train_only_on_last_assistant_turn"] is bool for c in COOKERS.names()
               if c != "granary_asr")
    asr = Leaf(Path("/data/asr"), "webdataset", "train", {"cooker": "granary_asr", "asr_prompt": "Say it."})
    assert subflavor_problems(asr, CookerSelection()) == []
    asr.subflavors["asr_prompt"] = 3
    assert "must be a string, got 3" in subflavor_problems(asr, CookerSelection())[0]
    bare = Leaf(Path("/data/chat.jsonl"), "jsonl", "train", {"skip_chat_template": True})
    assert subflavor_problems(bare, CookerSelection(None, "openai_messages")) == []
    assert "name no registered cooker" in subflavor_problems(bare, CookerSelection())[0]


# --- item 2: the fingerprint covers the files that shape the stream ------------------------------

def saved_state(source: Path) -> tuple[dict, list]:
    loader = build_train_loader(config(source))
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    return state, next(it).sample_keys


def test_fingerprint_refuses_a_changed_dataset_yaml(prepared, tmp_path):
    ds = copy(prepared, tmp_path)
    state, following = saved_state(ds)
    same = build_train_loader(config(ds))
    same.load_state_dict(state)                        # an unchanged tree resumes
    assert next(iter(same)).sample_keys == following
    file = set_subflavors(ds, {"cooker": "openai_messages", "skip_chat_template": True})
    with pytest.raises(ConfigError, match=rf"different configuration(.|\n)*\n  train file "
                                          rf"{re.escape(str(file.resolve()))}: saved \"\w+\" != now \"\w+\""):
        build_train_loader(config(ds)).load_state_dict(state)


def test_fingerprint_refuses_a_changed_metadataset_not_a_comment(prepared, tmp_path):
    copy(prepared, tmp_path)
    mix = tmp_path / "mix.yaml"
    mix.write_text(MIX + "      - {repetitions: 1, path: ds}\n")
    state, _ = saved_state(mix)
    mix.write_text("# a comment changes nothing\n" + mix.read_text())
    build_train_loader(config(mix)).load_state_dict(state)
    mix.write_text(MIX + "      - {repetitions: 1, path: ds, subflavors: {train_only_on_last_assistant_turn: true}}\n")
    with pytest.raises(ConfigError, match=rf"\n  train file {re.escape(str(mix.resolve()))}: saved"):
        build_train_loader(config(mix)).load_state_dict(state)
