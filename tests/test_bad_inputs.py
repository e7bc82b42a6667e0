"""Every class of bad input: with ``on_error: raise`` an error naming the sample and the reason
(preview exits non-zero); with ``on_error: skip`` the sample is dropped and counted by reason.
Nothing crashes the loader and nothing disappears uncounted."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter

import pytest
import yaml

from bad_inputs import (ALL_CODES, OPENAI_BAD, PREFORMATTED_BAD, TWICE_BAD, WDS_BAD, build_corpus, conv,
                        decode_time_bad_jpeg)
from conftest import DEMO_TOKENIZER
from energon_nemotron.errors import DataError
from energon_nemotron.guards import ErrorPolicy, skip_counter as skip_counter
from energon_nemotron.loading import build_task_encoder
from energon_nemotron.inspection import run_preview
from energon_nemotron.registry import COOKERS

OPTIONS = {"prompt_format": "nemotron6", "seq_length": 1024,
           "image": {"min_patches": 64, "max_patches": 256}, "video": {"target_patches": 64, "min_frames": 2, "max_frames": 4}}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    mix, goods = build_corpus(root)
    return root, mix, goods


def config(root, mix, on_error, workers=0, name=None):
    cfg = {"tokenizer": str(DEMO_TOKENIZER), "task_encoder": {"name": "nemotron_multimodal", "options": OPTIONS},
           "packing": {"algorithm": "best_fit_decreasing", "buffer_size": 8},
           "data": {"train": {"path": str(mix)}},
           "loader": {"batch_size": 1, "num_workers": workers, "shuffle_buffer_size": None, "on_error": on_error}}
    path = root / (name or f"{on_error}{workers}.yaml")
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize("workers", [0, 2])
def test_skip_counts_every_class(corpus, capsys, workers):
    root, mix, goods = corpus
    assert run_preview(str(config(root, mix, "skip", workers)), as_json=True) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    summary = lines[-1]["summary"]
    assert summary["samples"] == goods
    assert Counter(summary["skipped"]) == Counter(ALL_CODES)
    keys = {k for line in lines[:-1] for row in line["sample_keys"] for k in row}
    assert all(re.fullmatch(r"(wds|pre|twice|openai)/parts/data-0\.tar:good-\d+", k) or k == "chat.jsonl:1" for k in keys)
    assert len(keys) == goods


def test_raise_stops_with_the_key_and_exit_status(corpus):
    root, mix, _ = corpus
    res = subprocess.run([sys.executable, "-m", "energon_nemotron.cli", "preview", str(config(root, mix, "raise")),
                          "--json"], capture_output=True, text=True)
    assert res.returncode == 2
    err = res.stderr.strip().splitlines()[-1]
    assert err.startswith("error: ") and any(key in err for key in (*WDS_BAD, *PREFORMATTED_BAD, *TWICE_BAD, *OPENAI_BAD, "1", "2"))


def crude(key, members, subflavors):
    return {"__key__": key, "__restore_key__": ("test", key), "__shard__": "parts/data-0.tar",
            "__subflavors__": subflavors, "__sources__": (), **members}


CASES = [(k, m, c, {"cooker": "general_conversations"}) for k, (m, c) in WDS_BAD.items()]
CASES += [(k, m, c, {"cooker": "general_conversations", "skip_chat_template": True}) for k, (m, c) in PREFORMATTED_BAD.items()]
CASES += [(k, m, c, {"cooker": "nemotron_conversation"}) for k, (m, c) in TWICE_BAD.items()]
CASES += [(k, m, c, {"cooker": "openai_messages"}) for k, (m, c) in OPENAI_BAD.items()]


@pytest.mark.parametrize("key, members, code, subflavors", CASES, ids=[c[0] for c in CASES])
def test_each_class_raises_naming_key_and_reason(corpus, key, members, code, subflavors):
    """The same stages Energon runs (cooker, phase 1, phase 2) under the ``raise`` policy."""
    root, mix, _ = corpus
    enc = build_task_encoder(config(root, mix, "raise", name="direct.yaml"))
    policy = ErrorPolicy("raise", enc.counters.skipped)
    sample = crude(key, members, subflavors)
    with pytest.raises(DataError) as err:
        try:
            conv = COOKERS.get(subflavors["cooker"])(sample)
            enc.postencode_sample(enc.preencode_sample(conv))
        except Exception as e:           # what Energon hands to the error handler
            policy(e, sample, ())
    assert err.value.code == code
    assert str(err.value).startswith((f"parts/data-0.tar:{key}: ", f"{key}: "))    # cooker stage, encoder stage
    assert len(err.value.reason) > 10


def test_jsonl_line_errors_name_the_line_key():
    policy = ErrorPolicy("raise", skip_counter())
    with pytest.raises(DataError, match=r"^2: JSONDecodeError: Expecting value") as err:
        try:
            json.loads('{"conversations": }')
        except Exception as e:
            policy(e, {"__key__": "2"}, ())
    assert err.value.code == "invalid_json"
    counts = skip_counter()
    ErrorPolicy("skip", counts)(UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"), {"__key__": "3"})
    ErrorPolicy("skip", counts)(RuntimeError("boom"), {"__key__": "4"})
    assert counts.totals() == {"invalid_utf8": 1, "other": 1}


@pytest.mark.parametrize("workers", [0, 2])
def test_packs_that_lose_every_sample_at_decode_count_only_those_samples(tmp_path, workers):
    """Samples that fail only at decode time (after packing), one per pack: the skip count is the
    samples dropped, with no extra count for the pack they leave empty."""
    from energon_nemotron.demo.datasets import prepare, write_shards
    from energon_nemotron.demo.media import make_image
    from energon_nemotron.loading import build_train_loader

    samples = [(f"s-{i:05d}", {"json": conv("<image> what?", f"Answer {i}."),
                               "jpg": make_image(200, 150, seed=i) if i < 3 else decode_time_bad_jpeg(i)})
               for i in range(9)]
    write_shards(tmp_path / "d", samples, per_shard=3)
    prepare(tmp_path / "d", {"cooker": "general_conversations"})
    cfg = {"tokenizer": str(DEMO_TOKENIZER), "task_encoder": {"name": "nemotron_multimodal", "options": OPTIONS},
           "packing": {"algorithm": "best_fit_decreasing", "buffer_size": 3, "max_sequences_per_bin": 1},
           "data": {"train": {"path": str(tmp_path / "d")}},
           "loader": {"batch_size": 1, "num_workers": workers, "shuffle_buffer_size": None, "on_error": "skip"}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    loader = build_train_loader(tmp_path / "c.yaml", repeat=False)
    keys = sorted(k for b in loader for row in b.sample_keys for k in row)
    assert keys == [f"d/parts/data-0.tar:s-{i:05d}" for i in range(3)]
    assert loader.skipped() == {"corrupt_media": 6}
