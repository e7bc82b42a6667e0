"""Project batches through Megatron-Bridge 0.6.2's own training steps (megatron-core 0.19.2).

The batches come from the real loader over ``energon prepare``d shards; the conversion is
``integrations.megatron_bridge``; the checks run Bridge's code in a subprocess
(``tests/references/bridge_steps.py``, which says what stands in for what). For every case the
model-side merge of Bridge's model must give back the project's expanded row at every position
(ids, labels, loss mask), its loss must count the project's trained tokens, the sound encoder's
lengths must equal the ``<so_embedding>`` counts and the vision packed-sequence params the
per-image patch counts.
"""

from __future__ import annotations

import math

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from energon_data import loader_yaml
from bridge_data import audio_dataset, batches, image_dataset, kinds, vocab
from energon_nemotron.demo.datasets import multimodal_dataset, text_dataset
from energon_nemotron.integrations import to_gpt_step_batch, to_nemotron_omni_step_batch

REPO = Path(__file__).resolve().parents[1]
RUNNER = REPO / "tests" / "references" / "bridge_steps.py"
PACKING = {"algorithm": "best_fit_decreasing", "buffer_size": 8, "pad_multiple": 8, "max_sequences_per_bin": None}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """name -> (PackedBatch, Bridge dict, model config) for every case."""
    root = tmp_path_factory.mktemp("bridge")
    multimodal_dataset(root / "mm", n=15)
    audio_dataset(root / "au")
    text_dataset(root / "tx", "general_conversations", n=24)
    image_dataset(root / "im")
    v = vocab()
    model = {"image_token_id": v["<image>"], "sound_token_id": v["<so_embedding>"], "vocab_size": max(v.values()) + 1}
    cases = {}

    def add(name, cfg_name, train, preset, n, seq_length=4096, cp=1, step="nemotron_omni"):
        extra = {"preset": preset} if preset else {}
        if cp > 1:
            extra["context_parallel_size"] = cp
        cfg = loader_yaml(root / cfg_name, train, packing=PACKING, seq_length=seq_length,
                          prompt_format="nemotron6", extra_options={**extra, "video": {"min_frames": 2, "max_frames": 4}})
        t = 2 if preset == "nemotron_omni_temporal" else 1
        for k, batch in enumerate(batches(cfg, n)):
            if step == "gpt":
                if any(batch.media_spans[0]):
                    continue
                d = to_gpt_step_batch(batch)
            else:
                d = to_nemotron_omni_step_batch(batch, temporal_patch_dim=t, image_token_id=model["image_token_id"])
            cases[f"{name}-{k}"] = (batch, d, {**model, "temporal_patch_dim": t, "seq_length": batch.seq_length})

    add("temporal", "t.yaml", {"path": "mm"}, "nemotron_omni_temporal", 6)
    add("temporal-cp2", "t2.yaml", {"path": "mm"}, "nemotron_omni_temporal", 3, cp=2)
    add("dynamic", "d.yaml", {"path": "im"}, "nemotron_omni", 4)
    add("audio", "a.yaml", {"path": "au"}, "nemotron_omni", 4, seq_length=2048)
    add("text", "x.yaml", {"path": "tx"}, "nemotron_omni", 2)
    add("gpt", "g.yaml", {"path": "tx"}, None, 3, step="gpt")
    return cases


def run_bridge(cases: list, folder: Path) -> dict:
    """name -> result of ``tests/references/bridge_steps.py`` on ``cases``."""
    torch.save(cases, folder / "cases.pt")
    proc = subprocess.run([sys.executable, str(RUNNER), str(folder / "cases.pt"), str(folder / "results.pt")],
                          capture_output=True, text=True, timeout=900, cwd=REPO)
    if proc.returncode:
        pytest.fail(f"the Bridge reference run failed:\n{proc.stderr[-4000:]}", pytrace=False)
    return {r["name"]: r for r in torch.load(folder / "results.pt", weights_only=False)}


@pytest.fixture(scope="module")
def bridge(project, tmp_path_factory):
    """name -> what Bridge's code produced for that case."""
    folder = tmp_path_factory.mktemp("bridge_run")
    cases = [{"name": name, "step": "gpt" if name.startswith("gpt") else "nemotron_omni", "batch": d,
              "model": model, "depth": 3} for name, (_, d, model) in project.items()]
    # the control: a row with images handed over expanded, as a PackedBatch holds it
    name = next(n for n, (b, _, _) in project.items() if n.startswith("dynamic") and "image" in kinds(b))
    batch, d, model = project[name]
    expanded = {**d, **{k: getattr(batch, k)[:1] for k in ("tokens", "labels", "loss_mask", "position_ids")}}
    cases.append({"name": "control-expanded", "step": "nemotron_omni", "batch": expanded, "model": model})
    results = run_bridge(cases, folder)
    control = results.pop("control-expanded")
    assert not control["ok"] and "split_with_sizes" in control["error"], control.get("error")
    failed = {k: r["error"] for k, r in results.items() if not r["ok"]}
    assert not failed, "\n\n".join(f"{k}: {e}" for k, e in failed.items())
    return results


def test_the_cases_cover_what_the_issue_names(project):
    """text only, images, video (temporal), the four audio lengths, mixed packs, CP 2 padding."""
    seen = {name.rsplit("-", 1)[0]: set() for name in project}
    for name, (batch, _, _) in project.items():
        seen[name.rsplit("-", 1)[0]] |= kinds(batch) | ({"mixed"} if len(kinds(batch)) > 1 else set())
    assert {"image", "video", "audio", "mixed"} <= seen["temporal"]
    assert {"image", "mixed"} <= seen["dynamic"] and "video" not in seen["dynamic"]
    assert {"video"} <= seen["temporal-cp2"]
    clips = [s for name, (b, _, _) in project.items() if name.startswith("audio") for s in b.media_spans[0]]
    assert sorted(s.clips for s in clips) == [1, 1, 1, 2]          # 45 s: a 30 s clip and a 15 s one
    assert any(name.startswith("gpt") for name in project)
    assert all(not b.media_spans[0] for name, (b, _, _) in project.items() if name.startswith("text"))


def test_bridge_merge_gives_back_the_project_row(project, bridge):
    for name, (batch, d, _) in project.items():
        if name.startswith("gpt"):
            continue
        got = bridge[name]
        assert torch.equal(got["merged_ids"], batch.tokens[0]), name
        assert torch.equal(got["labels"], batch.labels[0]), name
        assert torch.equal(got["loss_mask"], batch.loss_mask[0]), name
        assert got["loss_tokens"] == int(batch.loss_mask[0].sum()) > 0, name
        # compact on the way in: one <image> per image / tubelet
        assert d["tokens"].shape[1] == batch.seq_length - sum(n - 1 for s in batch.media_spans[0]
                                                              if s.kind != "audio" for _, n in s.runs)


def test_bridge_packed_seq_params_are_the_project_boundaries(project, bridge):
    for name, (batch, _, _) in project.items():
        if name.startswith("gpt"):
            continue
        p = bridge[name]["packed"]
        assert p["qkv_format"] == "thd"
        assert p["cu_seqlens_q"] == p["cu_seqlens_kv"] == batch.cu_seqlens[0].tolist(), name
        assert p["cu_seqlens_q_padded"] == p["cu_seqlens_kv_padded"] == batch.cu_seqlens_padded[0].tolist(), name
        assert p["max_seqlen_q"] == batch.max_seqlen[0] and p["total_tokens"] == batch.seq_length
        # megatron-core's seq_idx for the Mamba layers: one index per packed segment, no run-on
        padded = batch.cu_seqlens_padded[0].tolist()
        idx = p["seq_idx"]
        assert len(idx) == batch.seq_length
        assert [i for i in range(1, len(idx)) if idx[i] != idx[i - 1]] == padded[1:-1], name
        if name.startswith("temporal-cp2"):
            assert all(x % 4 == 0 for x in padded), name               # 2 * CP in merged coordinates


def test_bridge_vision_and_sound_counts(project, bridge):
    for name, (batch, d, _) in project.items():
        if name.startswith("gpt"):
            continue
        got = bridge[name]
        spans = batch.media_spans[0]
        visual = [s for s in spans if s.kind != "audio"]
        if visual:
            units = torch.cat([batch.media["image_sizes"][i] for i in range(len(visual))]).to(torch.int64)
            counts = (units[:, 0] * units[:, 1]).tolist()
            assert got["vision_cu_seqlens"] == [sum(counts[:k]) for k in range(len(counts) + 1)], name
            assert got["vision_images_shape"] == [1, sum(counts), 768] and got["vision_images_dtype"] == "torch.bfloat16"
        else:
            assert got["vision_cu_seqlens"] is None and "imgs_sizes" not in got["forward_keys"]
        audio = [s for s in spans if s.kind == "audio"]
        if audio:
            so = int((batch.tokens[0] == project[name][2]["sound_token_id"]).sum())
            assert sum(got["sound_embedding_lengths"]) == so == sum(s.num_tokens for s in audio), name
            assert got["sound_length"] == d["sound_length"].tolist() and got["sound_clips_dtype"] == "torch.bfloat16"
            assert d["sound_clips"].shape[1] == max(d["sound_length"].tolist())
        else:
            assert "sound_clips" not in got["forward_keys"]


def test_gpt_step_batch_and_mtp_roll(project, bridge):
    """Bridge's ``gpt_step.get_batch`` keeps the row; megatron-core 0.19.2's MTP roll over the
    params Bridge builds from it never crosses a segment and never trains a pad."""
    names = [n for n in project if n.startswith("gpt")]
    assert names
    for name in names:
        batch, _, _ = project[name]
        got = bridge[name]
        for key in ("tokens", "labels", "loss_mask", "position_ids"):
            assert torch.equal(got[key], getattr(batch, key)[0]), (name, key)
        padded = batch.cu_seqlens_padded[0]
        assert got["packed"]["cu_seqlens_q"] == got["packed"]["cu_seqlens_q_padded"] == padded.tolist()
        assert got["packed"]["total_tokens"] is None     # Bridge 0.6.2's gpt_step drops it (README)
        segment = torch.bucketize(torch.arange(batch.seq_length), padded[1:].to(torch.int64), right=True)
        for depth, (lab, msk) in enumerate(zip(got["mtp_labels"], got["mtp_loss_mask"]), start=1):
            trained = torch.nonzero(msk).reshape(-1)
            target = trained + depth
            assert bool((target < batch.seq_length).all())
            assert torch.equal(segment[trained], segment[target]), (name, depth)
            assert bool((batch.loss_mask[0][target] == 1).all()), (name, depth)
            assert torch.equal(lab[trained], batch.labels[0][target]), (name, depth)


@pytest.mark.slow
def test_task_encoder_inside_bridges_energon_data_module(tmp_path):
    """The encoder with ``output: nemotron_omni_step`` handed to Bridge's own
    ``EnergonMultiModalDataModule`` (its WorkerConfig, no handler of ours): every batch goes
    straight through ``forward_step``; ``on_error: skip`` drops the two broken samples and counts
    them in the batches' ``skipped``, with 0 and 2 workers; ``on_error: raise`` names the sample."""
    image_dataset(tmp_path / "imbad", n=16, bad=(5, 10))
    v = vocab()
    model = {"image_token_id": v["<image>"], "sound_token_id": v["<so_embedding>"], "vocab_size": max(v.values()) + 1,
             "temporal_patch_dim": 1, "seq_length": 2048}
    cases = []
    for policy in ("skip", "raise"):
        cfg = loader_yaml(tmp_path / f"{policy}.yaml", {"path": "imbad"}, packing=PACKING, seq_length=2048,
                          prompt_format="nemotron6",
                          extra_options={"preset": "nemotron_omni", "output": "nemotron_omni_step", "on_error": policy})
        for workers in ((0, 2) if policy == "skip" else (0,)):
            cases.append({"name": f"{policy}-{workers}", "step": "datamodule", "config": str(cfg),
                          "dataset": str(tmp_path / "imbad"), "num_workers": workers, "packing_buffer_size": 8,
                          "batches": 12 if policy == "skip" else 40, "model": model})
    results = run_bridge(cases, tmp_path)
    for name in ("skip-0", "skip-2"):
        r = results[name]
        assert r["ok"] and r["error"] is None, r
        keys = [k for b in r["batches"] for k in b["sample_keys"]]
        assert not {"im-00005", "im-00010"} & set(keys)
        skipped: dict = {}
        for b in r["batches"]:
            for code, n in b["skipped"].items():
                skipped[code] = skipped.get(code, 0) + n
            assert b["loss_tokens"] == b["compact_trained"] > 0
            assert b["telemetry"]["samples"] == len(b["sample_keys"]) and 0 < b["telemetry"]["fill_ratio"] <= 1
            assert {"tokens", "labels", "loss_mask", "cu_seqlens_q", "total_tokens"} <= set(b["keys"])
        # 14 good samples an epoch (Bridge's loader repeats); the buffers read ahead of the batches, and a
        # sample carried into later buffers (packing.carry: at most 4 buffers of 8) is decoded that much later
        epochs = len(keys) / 14
        late = math.ceil(4 * 8 / 14)
        assert list(skipped) == ["corrupt_media"], skipped
        assert 2 * (int(epochs) - late) <= skipped["corrupt_media"] <= 2 * (int(epochs) + 2), (name, skipped, len(keys))
    raised = results["raise-0"]
    assert raised["ok"] and raised["error"] is not None
    assert "im-00005" in raised["error"] or "im-00010" in raised["error"], raised["error"]
