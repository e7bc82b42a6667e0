"""Datasets and helpers the Megatron-Bridge tests share (0.6.2: ``test_megatron_bridge.py``; main:
``test_bridge_main.py`` and the fixtures ``references/bridge_main`` makes)."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import DEMO_TOKENIZER
from energon_nemotron.demo.datasets import prepare, write_shards
from energon_nemotron.demo.media import make_audio, make_image
from energon_data import loader_yaml
from energon_nemotron.loading import build_task_encoder, build_train_loader
from energon_nemotron.registry import COOKERS

AUDIO_SECONDS = (1.0, 10.0, 30.0, 45.0)


def audio_dataset(folder: Path) -> Path:
    """One sample per length of ``AUDIO_SECONDS`` (16 kHz mono WAV), two text turns each."""
    samples = []
    for i, seconds in enumerate(AUDIO_SECONDS):
        turns = [{"from": "human", "value": "<audio>\nTranscribe this."},
                 {"from": "gpt", "value": f"clip {i} lasts {seconds:g} seconds"}]
        samples.append((f"au-{i:05d}", {"json": json.dumps({"conversations": turns}).encode(),
                                        "wav": make_audio(seconds, sample_rate=16000, channels=1, seed=i)}))
    write_shards(folder, samples)
    return prepare(folder, {"cooker": "general_conversations"})


def image_dataset(folder: Path, n: int = 12, bad: tuple[int, ...] = ()) -> Path:
    """Text, one image, two images (sizes that give non-square grids) and audio, no video; the
    samples at ``bad`` get an image member that is not an image."""
    samples = []
    for i in range(n):
        turns = [{"from": "human", "value": f"Question {i}?"}, {"from": "gpt", "value": f"Answer number {i}."}]
        members: dict = {}
        if i % 4 == 1:
            members["jpg"] = make_image(200 + 40 * i, 120 + 16 * i, seed=i)
            turns[0]["value"] = "<image>\n" + turns[0]["value"]
        elif i % 4 == 2:
            members["0.png"] = make_image(90, 300, seed=i, fmt="PNG")
            members["1.jpg"] = make_image(640, 360, seed=i + 1)
            turns[0]["value"] = "Compare <image> and <image>. " + turns[0]["value"]
        elif i % 4 == 3:
            members["wav"] = make_audio(2.0 + i / 10, sample_rate=16000, channels=1, seed=i)
            turns[0]["value"] = "<audio>\n" + turns[0]["value"]
        if i in bad:
            members = {"jpg": b"this is not a JPEG"}
            turns[0]["value"] = f"<image>\nWhat is this? Question {i}?"
        samples.append((f"im-{i:05d}", {"json": json.dumps({"conversations": turns}).encode(), **members}))
    write_shards(folder, samples)
    return prepare(folder, {"cooker": "general_conversations"})


def batches(cfg: Path, n: int) -> list:
    loader = build_train_loader(cfg, repeat=False)
    out = []
    for batch in loader:
        out.append(batch)
        if len(out) == n:
            break
    return out


def vocab() -> dict:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(DEMO_TOKENIZER)).get_vocab()


def kinds(batch) -> set:
    return {s.kind for s in batch.media_spans[0]}


def crude(key: str, text: str, **members) -> dict:
    """A crude sample as Energon hands it to the ``general_conversations`` cooker: a human turn
    ``text`` (with its media tags), an answer, and the ``members`` (media bytes by extension)."""
    turns = [{"from": "human", "value": text}, {"from": "gpt", "value": "It is a test picture."}]
    return {"__key__": key, "__restore_key__": ("test", key), "__shard__": "parts/data-0.tar",
            "__subflavors__": {"cooker": "general_conversations"}, "__sources__": (),
            "json": json.dumps({"conversations": turns}).encode(), **members}


def encoder(tmp_path: Path, **extra):
    """The task encoder of a loader config with the demo tokenizer, ``nemotron6``, seq_length 4096
    and ``extra`` task-encoder options."""
    cfg = loader_yaml(tmp_path / "c.yaml", {"path": "unused"}, seq_length=4096, prompt_format="nemotron6",
                      extra_options=extra)
    return build_task_encoder(cfg)


def encode(enc, sample: dict):
    """``sample`` (:func:`crude`) cooked and encoded by ``enc``."""
    conv = COOKERS.get("general_conversations")(sample)
    return enc.postencode_sample(enc.preencode_sample(conv))
