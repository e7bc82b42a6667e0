"""Shared test helpers: fixture locations and small builders."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
REPO = TESTS.parent
MEGATRON_FIXTURES = TESTS / "fixtures" / "megatron_lm_sft"
FIXTURE_TOKENIZER = MEGATRON_FIXTURES / "tokenizer"
DEMO_TOKENIZER = REPO / "energon_nemotron" / "demo" / "tokenizer"
FORMATS = ["identity", "default", "nemotron-h-aligned", "nemotron-nano-v2"]
CP_SIZES = [1, 2, 4]


def load_reference(fmt: str, cp: int) -> dict:
    return json.loads((MEGATRON_FIXTURES / f"ref_{fmt}_L96_cp{cp}.json").read_text())


def fixture_rows() -> list[dict]:
    return [json.loads(line) for line in (MEGATRON_FIXTURES / "train.jsonl.packed").read_text().splitlines()]


@pytest.fixture
def quick_worker_shutdown(monkeypatch):
    """For modules that drop loaders with workers mid-epoch (``pytestmark = pytest.mark.usefixtures(
    "quick_worker_shutdown")``): PyTorch waits MP_STATUS_CHECK_INTERVAL (5 s) for each busy worker
    before terminating it; a shorter wait keeps them fast (the stream is unchanged). The test's
    dropped loaders are collected while the shorter wait holds."""
    import gc

    import torch.utils.data._utils as torch_data_utils

    monkeypatch.setattr(torch_data_utils, "MP_STATUS_CHECK_INTERVAL", 0.3)
    yield
    gc.collect()


@pytest.fixture(scope="session")
def fixture_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(FIXTURE_TOKENIZER))


@pytest.fixture(scope="session")
def demo_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(DEMO_TOKENIZER))


def write_jsonl(path: Path, objects) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for obj in objects:
            f.write(json.dumps(obj) + "\n")
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a gloo ``init_method``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
