"""Shared test helpers: fixture locations and small builders."""

from __future__ import annotations

import json
import random
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
    """A TCP port on 127.0.0.1 that nothing listens on now (for a gloo ``init_method``), drawn below
    the kernel's ephemeral range: a port the kernel hands out (``bind(0)``, any outgoing connection,
    gloo's own pairs among them) could be taken by another test between this call and the bind of
    the rendezvous; one outside that range is taken only by an explicit choice (another draw here,
    1 in ~20000, and then the bind check below sees it)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    draw = random.SystemRandom()
    for _ in range(100):
        port = draw.randrange(10000, max(10001, low))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free TCP port in 10000-{low} on 127.0.0.1 after 100 draws")


@pytest.fixture(scope="session")
def object_store(tmp_path_factory):
    """A real S3-compatible server (moto) on 127.0.0.1 for the whole run, and ``MSC_CONFIG`` set to
    a multi-storage-client profile ``lake`` for it (``msc://lake/...``; ``object_store.ObjectStore``).
    Stopped, and the variable restored, at the end."""
    import os

    from object_store import ObjectStore

    store = ObjectStore.start(tmp_path_factory.mktemp("object_store"), free_port(), free_port(), free_port(), free_port())
    before = os.environ.get("MSC_CONFIG")
    os.environ["MSC_CONFIG"] = str(store.config)
    try:
        yield store
    finally:
        if before is None:
            os.environ.pop("MSC_CONFIG", None)
        else:
            os.environ["MSC_CONFIG"] = before
        store.stop()
