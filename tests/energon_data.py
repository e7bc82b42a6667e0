"""Test-only dataset builders on top of ``energon_nemotron.demo.datasets``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import yaml

from energon_nemotron.demo.conversations import make_conversations
from energon_nemotron.demo.datasets import (energon, prepare, shown_keys, text_dataset, to_schema,  # noqa: F401
                                            write_shards)


def jsonl_dataset(path: Path, n: int, seed: int = 0) -> tuple[Path, list[str]]:
    """A prepared standalone JSONL dataset of OpenAI messages; its keys as the library shows them
    (``FILE.jsonl:N``, N the 1-based line)."""
    with open(path, "w") as f:
        for conv in make_conversations(n, seed=seed):
            f.write(json.dumps({"messages": conv}) + "\n")
    energon("prepare", str(path))
    return path, [f"{path.name}:{i + 1}" for i in range(n)]


def loader_yaml(path: Path, train: dict, *, seq_length: int = 1024, prompt_format: str = "tokenizer",
                packing: Optional[dict] = None, workers: int = 0, extra_options: Optional[dict] = None,
                default_cooker: Optional[str] = None, tokenizer: Optional[Path] = None) -> Path:
    from conftest import DEMO_TOKENIZER

    cfg = {
        "tokenizer": str(tokenizer or DEMO_TOKENIZER),
        "task_encoder": {"name": "nemotron_multimodal",
                         "options": {"prompt_format": prompt_format, "seq_length": seq_length, **(extra_options or {})}},
        "packing": packing,
        "data": {"train": train, "validation": None, "default_cooker": default_cooker},
        "loader": {"batch_size": 1, "num_workers": workers, "shuffle_buffer_size": 10, "seed": 7},
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


def text_config(train: Path, *, workers: int, packing: Optional[dict] = None, seq_length: int = 2048,
                batch_size: int = 1, shuffle_buffer_size: Optional[int] = None, seed: int = 3,
                validation: Optional[dict] = None) -> dict:
    """A loader config dict for the demo tokenizer and the ``nemotron6`` format over ``train``."""
    from conftest import DEMO_TOKENIZER

    return {"tokenizer": str(DEMO_TOKENIZER),
            "task_encoder": {"name": "nemotron_multimodal", "options": {"prompt_format": "nemotron6",
                                                                           "seq_length": seq_length}},
            "packing": packing, "data": {"train": {"path": str(train)}, "validation": validation},
            "loader": {"batch_size": batch_size, "num_workers": workers, "shuffle_buffer_size": shuffle_buffer_size,
                       "seed": seed}}


def tar_keys(keys) -> list[str]:
    """The tars' own keys of ``keys`` shown as ``DATASET/SHARD.tar:KEY``, in order (an error for a
    key that names no tar shard)."""
    return [key.split(".tar:", 1)[1] for key in keys]


def rest_after(config, state) -> list:
    """The batches a fresh one-pass loader of ``config`` yields after restoring ``state``."""
    from energon_nemotron.loading import build_train_loader

    loader = build_train_loader(config, repeat=False)
    loader.load_state_dict(state)
    return list(loader)
