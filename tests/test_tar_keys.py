"""Tar samples are shown by where they are (``DATASET/SHARD:KEY``): a blend of two datasets whose
shards and keys are the same names gives every sample its own key, in ``sample_keys``, in the
preview, in a ``DataError`` and in a skip limit's message, with and without loader workers, and a
resumed loader shows them as the uninterrupted one does."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from energon_data import prepare, text_config, write_shards
from energon_nemotron.errors import DataError, SkipLimitError, original_message
from energon_nemotron.inspection import run_preview
from energon_nemotron.loading import build_train_loader

GOOD = 6
PER_SHARD = 4                      # the bad sample is the 5th: the second shard of each dataset


def conversation(dataset: str, i: int) -> bytes:
    return json.dumps({"conversations": [{"from": "human", "value": f"{dataset}: what is {i} + {i}?"},
                                         {"from": "gpt", "value": f"{2 * i}."}]}).encode()


@pytest.fixture(scope="module")
def twins(tmp_path_factory) -> Path:
    """``left`` and ``right``: the same shard names and keys (``s-0``..``s-5`` and ``bad``, invalid
    JSON), other conversations; ``blend.yaml`` reads each once."""
    root = tmp_path_factory.mktemp("twins")
    for name in ("left", "right"):
        samples = [(f"s-{i}", {"json": conversation(name, i)}) for i in range(4)]
        samples += [("bad", {"json": b'{"conversations": [oops'})]
        samples += [(f"s-{i}", {"json": conversation(name, i)}) for i in range(4, GOOD)]
        prepare(write_shards(root / name, samples, PER_SHARD), {"cooker": "general_conversations"})
    (root / "blend.yaml").write_text(yaml.safe_dump({
        "__module__": "megatron.energon", "__class__": "MetadatasetV2",
        "splits": {"train": {"blend_epochized": [{"path": "left", "repetitions": 1},
                                                 {"path": "right", "repetitions": 1}]}}}))
    return root


def expected_keys() -> list[str]:
    order = [f"s-{i}" for i in range(4)] + ["bad"] + [f"s-{i}" for i in range(4, GOOD)]
    return sorted(f"{name}/parts/data-{pos // PER_SHARD}.tar:{key}"
                  for name in ("left", "right") for pos, key in enumerate(order) if key != "bad")


def config(train: Path, workers: int, **loader) -> dict:
    cfg = text_config(train, workers=workers)
    cfg["loader"].update({"on_error": "skip", **loader})
    return cfg


def keys_of(batches) -> list[str]:
    return [key for batch in batches for row in batch.sample_keys for key in row]


@pytest.mark.parametrize("workers", [0, 2])
def test_every_sample_of_a_blend_of_twins_has_its_own_key(twins, workers):
    loader = build_train_loader(config(twins / "blend.yaml", workers), repeat=False)
    keys = keys_of(loader)
    assert len(keys) == len(set(keys)) == 2 * GOOD
    assert sorted(keys) == expected_keys()
    assert loader.skipped() == {"invalid_json": 2}


def test_the_preview_shows_the_same_keys(twins, tmp_path, capsys):
    path = tmp_path / "loader.yaml"
    path.write_text(yaml.safe_dump(config(twins / "blend.yaml", 0)))
    assert run_preview(str(path), as_json=True) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(key for line in lines[:-1] for row in line["sample_keys"] for key in row) == expected_keys()
    assert lines[-1]["summary"]["samples"] == 2 * GOOD


@pytest.mark.parametrize("workers", [0, 2])
def test_an_error_names_the_dataset_of_the_bad_sample(twins, workers):
    # with workers PyTorch re-raises the worker's error with its traceback; the library's own
    # message is what ``original_message`` gives back (the CLI prints that)
    with pytest.raises(DataError) as err:
        list(build_train_loader(config(twins / "right", workers, on_error="raise"), repeat=False))
    assert re.match(r"right/parts/data-1\.tar:bad: ", original_message(err.value))
    assert "json is not valid JSON" in original_message(err.value)
    with pytest.raises(DataError) as err:
        list(build_train_loader(config(twins / "blend.yaml", workers, on_error="raise"), repeat=False))
    assert re.match(r"(left|right)/parts/data-1\.tar:bad: ", original_message(err.value))


def test_a_skip_limit_names_the_dataset_of_the_last_skipped_sample(twins):
    cfg = config(twins / "left", 0, max_consecutive_skips=1)
    with pytest.raises(SkipLimitError, match=re.escape("last skipped: left/parts/data-1.tar:bad: ")):
        list(build_train_loader(cfg, repeat=False))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resumed_loader_shows_the_keys_the_uninterrupted_one_does(twins, workers):
    cfg = config(twins / "blend.yaml", workers, shuffle_buffer_size=4)
    whole = keys_of(build_train_loader(cfg, repeat=False))
    first = build_train_loader(cfg, repeat=False)
    it = iter(first)
    head = keys_of(next(it) for _ in range(5))
    state = first.state_dict()
    second = build_train_loader(cfg, repeat=False)
    second.load_state_dict(state)
    assert head + keys_of(second) == whole
    assert sorted(whole) == expected_keys()
