"""Builders of small real Energon datasets (the demo and the tests use them).

WebDataset shards are written with ``webdataset.ShardWriter`` and prepared with the real
``energon prepare`` command line; ``subflavors.cooker`` selects the cooker by name.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Iterable, Optional

import webdataset as wds
import yaml

from energon_nemotron.demo.conversations import make_conversations
from energon_nemotron.errors import shown_key


def energon(*args: str) -> subprocess.CompletedProcess:
    """Run the real ``energon`` CLI of this interpreter; fail with its output on error."""
    res = subprocess.run([sys.executable, "-m", "megatron.energon.cli.main", *args], capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"energon {' '.join(args)} failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    return res


def write_shards(folder: Path, samples: Iterable[tuple[str, dict]], per_shard: int = 8) -> Path:
    """Samples ``(key, {member_ext: bytes})`` into ``folder/parts/data-N.tar``."""
    (folder / "parts").mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(folder / "parts" / "data-%d.tar"), maxcount=per_shard, verbose=0) as w:
        for key, members in samples:
            w.write({"__key__": key, **members})
    return folder


def shown_keys(folder: Path, keys: list[str], per_shard: int = 8) -> list[str]:
    """The keys of samples written by :func:`write_shards` as the library shows them
    (``errors.shown_key``: ``FOLDER/parts/data-N.tar:KEY``)."""
    return [shown_key(key, f"parts/data-{i // per_shard}.tar", folder) for i, key in enumerate(keys)]


def prepare(folder: Path, subflavors: Optional[dict] = None) -> Path:
    """``energon prepare`` (crude, all shards in train), then set ``subflavors`` in dataset.yaml."""
    energon("prepare", str(folder), "--non-interactive", "--split-ratio", "1,0,0", "--sample-type",
            "CrudeWebdataset", "--num-workers", "1", "--no-progress", "--force-overwrite")
    if subflavors is not None:
        path = folder / ".nv-meta" / "dataset.yaml"
        meta = yaml.safe_load(path.read_text())
        meta["subflavors"] = subflavors
        path.write_text(yaml.safe_dump(meta))
    return folder


def to_schema(cooker: str, conversations: list[list[dict]]) -> dict:
    """The JSON payload of ``cooker`` for one or more OpenAI-style conversations."""
    if cooker in ("openai_messages_offline_packed", "nemotron_nano_openai_messages_offline_packed_jsonl"):
        return {"messages": [m for c in conversations for m in c]}
    conv = conversations[0]
    if cooker in ("openai_messages", "generic_conversation", "nemotron_nano_openai_messages_jsonl"):
        return {"messages": conv}
    names = {"system": "system", "user": "human", "assistant": "gpt"}
    if cooker in ("general_conversations", "nemotron_general_conversations_webdataset",
                  "nemotron_general_conversations_jsonl"):
        return {"conversations": [{"from": names[m["role"]], "value": m["content"]} for m in conv]}
    if cooker == "nemotron_general_conversations_jsonl_explicit_loss_v1":
        return {"conversations": [{"from": names[m["role"]], "value": m["content"],
                                   **({"loss": True} if m["role"] == "assistant" else {})} for m in conv]}
    if cooker in ("nemotron_audio_conversation_jsonl", "nemotron_omcat_legacy_conversation_monolithic"):
        return {"conversations": [{"from": names[m["role"]], "value": m["content"]} for m in conv
                                  if m["role"] != "system"]}          # these schemas have no system turn
    if cooker == "nemotron_conversation":
        return {"conversation": [{"sender": m["role"], "fragments": [m["content"]]} for m in conv]}
    raise ValueError(cooker)


def with_system(conv: list[dict]) -> list[dict]:
    """The conversation with a leading system message and no trailing newlines in contents (the
    newlines in ``make_conversations`` are for Megatron-LM's ``identity`` format)."""
    conv = [{"role": m["role"], "content": m["content"].rstrip("\n")} for m in conv]
    return conv if conv[0]["role"] == "system" else [{"role": "system", "content": ""}] + conv


def text_dataset(folder: Path, cooker: str, n: int, seed: int = 0, per_shard: int = 8,
                 subflavors: Optional[dict] = None) -> tuple[Path, list[str]]:
    """A prepared crude text dataset of ``n`` samples for ``cooker``; returns (folder, keys as
    shown)."""
    convs = make_conversations(2 * n, seed=seed)
    samples, keys = [], []
    for i in range(n):
        group = [with_system(convs[2 * i]), with_system(convs[2 * i + 1])]
        key = f"{folder.name}-{i:05d}"
        keys.append(key)
        samples.append((key, {"json": json.dumps(to_schema(cooker, group)).encode()}))
    write_shards(folder, samples, per_shard)
    return prepare(folder, {"cooker": cooker, **(subflavors or {})}), shown_keys(folder, keys, per_shard)


def multimodal_dataset(folder: Path, n: int, seed: int = 0, per_shard: int = 8) -> tuple[Path, list[str]]:
    """A prepared crude dataset for the ``general_conversations`` cooker whose samples cycle through
    text only, one image, two images, a video, and an audio clip (media as WebDataset members,
    referenced by ``<image>``/``<video>``/``<audio>`` tags); returns (folder, keys as shown)."""
    from energon_nemotron.demo.media import make_audio, make_image, make_video

    convs = make_conversations(n, seed=seed)
    samples, keys = [], []
    for i in range(n):
        conv = with_system(convs[i])
        turns = [{"from": {"system": "system", "user": "human", "assistant": "gpt"}[m["role"]], "value": m["content"]}
                 for m in conv]
        first_user = next(k for k, t in enumerate(turns) if t["from"] == "human")
        members: dict = {}
        kind = i % 5
        if kind == 1:
            members["jpg"] = make_image(96 + 16 * (i % 7), 64 + 8 * (i % 5), seed=i)
            turns[first_user]["value"] = "<image>\nDescribe the picture, then: " + turns[first_user]["value"]
        elif kind == 2:
            members["0.png"] = make_image(80, 120, seed=i, fmt="PNG")
            members["1.jpg"] = make_image(160, 90, seed=i + 1)
            turns[first_user]["value"] = "Compare <image> with <image>. " + turns[first_user]["value"]
        elif kind == 3:
            members["mp4"] = make_video(128, 72, seconds=1.0 + (i % 3) * 0.5, fps=8, seed=i)
            turns[first_user]["value"] = "<video>\nWhat happens? " + turns[first_user]["value"]
        elif kind == 4:
            members["wav"] = make_audio(seconds=1.0 + (i % 4) * 0.5, sample_rate=22050, channels=2, seed=i)
            turns[first_user]["value"] = "<audio>\nListen, then: " + turns[first_user]["value"]
        key = f"{folder.name}-{i:05d}"
        keys.append(key)
        samples.append((key, {"json": json.dumps({"conversations": turns}).encode(), **members}))
    write_shards(folder, samples, per_shard)
    return prepare(folder, {"cooker": "general_conversations"}), shown_keys(folder, keys, per_shard)


def asr_dataset(folder: Path, n: int, seed: int = 0, per_shard: int = 8,
                cooker: str = "granary_asr") -> tuple[Path, list[str]]:
    """A prepared crude dataset for the ``granary_asr`` cooker: one FLAC member and a ``.json``
    member with the transcript per sample; returns (folder, keys as shown). For NeMo-RL's
    ``nemotron_granary_english_webdataset`` the JSON also names the member (``audio_filepath``); for
    ``nemotron_granary_english_jsonl`` the clips are files under ``clips/`` named by it."""
    import random

    from energon_nemotron.demo.conversations import WORDS
    from energon_nemotron.demo.media import make_audio

    rng = random.Random(seed)
    samples, keys = [], []
    for i in range(n):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))).capitalize() + "."
        key = f"{folder.name}-{i:05d}"
        keys.append(key)
        audio = make_audio(1.0 + (i % 5) * 0.4, 16000, 1, seed=seed + i, container="flac")
        if cooker == "nemotron_granary_english_jsonl":
            (folder / "clips").mkdir(parents=True, exist_ok=True)
            (folder / "clips" / f"{key}.flac").write_bytes(audio)
            members = {"json": json.dumps({"audio_filepath": f"clips/{key}.flac", "text": text}).encode()}
        elif cooker == "nemotron_granary_english_webdataset":
            members = {"json": json.dumps({"audio_filepath": f"{key}.flac", "text": text}).encode(), "flac": audio}
        else:
            members = {"json": json.dumps({"text": text}).encode(), "flac": audio}
        samples.append((key, members))
    write_shards(folder, samples, per_shard)
    return prepare(folder, {"cooker": cooker}), shown_keys(folder, keys, per_shard)
