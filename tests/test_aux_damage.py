"""A damaged shard of an aux source is named by the error of every sample whose media it holds
(issue 27 D), read through the real loader with 0 and 2 workers."""

from __future__ import annotations

import json
import tarfile

import pytest
import yaml

from conftest import DEMO_TOKENIZER
from energon_data import energon, prepare, write_shards
from energon_nemotron.demo.media import make_image
from energon_nemotron.loading import build_train_loader


def _damage(shard, member: str) -> None:
    """Overwrite ``member``'s bytes inside the tar ``shard`` with zeros (same size: the index still fits)."""
    with tarfile.open(shard) as tar:
        info = tar.getmember(member)
    with open(shard, "r+b") as f:
        f.seek(info.offset_data)
        f.write(b"\0" * info.size)


@pytest.fixture
def corpus(tmp_path):
    write_shards(tmp_path / "shards", [("images/cat", {"jpg": make_image(72, 40, seed=4)}),
                                       ("images/dog", {"jpg": make_image(48, 48, seed=5)})], per_shard=1)
    prepare(tmp_path / "shards")
    rows = [{"conversation": [{"sender": "user", "fragments": ["Look: ", {"t": "image", "value": f"images/{n}.jpg"}]},
                              {"sender": "assistant", "fragments": ["Nice."]}]} for n in ("cat", "dog")]
    (tmp_path / "prim").mkdir()
    (tmp_path / "prim" / "frag.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    energon("prepare", str(tmp_path / "prim" / "frag.jsonl"))
    (tmp_path / "mix.yaml").write_text(yaml.safe_dump({
        "__module__": "megatron.energon", "__class__": "MetadatasetV2",
        "splits": {"train": {"blend_epochized": [
            {"repetitions": 1, "path": "prim/frag.jsonl", "aux": {"pics": "shards"},
             "subflavors": {"cooker": "nemotron_conversation"}}]}}}))
    shards = sorted((tmp_path / "shards" / "parts").glob("*.tar"))
    with tarfile.open(shards[1]) as tar:
        assert "images/dog.jpg" in tar.getnames()
    _damage(shards[1], "images/dog.jpg")
    return tmp_path, f"parts/{shards[1].name}"


def _config(root, workers, on_error):
    return {"tokenizer": str(DEMO_TOKENIZER),
            "task_encoder": {"name": "nemotron_multimodal", "options": {"prompt_format": "nemotron6", "seq_length": 2048}},
            "data": {"train": {"path": str(root / "mix.yaml")}},
            "loader": {"batch_size": 1, "num_workers": workers, "shuffle_buffer_size": None, "on_error": on_error}}


@pytest.mark.parametrize("workers", [0, 2])
def test_a_damaged_aux_shard_is_named(corpus, workers):
    root, shard = corpus
    with pytest.raises(Exception) as info:
        list(build_train_loader(_config(root, workers, "raise"), repeat=False))
    from energon_nemotron.errors import original_message

    message = original_message(info.value) or str(info.value)
    assert message.startswith("frag.jsonl:2: ") and f"shard {shard} of aux source 'pics'" in message, message
    loader = build_train_loader(_config(root, workers, "skip"), repeat=False)
    keys = [k for b in loader for row in b.sample_keys for k in row]
    assert keys == ["frag.jsonl:1"] and loader.skipped() == {"corrupt_media": 1}
