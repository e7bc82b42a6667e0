"""Exact resume: stop after k batches, restore from the saved state, and the next m batches are
bit for bit those of an uninterrupted run (0, 1 and 2 workers, packing, media). The state is JSON
(no pickle), written atomically, and refuses a different configuration with a per-key diff."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import yaml

from conftest import DEMO_TOKENIZER
from energon_nemotron.demo.datasets import multimodal_dataset
from energon_nemotron.errors import ConfigError
from energon_nemotron.loading import build_train_loader
from energon_nemotron.resume import decode_state, encode_state
from energon_nemotron.resume import load_state_file, save_state_file

K, M = 3, 3


@pytest.fixture(scope="module")
def media_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    multimodal_dataset(root / "mm", n=40, per_shard=5)
    return root


def cfg(root, workers, **changes):
    c = {"tokenizer": str(DEMO_TOKENIZER),
         "task_encoder": {"name": "nemotron_multimodal", "options": {
             "prompt_format": "nemotron6", "seq_length": 2048,
             "image": {"min_patches": 64, "max_patches": 256},
             "video": {"target_patches": 64, "min_frames": 2, "max_frames": 4}}},
         "packing": {"algorithm": "first_fit_shuffle", "buffer_size": 6},
         "data": {"train": {"path": str(root / "mm")}},
         "loader": {"batch_size": 1, "num_workers": workers, "shuffle_buffer_size": 8, "seed": 11}}
    for key, value in changes.items():
        section, _, name = key.partition(".")
        c[section][name] = value
    return c


def same(a, b) -> bool:
    """Bit-identical rows and media."""
    if a.sample_keys != b.sample_keys:
        return False
    for name in ("tokens", "labels", "loss_mask", "position_ids"):
        if not torch.equal(getattr(a, name), getattr(b, name)):
            return False
    if [c.tolist() for c in a.cu_seqlens_padded] != [c.tolist() for c in b.cu_seqlens_padded]:
        return False
    if set(a.media) != set(b.media):
        return False
    for k, v in a.media.items():
        w = b.media[k]
        if isinstance(v, torch.Tensor) and not torch.equal(v, w):
            return False
        if not isinstance(v, torch.Tensor) and not v.equal(w):
            return False
    return True


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_energon_resume_is_exact(media_root, workers, tmp_path):
    config = cfg(media_root, workers)
    first = build_train_loader(config)
    it = iter(first)
    for _ in range(K):
        next(it)
    save_state_file(tmp_path / "state.json", first.state_dict())
    expected = [next(it) for _ in range(M)]
    assert any(b.media for b in expected)                       # media tensors are compared too

    second = build_train_loader(config)
    second.load_state_dict(load_state_file(tmp_path / "state.json"))
    got = [b for _, b in zip(range(M), second)]
    assert all(same(a, b) for a, b in zip(expected, got))


@pytest.mark.parametrize("change, key", [
    ({"task_encoder.options": {"prompt_format": "nemotron6", "seq_length": 4096}}, "task_encoder"),
    ({"loader.seed": 12}, "loader"),
    ({"loader.dp_size": 2}, "loader"),
    ({"packing.buffer_size": 7}, "packing"),
    ({"data.train": {"path": "elsewhere"}}, "train"),
])
def test_restore_under_a_different_configuration_fails_with_a_diff(media_root, change, key):
    state = build_train_loader(cfg(media_root, 0)).state_dict()
    other = build_train_loader(cfg(media_root, 0, **change)) if key != "train" else None
    if other is None:
        from energon_nemotron.resume import fingerprint
        from energon_nemotron.config import load_config

        c = cfg(media_root, 0)
        c["data"]["train"]["path"] = str(media_root / "other")
        fp = fingerprint(load_config(c), "train", True)
        from energon_nemotron.resume import check_fingerprint

        with pytest.raises(ConfigError, match=r"  train: saved .* != now"):
            check_fingerprint(state["fingerprint"], fp)
        return
    with pytest.raises(ConfigError, match=rf"different configuration.*\n  {key}: saved"):
        other.load_state_dict(state)


def test_tokenizer_change_is_detected(media_root, tmp_path):
    import shutil

    tok = tmp_path / "tok"
    shutil.copytree(DEMO_TOKENIZER, tok)
    state = build_train_loader({**cfg(media_root, 0), "tokenizer": str(tok)}).state_dict()
    (tok / "tokenizer_config.json").write_text((tok / "tokenizer_config.json").read_text().replace("<pad>", "</s>"))
    with pytest.raises(ConfigError, match=r"  tokenizer: saved"):
        build_train_loader({**cfg(media_root, 0), "tokenizer": str(tok)}).load_state_dict(state)


def test_state_codec_round_trip_and_no_foreign_classes(media_root):
    loader = build_train_loader(cfg(media_root, 1))
    it = iter(loader)
    next(it)
    raw = loader.inner.save_state_rank()
    text = json.dumps(encode_state(raw))
    back = decode_state(json.loads(text))
    assert type(back) is type(raw) and json.dumps(encode_state(back)) == text
    evil = {"__dataclass__": "subprocess.Popen", "fields": {"args": ["true"]}}
    with pytest.raises(TypeError, match="subprocess.Popen is not allowed"):
        decode_state(evil)
    import dataclasses

    @dataclasses.dataclass
    class Foreign:
        x: int = 1

    with pytest.raises(TypeError, match="Foreign is not allowed in a loader state"):
        encode_state(Foreign())
    with pytest.raises(TypeError, match="cannot store a builtins.object"):
        encode_state(object())


def test_state_file_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "s.json"
    save_state_file(path, {"fingerprint": {"a": 1}, "position": {}})
    before = path.read_text()

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        save_state_file(path, {"fingerprint": {"a": 2}, "position": {}})
    assert path.read_text() == before and load_state_file(path)["fingerprint"] == {"a": 1}
    path.write_text('{"format": "something else"}')
    with pytest.raises(ConfigError, match="not an energon-nemotron loader state"):
        load_state_file(path)
    path.write_text(json.dumps({**json.loads(before), "version": 999}))
    with pytest.raises(ConfigError) as e:
        load_state_file(path)
    assert str(e.value).startswith(f"{path}: a loader state of version 999; this library reads version 1"), e.value


def test_a_state_save_on_a_full_disk_says_the_old_state_is_kept(tmp_path):
    """A file-size limit (as a full disk) while the state is written: an OSError naming the file and
    that the previous state is unchanged; no temporary file is left behind."""
    path = tmp_path / "s.json"
    save_state_file(path, {"fingerprint": {"a": 1}, "position": {}})
    script = ("import resource, signal, sys\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
              "from energon_nemotron.resume import save_state_file\n"
              "resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))\n"
              "try:\n    save_state_file(sys.argv[1], {'fingerprint': {'a': 'x' * 1000}, 'position': {}})\n"
              "except OSError as e:\n    print(e)\n")
    res = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert f"cannot save the loader state to {path}: File too large; the previous state file is unchanged" in \
        res.stdout, res.stdout + res.stderr
    assert load_state_file(path)["fingerprint"] == {"a": 1} and sorted(p.name for p in tmp_path.iterdir()) == ["s.json"]


@pytest.mark.slow
def test_preview_save_and_load_state(media_root, tmp_path):
    config = tmp_path / "l.yaml"
    config.write_text(yaml.safe_dump(cfg(media_root, 0)))

    def preview(*args):
        res = subprocess.run([sys.executable, "-m", "energon_nemotron.cli", "preview", str(config), "--json", *args],
                             capture_output=True, text=True)
        assert res.returncode == 0, res.stderr[-2000:]
        return [json.loads(x) for x in res.stdout.splitlines()][:-1]

    whole = preview("--batches", "4")
    preview("--batches", "2", "--save-state", str(tmp_path / "st.json"))
    rest = preview("--batches", "2", "--load-state", str(tmp_path / "st.json"))
    strip = [{k: v for k, v in b.items() if k != "batch"} for b in whole[2:]]
    assert strip == [{k: v for k, v in b.items() if k != "batch"} for b in rest]


@pytest.mark.parametrize("workers", [0, 2])
def test_megatron_rows_resume_exactly_even_with_skips(tmp_path, workers):
    from energon_nemotron.demo.conversations import make_conversations
    from energon_nemotron.megatron_packed import MegatronSFTPackedEncoder
    from energon_nemotron.megatron_packed.offline_pack import pack_file

    raw = tmp_path / "raw.jsonl"
    raw.write_text("".join(json.dumps({"messages": c}) + "\n" for c in make_conversations(120, seed=4)))
    enc = MegatronSFTPackedEncoder(DEMO_TOKENIZER, 512, "nemotron-h-aligned")
    pack_file(raw, tmp_path / "rows.jsonl.packed", enc, progress=False)
    lines = (tmp_path / "rows.jsonl.packed").read_text().splitlines()
    lines.insert(5, '{"messages": "broken"}')                     # skipped and counted
    (tmp_path / "rows.jsonl.packed").write_text("\n".join(lines) + "\n")
    config = {"tokenizer": str(DEMO_TOKENIZER),
              "data": {"train": {"format": "megatron_sft_packed", "path": str(tmp_path / "rows.jsonl.packed"),
                                 "seq_length": 512, "prompt_format": "nemotron-h-aligned"}},
              "loader": {"batch_size": 2, "num_workers": workers, "on_error": "skip"}}
    first = build_train_loader(config)
    it = iter(first)
    for _ in range(K):
        next(it)
    state = json.loads(json.dumps(first.state_dict()))
    expected = list(it)
    assert first.skipped() == {"invalid_sample": 1}
    second = build_train_loader(config)
    second.load_state_dict(state)
    got = list(second)
    assert len(got) == len(expected) and all(same(a, b) for a, b in zip(expected, got))


def test_resume_restores_samples_prepared_but_not_yet_tokenized(media_root, monkeypatch):
    """With packing, samples are tokenized per buffer (``select_samples_to_pack``); a state saved
    while a buffer's packs are being yielded restores those samples prepared only, and
    ``postencode_sample`` tokenizes them: the resumed batches are still bit-identical."""
    import functools

    from energon_nemotron.encoders import NemotronMultimodalTaskEncoder as Encoder

    seen = []
    original = Encoder.postencode_sample

    @functools.wraps(original)
    def spy(self, sample):
        seen.append(sample.pending is not None)
        return original(self, sample)

    monkeypatch.setattr(Encoder, "postencode_sample", spy)
    # several packs per buffer, none carried (carried samples have tests of their own)
    config = cfg(media_root, 0, **{"packing.max_sequences_per_bin": 2, "packing.carry": None})
    restored_pending = 0
    for k in (2, 4):
        first = build_train_loader(config)
        it = iter(first)
        for _ in range(k):
            next(it)
        state = first.state_dict()
        expected = [next(it) for _ in range(3)]
        seen.clear()
        second = build_train_loader(config)
        second.load_state_dict(state)
        got = [b for _, b in zip(range(3), second)]
        assert all(same(a, b) for a, b in zip(expected, got)), k
        restored_pending += sum(seen)
    assert restored_pending > 0
