"""Every file in ``dataset_configs/`` is exercised: each dataset.yaml on a real prepared dataset
through the example text loader config, and the Megatron-LM prepacked loader config."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from conftest import DEMO_TOKENIZER, REPO
from energon_data import text_dataset
from energon_nemotron.config import load_config
from energon_nemotron.loader import build_train_loader

CONFIGS = REPO / "dataset_configs"
COOKER_YAMLS = sorted((CONFIGS / "datasets").glob("*.yaml"))


def test_every_config_file_is_covered():
    names = sorted(p.relative_to(CONFIGS).as_posix() for p in CONFIGS.rglob("*.yaml"))
    assert names == sorted([f"datasets/{p.name}" for p in COOKER_YAMLS]
                           + ["loader_megatron_sft_packed.yaml", "loader_multimodal.yaml", "loader_text.yaml"])
    assert [p.stem for p in COOKER_YAMLS] == ["general_conversations", "nemotron_conversation",
                                              "openai_messages", "openai_messages_offline_packed"]


@pytest.mark.parametrize("dataset_yaml", COOKER_YAMLS, ids=lambda p: p.stem)
def test_dataset_yaml_selects_its_cooker(tmp_path, dataset_yaml):
    cooker = dataset_yaml.stem
    ds, keys = text_dataset(tmp_path / "ds", cooker, n=8)
    shutil.copy(dataset_yaml, ds / ".nv-meta" / "dataset.yaml")      # the example, verbatim
    raw = yaml.safe_load((CONFIGS / "loader_text.yaml").read_text())
    raw["data"]["train"]["path"] = str(ds)
    raw["loader"]["num_workers"] = 0
    cfg = load_config(raw, base=CONFIGS)
    assert cfg.tokenizer.resolve() == DEMO_TOKENIZER.resolve()
    got = [k for b in build_train_loader(cfg, repeat=False) for row in b.sample_keys for k in row]
    if cooker == "openai_messages_offline_packed":
        keys = [f"{k}#{i}" for k in keys for i in range(2)]
    assert sorted(got) == sorted(keys)


def test_megatron_loader_config(tmp_path):
    from energon_nemotron.demo.conversations import make_conversations
    from energon_nemotron.megatron_packed import MegatronSFTPackedEncoder
    from energon_nemotron.megatron_packed.offline_pack import pack_file

    raw = yaml.safe_load((CONFIGS / "loader_megatron_sft_packed.yaml").read_text())
    src = raw["data"]["train"]
    (tmp_path / "raw.jsonl").write_text("".join(json.dumps({"messages": c}) + "\n" for c in make_conversations(30)))
    enc = MegatronSFTPackedEncoder(DEMO_TOKENIZER, src["seq_length"], src["prompt_format"])
    summary = pack_file(tmp_path / "raw.jsonl", tmp_path / "train.jsonl.packed", enc, progress=False)
    src["path"] = str(tmp_path / "train.jsonl.packed")
    batches = list(build_train_loader(load_config(raw, base=CONFIGS)))
    assert len(batches) == summary.rows
    assert sum(len(k) for b in batches for k in b.sample_keys) == summary.conversations


def test_multimodal_loader_config(tmp_path):
    from energon_nemotron.demo.datasets import multimodal_dataset

    ds, keys = multimodal_dataset(tmp_path / "mm", n=10)
    raw = yaml.safe_load((CONFIGS / "loader_multimodal.yaml").read_text())
    raw["data"]["train"]["path"] = str(ds)
    raw["loader"]["num_workers"] = 0
    kinds = {}
    got = []
    for batch in build_train_loader(load_config(raw, base=CONFIGS), repeat=False):
        batch.validate()
        got += [k for row in batch.sample_keys for k in row]
        for span in (s for row in batch.media_spans for s in row):
            kinds[span["kind"]] = kinds.get(span["kind"], 0) + 1
    assert sorted(got) == sorted(keys) and kinds == {"image": 6, "video": 2, "audio": 2}
