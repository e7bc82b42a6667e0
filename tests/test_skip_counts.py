"""Skips are counted once, by the batches that consumed them: a worker's skips travel with its next
batch (``PackedBatch.skipped``), so a resumed run that re-reads what a worker had read ahead (its
prefetched, never consumed batches) does not count those samples twice, and ``Loader.skipped()``
is what the consumed batches carry plus, once the epoch has ended, what each worker skipped after
its last batch."""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest
import yaml

from energon_nemotron.demo.conversations import make_conversations
from energon_nemotron.loading import build_train_loader
from energon_nemotron.resume import merge_rank_states
from energon_nemotron.config import load_config
from energon_nemotron.demo.datasets import energon
from conftest import DEMO_TOKENIZER

N = 60
BAD = tuple(range(2, N, 5))               # 0-based lines that are not conversations (12)
K = 2                                     # batches before the state is saved
ROWS_BAD = 10                             # bad rows among the Megatron-LM rows
READ_AHEAD_S = 3                          # how long a training step lets the workers read ahead


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    root = tmp_path_factory.mktemp("skips")
    lines = [json.dumps({"messages": c}) for c in make_conversations(N, seed=5)]
    for i in BAD:
        lines[i] = json.dumps({"messages": "broken"})
    (root / "chat.jsonl").write_text("\n".join(lines) + "\n")
    energon("prepare", str(root / "chat.jsonl"))
    return root


def config(root, workers: int):
    raw = {"tokenizer": str(DEMO_TOKENIZER),
           "task_encoder": {"name": "nemotron_multimodal", "options": {"prompt_format": "nemotron6", "seq_length": 2048}},
           "packing": {"algorithm": "first_fit_shuffle", "buffer_size": 6},
           "data": {"train": {"path": "chat.jsonl"}, "default_cooker": "openai_messages"},
           "loader": {"batch_size": 1, "num_workers": workers, "shuffle_buffer_size": 8, "seed": 3,
                      "on_error": "skip", "prefetch_factor": 4}}
    return load_config(yaml.safe_load(yaml.safe_dump(raw)), base=root)


def consumed(batches) -> Counter:
    return sum((Counter(b.skipped) for b in batches), Counter())


@pytest.mark.parametrize("workers", [0, 2])
def test_one_epoch_counts_every_bad_sample_once(chat, workers):
    loader = build_train_loader(config(chat, workers), repeat=False)
    batches = list(loader)
    assert loader.skipped() == {"invalid_sample": len(BAD)}
    carried = consumed(batches)
    assert carried["invalid_sample"] <= len(BAD) and loader.telemetry()["skipped"] == loader.skipped()
    assert sum(len(k) for b in batches for k in b.sample_keys) == N - len(BAD)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resumed_run_does_not_count_again_what_was_read_ahead(chat, workers):
    first = build_train_loader(config(chat, workers), repeat=False)
    it = iter(first)
    head = [next(it) for _ in range(K)]
    state = first.state_dict()
    time.sleep(READ_AHEAD_S)
    before = first.skipped()                      # what the consumed batches carried, no read-ahead
    assert before == dict(consumed(head))
    second = build_train_loader(config(chat, workers), repeat=False)
    second.load_state_dict(state)
    rest = list(second)
    assert Counter(before) + Counter(second.skipped()) == Counter(invalid_sample=len(BAD))
    assert sum(len(k) for b in head + rest for k in b.sample_keys) == N - len(BAD)


def test_an_elastic_resume_counts_every_bad_sample_once(chat):
    """Two ranks with 2 workers each save after K batches; one rank with 1 worker finishes."""
    states, before = [], Counter()
    for rank in range(2):
        loader = build_train_loader(config(chat, 2), repeat=False, dp_rank=rank, dp_size=2)
        it = iter(loader)
        head = [next(it) for _ in range(K)]
        states.append(loader.state_dict())
        time.sleep(READ_AHEAD_S)
        assert loader.skipped() == dict(consumed(head))
        before += Counter(loader.skipped())
    after = build_train_loader(config(chat, 1), repeat=False)
    after.load_state_dict(merge_rank_states(states), elastic=True)
    list(after)
    assert before + Counter(after.skipped()) == Counter(invalid_sample=len(BAD))


@pytest.mark.parametrize("workers", [0, 2])
def test_megatron_rows_count_a_skipped_row_once_across_a_resume(tmp_path, workers):
    from energon_nemotron.megatron_packed import MegatronSFTPackedEncoder
    from energon_nemotron.megatron_packed.offline_pack import pack_file

    raw = tmp_path / "raw.jsonl"
    raw.write_text("".join(json.dumps({"messages": c}) + "\n" for c in make_conversations(120, seed=4)))
    pack_file(raw, tmp_path / "rows.jsonl.packed", MegatronSFTPackedEncoder(DEMO_TOKENIZER, 512, "nemotron-h-aligned"),
              progress=False)
    lines = (tmp_path / "rows.jsonl.packed").read_text().splitlines()
    for i in range(0, 3 * ROWS_BAD, 3):                    # every third line of the first ones
        lines.insert(i, '{"messages": "broken"}')
    (tmp_path / "rows.jsonl.packed").write_text("\n".join(lines) + "\n")
    cfg = {"tokenizer": str(DEMO_TOKENIZER),
           "data": {"train": {"format": "megatron_sft_packed", "path": str(tmp_path / "rows.jsonl.packed"),
                              "seq_length": 512, "prompt_format": "nemotron-h-aligned"}},
           "loader": {"batch_size": 1, "num_workers": workers, "on_error": "skip", "prefetch_factor": 4}}
    whole = build_train_loader(cfg, repeat=False)
    list(whole)
    assert whole.skipped() == {"invalid_sample": ROWS_BAD}
    first = build_train_loader(cfg, repeat=False)
    it = iter(first)
    head = [next(it) for _ in range(K)]
    state = first.state_dict()
    time.sleep(READ_AHEAD_S)
    before = first.skipped()
    assert before == dict(consumed(head))
    second = build_train_loader(cfg, repeat=False)
    second.load_state_dict(state)
    list(second)
    assert Counter(before) + Counter(second.skipped()) == Counter(invalid_sample=ROWS_BAD)
