"""End to end on real Energon: shards → ``energon prepare`` → cooker by subflavor → task encoder
→ packing → ``PackedBatch``, through a YAML loader config, with 0 and 2 workers."""

from __future__ import annotations

import json

import pytest
import torch

from energon_data import jsonl_dataset, loader_yaml, text_dataset
from energon_nemotron.errors import ConfigError, DataError
from energon_nemotron.loading import build_train_loader
from energon_nemotron.inspection import run_preview

PACKING = {"algorithm": "best_fit_decreasing", "buffer_size": 16, "pad_multiple": 4, "max_sequences_per_bin": None}


def epoch_keys(cfg_path):
    keys, batches = [], []
    for batch in build_train_loader(cfg_path, repeat=False):
        batch.validate()
        batches.append(batch)
        keys += [k for row in batch.sample_keys for k in row]
    return keys, batches


@pytest.mark.parametrize("cooker", ["openai_messages", "general_conversations", "nemotron_conversation",
                                    "openai_messages_offline_packed"])
def test_each_cooker_one_epoch_every_sample_once(tmp_path, cooker):
    ds, keys = text_dataset(tmp_path / "ds", cooker, n=20)
    cfg = loader_yaml(tmp_path / "loader.yaml", {"path": "ds", "split": "train"}, packing=PACKING)
    got, batches = epoch_keys(cfg)
    if cooker == "openai_messages_offline_packed":
        keys = [f"{k}#{i}" for k in keys for i in range(2)]     # two conversations per row
    assert sorted(got) == sorted(keys) and len(got) == len(set(got))
    assert all(b.tokens.shape == (1, 1024) for b in batches)
    assert all(int(c[-1]) == 1024 for b in batches for c in b.cu_seqlens_padded)
    assert sum(b.num_valid_tokens for b in batches) > 0


@pytest.mark.slow
def test_two_workers_every_sample_once_many_shards(tmp_path):
    _, keys = text_dataset(tmp_path / "ds", "openai_messages", n=40, per_shard=5)
    cfg2 = loader_yaml(tmp_path / "w2.yaml", {"path": "ds"}, packing=PACKING, workers=2)
    got, _ = epoch_keys(cfg2)
    assert sorted(got) == sorted(keys)


def test_two_workers_small(tmp_path):
    _, keys = text_dataset(tmp_path / "ds", "openai_messages", n=12, per_shard=3)
    cfg = loader_yaml(tmp_path / "w2.yaml", {"path": "ds"}, packing=PACKING, workers=2)
    got, _ = epoch_keys(cfg)
    assert sorted(got) == sorted(keys)


def test_without_packing_one_sample_per_row(tmp_path):
    _, keys = text_dataset(tmp_path / "ds", "general_conversations", n=6)
    cfg = loader_yaml(tmp_path / "l.yaml", {"path": "ds"}, packing=None, prompt_format="nemotron6")
    got, batches = epoch_keys(cfg)
    assert sorted(got) == sorted(keys)
    assert all(len(b.sample_keys[0]) == 1 and b.cu_seqlens_padded[0].tolist()[-1] == 1024 for b in batches)


def test_labels_never_cross_a_source_boundary(tmp_path):
    text_dataset(tmp_path / "ds", "openai_messages", n=10)
    cfg = loader_yaml(tmp_path / "l.yaml", {"path": "ds"}, packing=PACKING, prompt_format="nemotron-h")
    for batch in build_train_loader(cfg, repeat=False):
        real, padded = batch.cu_seqlens[0].tolist(), batch.cu_seqlens_padded[0].tolist()
        for k in range(len(real) - 1):
            last = padded[k] + (real[k + 1] - real[k]) - 1
            assert batch.labels[0, last].item() == -100 and batch.loss_mask[0, last].item() == 0
            assert batch.position_ids[0, padded[k]].item() == 0


def test_metadataset_blend_selects_cookers_by_subflavor(tmp_path):
    text_dataset(tmp_path / "a", "openai_messages", n=6)
    _, keys_b = text_dataset(tmp_path / "b", "general_conversations", n=6)
    # dataset b's own yaml says general_conversations; the metadataset overrides a's to prove merging
    (tmp_path / "mix.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend_epochized:\n"
        "      - {repetitions: 1, path: a, subflavors: {cooker: openai_messages}}\n"
        "      - {repetitions: 1, path: b}\n")
    cfg = loader_yaml(tmp_path / "l.yaml", {"path": "mix.yaml", "split": "train"}, packing=PACKING)
    got, _ = epoch_keys(cfg)
    assert len(got) == 12 and len(set(got)) == 12 and set(keys_b) <= set(got)
    # a weighted blend has no epoch: one-epoch reading is refused clearly, N batches work
    (tmp_path / "weighted.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
        "      - {weight: 3, path: a}\n      - {weight: 1, path: b}\n")
    cfg = loader_yaml(tmp_path / "w.yaml", {"path": "weighted.yaml"}, packing=PACKING)
    with pytest.raises(ConfigError, match="a weighted blend has no epoch"):
        build_train_loader(cfg, repeat=False)
    assert run_preview(str(cfg), batches=3, as_json=True, out=open(tmp_path / "out.txt", "w")) == 0


def test_jsonl_dataset_needs_a_default_cooker(tmp_path):
    _, keys = jsonl_dataset(tmp_path / "chat.jsonl", n=9)
    cfg = loader_yaml(tmp_path / "l.yaml", {"path": "chat.jsonl"}, packing=PACKING, default_cooker="openai_messages")
    got, _ = epoch_keys(cfg)
    assert sorted(got, key=lambda k: int(k.rsplit(":", 1)[1])) == keys
    bad = loader_yaml(tmp_path / "bad.yaml", {"path": "chat.jsonl"}, packing=PACKING)
    with pytest.raises(ConfigError, match=r"subflavors name no registered cooker.*data\.default_cooker"):
        build_train_loader(bad, repeat=False)


def test_over_length_skip_is_counted_and_error_names_the_key(tmp_path, capsys):
    text_dataset(tmp_path / "ds", "openai_messages", n=8)
    cfg = loader_yaml(tmp_path / "skip.yaml", {"path": "ds"}, packing=PACKING, seq_length=256,
                      extra_options={"over_length": "skip"})
    assert run_preview(str(cfg), as_json=True) == 0
    lines = capsys.readouterr().out.splitlines()
    summary = json.loads(lines[-1])["summary"]
    assert summary["skipped"].get("over_length", 0) > 0
    assert summary["samples"] + summary["skipped"]["over_length"] == 8
    err = loader_yaml(tmp_path / "err.yaml", {"path": "ds"}, packing=PACKING, seq_length=256)
    with pytest.raises(DataError, match=r"ds-\d{5}: sample takes \d+ positions, more than seq_length=256"):
        list(build_train_loader(err, repeat=False))
    trunc = loader_yaml(tmp_path / "trunc.yaml", {"path": "ds"}, packing=PACKING, seq_length=256,
                        extra_options={"over_length": "truncate"})
    got, _ = epoch_keys(trunc)
    assert len(got) == 8


def test_preview_json_lines_and_human_view(tmp_path, capsys):
    _, keys = text_dataset(tmp_path / "ds", "openai_messages", n=10)
    cfg = loader_yaml(tmp_path / "l.yaml", {"path": "ds"}, packing=PACKING)
    assert run_preview(str(cfg), as_json=True) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    summary = lines[-1]["summary"]
    assert summary["samples"] == 10 and summary["batches"] == len(lines) - 1 and summary["skipped"] == {}
    first = lines[0]
    assert set(first) >= {"sample_keys", "tokens", "labels", "loss_mask", "position_ids", "cu_seqlens",
                          "cu_seqlens_padded"}
    assert len(first["tokens"][0]) == 1024 and first["cu_seqlens_padded"][0][-1] == 1024
    assert sorted(k for line in lines[:-1] for row in line["sample_keys"] for k in row) == sorted(keys)
    total = sum(c[-1] for line in lines[:-1] for c in line["cu_seqlens"])
    assert summary["fill_ratio"] == pytest.approx(total / (1024 * summary["batches"]), abs=1e-6)
    assert run_preview(str(cfg), batches=1, color="never") == 0
    out = capsys.readouterr().out
    assert "=== batch 0" in out and "segment 0" in out and "⟦" in out and "<|im_start|>assistant" in out
    assert "«pad×" in out


def test_megatron_sft_packed_source_through_the_loader(tmp_path):
    from conftest import FIXTURE_TOKENIZER, MEGATRON_FIXTURES, load_reference

    cfg = tmp_path / "m.yaml"
    cfg.write_text(json.dumps({"tokenizer": str(FIXTURE_TOKENIZER), "data": {"train": {
        "format": "megatron_sft_packed", "path": str(MEGATRON_FIXTURES / "train.jsonl.packed"), "seq_length": 96,
        "prompt_format": "nemotron-h-aligned", "context_parallel_size": 2}},
        "loader": {"batch_size": 2, "num_workers": 0, "shuffle_buffer_size": None}}))     # file order
    [batch] = list(build_train_loader(cfg))
    ref = load_reference("nemotron-h-aligned", 2)["rows"]
    assert batch.tokens.tolist() == [r["tokens"] for r in ref]
    assert batch.loss_mask.tolist() == [r["loss_mask"] for r in ref]
    assert [c.tolist() for c in batch.cu_seqlens] == [r["cu_seqlens_stripped"] for r in ref]
    assert torch.equal(batch.cu_seqlens_padded[0], batch.cu_seqlens[0])
