"""Media end to end: real image/video/audio files in ``energon prepare``d shards → two-phase
encoding → ``PackedBatch`` whose placeholder runs match the media tensors one to one."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import DEMO_TOKENIZER
from energon_data import loader_yaml
from energon_nemotron.demo.datasets import multimodal_dataset
from energon_nemotron.loading import build_train_loader
from energon_nemotron.inspection import run_preview

PACKING = {"algorithm": "best_fit_decreasing", "buffer_size": 8, "pad_multiple": 4, "max_sequences_per_bin": None}
SMALL_MEDIA = {"image": {"min_patches": 64, "max_patches": 256},
               "video": {"target_patches": 64, "min_frames": 2, "max_frames": 4}}


def runs_of(tokens: list[int], tid: int) -> list[tuple[int, int]]:
    """(start, length) of each run of ``tid``."""
    out, i = [], 0
    while i < len(tokens):
        if tokens[i] == tid:
            j = i
            while j < len(tokens) and tokens[j] == tid:
                j += 1
            out.append((i, j - i))
            i = j
        else:
            i += 1
    return out


@pytest.fixture(scope="module")
def media_ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("mm")
    ds, keys = multimodal_dataset(root / "mm", n=15)
    return root, keys


def config(root, name="l.yaml", **kw):
    return loader_yaml(root / name, {"path": "mm"}, packing=kw.pop("packing", PACKING), seq_length=2048,
                       prompt_format=kw.pop("prompt_format", "nemotron6"),
                       extra_options={**SMALL_MEDIA, **kw.pop("extra", {})}, **kw)


def check_batch(batch, vocab):
    batch.validate()
    image_id, sound_id = vocab["<image>"], vocab["<so_embedding>"]
    visual_runs, audio_runs = [], []
    for r in range(batch.batch_size):
        tokens = batch.tokens[r].tolist()
        visual_runs += runs_of(tokens, image_id)
        audio_runs += runs_of(tokens, sound_id)
        for start, n in runs_of(tokens, image_id) + runs_of(tokens, sound_id):
            assert batch.labels[r, start - 1:start + n].eq(-100).all()       # placeholders never trained
    media = batch.media
    spans = [s for row in batch.media_spans for s in row]
    visual = [s for s in spans if s.kind != "audio"]
    audio = [s for s in spans if s.kind == "audio"]
    if visual:
        pv, sizes = media["pixel_values"], media["image_sizes"]
        assert len(pv) == len(visual) == len(sizes) == media["num_frames"].numel()
        # one <image> run per image and per video tubelet, sized patches / 4, in tensor order
        expected = []
        for k, span in enumerate(visual):
            rows = pv[k].shape[0]
            grid = sizes[k]
            assert rows == int((grid[:, 0] * grid[:, 1]).sum())
            assert pv[k].shape[1] == 3 * 16 * 16 and pv[k].dtype == torch.float32
            if span.kind == "image":
                expected.append(rows // 4)
                assert span.num_tokens == rows // 4
            else:
                tubelets = sizes[k].shape[0] // 2
                per = int(grid[0, 0] * grid[0, 1]) // 4
                expected += [per] * tubelets
                assert span.num_tokens == per * tubelets and span.frames <= sizes[k].shape[0]
        assert [n for _, n in visual_runs] == expected
    else:
        assert not visual_runs and "pixel_values" not in media
    if audio:
        feats, lengths = media["sound_features"], media["sound_lengths"]
        assert len(feats) == len(audio) == len(lengths)
        assert [n for _, n in audio_runs] == [s.num_tokens for s in audio]
        for k in range(len(audio)):
            assert feats[k].shape[-1] == 128 and feats[k].shape[0] == lengths[k].numel()
    else:
        assert not audio_runs
    return len(visual), len(audio)


def test_all_modalities_one_epoch(media_ds, demo_tokenizer):
    root, keys = media_ds
    vocab = demo_tokenizer.get_vocab()
    got, n_visual, n_audio = [], 0, 0
    for batch in build_train_loader(config(root), repeat=False):
        v, a = check_batch(batch, vocab)
        n_visual, n_audio = n_visual + v, n_audio + a
        got += [k for row in batch.sample_keys for k in row]
    assert sorted(got) == sorted(keys)
    # 15 samples: kinds cycle text, image, 2 images, video, audio
    assert n_visual == 3 * 1 + 3 * 2 + 3 and n_audio == 3


def test_two_phase_decodes_only_selected_samples(media_ds):
    """Counters: after k packs, the media decoded are exactly those of the samples in the packs."""
    from megatron.energon import WorkerConfig, get_savable_loader, get_train_dataset
    from megatron.energon.errors import reraise_exception

    from energon_nemotron.config import load_config
    from energon_nemotron.loading import build_task_encoder

    root, _ = media_ds
    cfg = load_config(config(root, packing={**PACKING, "buffer_size": 15}))
    enc = build_task_encoder(cfg)
    ds = get_train_dataset(str(cfg.data.train.path), split_part="train", batch_size=1, packing_buffer_size=15,
                           shuffle_buffer_size=None, max_samples_per_sequence=None, task_encoder=enc, repeat=False,
                           worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0,
                                                      global_error_handler=reraise_exception))
    it = iter(get_savable_loader(ds, gc_collect_every_n_steps=0, watchdog_timeout_seconds=None))
    batch = next(it)
    in_pack = len([s for row in batch.media_spans for s in row])
    assert sum(enc.media.decodes.totals().values()) == in_pack         # the other samples are only planned
    seen = in_pack
    for batch in it:
        seen += len([s for row in batch.media_spans for s in row])
        assert sum(enc.media.decodes.totals().values()) == seen
    assert seen == 15 // 5 * 5


def test_preview_json_lists_media(media_ds, capsys):
    root, _ = media_ds
    assert run_preview(str(config(root, name="p.yaml")), as_json=True) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    media = [m for line in lines[:-1] for m in line["media"]]
    kinds = sorted(m["kind"] for m in media)
    assert kinds.count("image") == 9 and kinds.count("video") == 3 and kinds.count("audio") == 3
    for m in media:
        assert {"row", "kind", "sample_key", "token_start", "num_tokens"} <= set(m)
        assert ("grid" in m) if m["kind"] == "image" else ("frames" in m if m["kind"] == "video" else "clips" in m)
    assert run_preview(str(config(root, name="p.yaml")), batches=1, color="never") == 0
    out = capsys.readouterr().out
    assert "«<image>×" in out or "«<so_embedding>×" in out or "«" in out


def test_without_packing_and_with_workers(media_ds, demo_tokenizer):
    root, keys = media_ds
    vocab = demo_tokenizer.get_vocab()
    got = []
    for batch in build_train_loader(config(root, name="w.yaml", packing=None, workers=2), repeat=False):
        check_batch(batch, vocab)
        got += [k for row in batch.sample_keys for k in row]
    assert sorted(got) == sorted(keys)


def test_jsonl_dataset_with_media_paths_and_granary(tmp_path, demo_tokenizer):
    from energon_data import energon
    from energon_nemotron.demo.media import make_audio, make_image

    (tmp_path / "imgs").mkdir()
    (tmp_path / "clips").mkdir()
    lines, asr = [], []
    for i in range(4):
        (tmp_path / "imgs" / f"{i}.jpg").write_bytes(make_image(90 + i * 10, 70, seed=i))
        (tmp_path / "clips" / f"{i}.flac").write_bytes(make_audio(1.0 + i / 4, 22050, 1, seed=i, container="flac"))
        lines.append({"conversations": [{"from": "human", "value": "<image>\nWhat colour? <audio>"},
                                        {"from": "gpt", "value": f"Answer {i}."}],
                      "image": f"imgs/{i}.jpg", "audio": f"clips/{i}.flac"})
        asr.append({"audio_filepath": f"clips/{i}.flac", "text": f"transcript number {i}"})
    for name, rows in (("chat.jsonl", lines), ("asr.jsonl", asr)):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
        energon("prepare", str(tmp_path / name))
    vocab = demo_tokenizer.get_vocab()
    for name, cooker, n_visual in (("chat.jsonl", "general_conversations", 4), ("asr.jsonl", "granary_asr", 0)):
        cfg = loader_yaml(tmp_path / f"{cooker}.yaml", {"path": name}, packing=PACKING, seq_length=2048,
                          prompt_format="nemotron-h", extra_options=SMALL_MEDIA, default_cooker=cooker)
        visual = audio = samples = 0
        for batch in build_train_loader(cfg, repeat=False):
            v, a = check_batch(batch, vocab)
            visual, audio, samples = visual + v, audio + a, samples + sum(map(len, batch.sample_keys))
        assert (samples, visual, audio) == (4, n_visual, 4)


def test_reserved_tag_in_text_is_rejected_with_the_key(tmp_path):
    from energon_nemotron.demo.datasets import write_shards, prepare

    bad = {"conversations": [{"from": "human", "value": "Say <so_embedding> please"}, {"from": "gpt", "value": "no"}]}
    write_shards(tmp_path / "ds", [("forged-01", {"json": json.dumps(bad).encode()})])
    prepare(tmp_path / "ds", {"cooker": "general_conversations"})
    cfg = loader_yaml(tmp_path / "l.yaml", {"path": "ds"}, packing=PACKING, prompt_format="nemotron6")
    from energon_nemotron.errors import DataError

    with pytest.raises(DataError, match=r"^ds/parts/data-0\.tar:forged-01: message 0 \(user\) contains the reserved media tag <so_embedding>"):
        list(build_train_loader(cfg, repeat=False))


def test_media_patch_budget_balances_packs(media_ds):
    root, keys = media_ds
    budget = 700
    c = config(root, "budget.yaml", packing={**PACKING, "algorithm": "minimum_bin_slack", "buffer_size": 15,
                                             "max_media_patches_per_pack": budget})
    loader = build_train_loader(c, repeat=False)
    got = []
    for batch in loader:
        got += [k for row in batch.sample_keys for k in row]
        if "pixel_values" in batch.media:
            patches = batch.media["pixel_values"].as_tensor().shape[0]
            assert patches <= budget or len(batch.sample_keys[0]) == 1
    assert sorted(got) == sorted(keys)
    t = loader.telemetry()
    assert t["samples"] == len(keys) and t["media_decoded"] == {"image": 9, "video": 3, "audio": 3}
    assert 0 < t["fill_ratio"] <= 1 and t["tokens_per_s"] > 0 and t["skipped"] == {}


def test_patch_budget_needs_a_packer_with_a_second_budget(media_ds):
    from energon_nemotron.errors import ConfigError
    from energon_nemotron.loading import build_task_encoder

    root, _ = media_ds
    c = config(root, "nobudget.yaml", packing={**PACKING, "max_media_patches_per_pack": 100})
    with pytest.raises(ConfigError, match=r"'best_fit_decreasing' has no second budget .* use one of: minimum_bin_slack"):
        build_task_encoder(c)


def test_telemetry_is_logged_every_n_batches(media_ds, caplog):
    import logging

    root, _ = media_ds
    raw = __import__("yaml").safe_load(config(root, "log.yaml").read_text())
    raw["loader"]["log_every"] = 2
    from energon_nemotron.config import load_config

    with caplog.at_level(logging.INFO, logger="energon_nemotron"):
        batches = list(build_train_loader(load_config(raw, base=root), repeat=False))
    lines = [r.getMessage() for r in caplog.records if r.name == "energon_nemotron"]
    assert len(lines) == len(batches) // 2 and lines[0].startswith("batches 2 | packs 2 | samples ")
    assert "tokens/s | media decoded: " in lines[0] and "skipped: none" in lines[0]
