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
from energon_nemotron.loading import build_train_loader

CONFIGS = REPO / "dataset_configs"
COOKER_YAMLS = sorted((CONFIGS / "datasets").glob("*.yaml"))


def test_every_config_file_is_covered():
    names = sorted(p.relative_to(CONFIGS).as_posix() for p in CONFIGS.rglob("*.yaml"))
    assert names == sorted([f"datasets/{p.name}" for p in COOKER_YAMLS]
                           + ["loader_megatron_sft_packed.yaml", "loader_multimodal.yaml", "loader_text.yaml",
                              "metadataset_blend.yaml"])
    from energon_nemotron.registry import COOKERS

    assert [p.stem for p in COOKER_YAMLS] == COOKERS.names()      # one example per registered cooker


@pytest.mark.parametrize("dataset_yaml", COOKER_YAMLS, ids=lambda p: p.stem)
def test_dataset_yaml_selects_its_cooker(tmp_path, dataset_yaml):
    from energon_nemotron.demo.datasets import asr_dataset

    cooker = dataset_yaml.stem
    asr = cooker in ("granary_asr", "nemotron_granary_english_webdataset", "nemotron_granary_english_jsonl")
    ds, keys = asr_dataset(tmp_path / "ds", 6, cooker=cooker) if asr else text_dataset(tmp_path / "ds", cooker, n=8)
    shutil.copy(dataset_yaml, ds / ".nv-meta" / "dataset.yaml")      # the example, verbatim
    raw = yaml.safe_load((CONFIGS / "loader_text.yaml").read_text())
    raw["data"]["train"]["path"] = str(ds)
    raw["loader"]["num_workers"] = 0
    cfg = load_config(raw, base=CONFIGS)
    assert cfg.tokenizer.resolve() == DEMO_TOKENIZER.resolve()
    got = [k for b in build_train_loader(cfg, repeat=False) for row in b.sample_keys for k in row]
    if cooker in ("openai_messages_offline_packed", "nemotron_nano_openai_messages_offline_packed_jsonl"):
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
            kinds[span.kind] = kinds.get(span.kind, 0) + 1
    assert sorted(got) == sorted(keys) and kinds == {"image": 6, "video": 2, "audio": 2}


@pytest.mark.slow
def test_weighted_metadataset_blends_three_datasets(tmp_path):
    from energon_nemotron.demo.datasets import asr_dataset, multimodal_dataset

    out = tmp_path / "demo_out"
    _, text_keys = text_dataset(out / "text_dataset", "openai_messages", n=12)
    _, mm_keys = multimodal_dataset(out / "multimodal_dataset", n=10)
    _, asr_keys = asr_dataset(out / "asr_dataset", 8)
    (tmp_path / "dataset_configs").mkdir()
    shutil.copy(CONFIGS / "metadataset_blend.yaml", tmp_path / "dataset_configs" / "metadataset_blend.yaml")
    raw = yaml.safe_load((CONFIGS / "loader_multimodal.yaml").read_text())
    raw["data"]["train"]["path"] = "metadataset_blend.yaml"
    raw["loader"]["num_workers"] = 0
    raw["packing"]["buffer_size"] = 16
    raw["tokenizer"] = str(DEMO_TOKENIZER)
    cfg = load_config(raw, base=tmp_path / "dataset_configs")
    seen = []
    for _, batch in zip(range(8), build_train_loader(cfg, repeat=True)):
        batch.validate()
        seen += [k for row in batch.sample_keys for k in row]
    assert set(seen) & set(text_keys) and set(seen) & set(mm_keys) and set(seen) & set(asr_keys)
