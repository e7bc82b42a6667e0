"""Offline packer: every conversation exactly once, rows never overflow when re-encoded."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

from conftest import DEMO_TOKENIZER, write_jsonl
from energon_nemotron.demo.conversations import make_conversations
from energon_nemotron.errors import DataError
from energon_nemotron.megatron_packed import MegatronSFTPackedDataset, MegatronSFTPackedEncoder
from energon_nemotron.megatron_packed.conversation import split_conversations
from energon_nemotron.megatron_packed.offline_pack import pack_file


def canon(conv):
    if conv[0]["role"] != "system":
        conv = [{"role": "system", "content": ""}] + conv
    return json.dumps(conv, sort_keys=True)


@pytest.mark.parametrize("algorithm", ["best_fit_decreasing", "first_fit_decreasing"])
@pytest.mark.parametrize("fmt, cp", [("nemotron-h-aligned", 1), ("identity", 2), ("nemotron-nano-v2", 4)])
def test_every_conversation_once_and_no_overflow(tmp_path, algorithm, fmt, cp):
    convs = make_conversations(150, seed=11)
    # some lines hold two conversations (split at the system message)
    lines = [{"messages": convs[i] + (convs[i + 1] if i % 10 == 0 and convs[i + 1][0]["role"] == "system" else [])}
             for i in range(0, 150)]
    raw = write_jsonl(tmp_path / "raw.jsonl", lines)
    enc = MegatronSFTPackedEncoder(DEMO_TOKENIZER, 768, fmt, context_parallel_size=cp)
    summary = pack_file(raw, tmp_path / "out.jsonl.packed", enc, algorithm=algorithm, progress=False)

    want = Counter(canon(c) for line in lines for c in split_conversations(line["messages"]))
    got_rows = [json.loads(x) for x in (tmp_path / "out.jsonl.packed").read_text().splitlines()]
    got = Counter(canon(c) for row in got_rows for c in split_conversations(row["messages"]))
    assert got == want
    assert summary.conversations == sum(want.values()) and summary.rows == len(got_rows)
    assert summary.oversized == []

    encoded = list(MegatronSFTPackedDataset(tmp_path / "out.jsonl.packed", enc))
    assert not any(r["truncated"] for r in encoded)
    assert sum(len(r["sample_keys"]) for r in encoded) == summary.conversations
    every = [c for line in lines for c in split_conversations(line["messages"])]
    every = [c if c[0]["role"] == "system" else [{"role": "system", "content": ""}] + c for c in every]
    # the reported fill is the conversations' cost (tokens rounded up to 2*CP) over the rows' room
    assert sum(enc.conversation_cost(c) for c in every) / (len(encoded) * 768) == pytest.approx(summary.fill_ratio)
    # and the rows hold exactly the conversations' tokens (the demo text never contains the pad)
    real = sum(int((r["tokens"] != enc.pad_id).sum()) + int(r["labels"][-1] != enc.pad_id) for r in encoded)
    assert real == sum(enc.sft.count_tokens(c) for c in every)
    lower_bound_rows = -(-summary.tokens // 768)
    assert summary.rows <= lower_bound_rows + 1


def test_oversized_conversation_gets_its_own_row(tmp_path):
    enc = MegatronSFTPackedEncoder(DEMO_TOKENIZER, 64, "nemotron-h-aligned")
    long = [{"role": "system", "content": "s"}, {"role": "user", "content": "Count please."},
            {"role": "assistant", "content": ", ".join(str(i) for i in range(200))}]
    short = [{"role": "system", "content": "s"}, {"role": "user", "content": "Hi"},
             {"role": "assistant", "content": "Hello."}]
    raw = write_jsonl(tmp_path / "raw.jsonl", [{"messages": short}, {"messages": long}, {"messages": short}])
    summary = pack_file(raw, tmp_path / "o.jsonl.packed", enc, progress=False)
    assert summary.oversized == [f"{raw}:2#0"]
    rows = [json.loads(x)["messages"] for x in (tmp_path / "o.jsonl.packed").read_text().splitlines()]
    assert sorted(len(split_conversations(r)) for r in rows) == [1, 2]
    assert [long] in [split_conversations(r) for r in rows]


def test_bad_input_names_line(tmp_path):
    enc = MegatronSFTPackedEncoder(DEMO_TOKENIZER, 256, "nemotron-h-aligned")
    raw = write_jsonl(tmp_path / "raw.jsonl", [{"messages": make_conversations(1)[0]},
                                               {"messages": [{"role": "user", "content": "q"},
                                                             {"role": "assistant", "content": ""}]}])
    with pytest.raises(DataError, match=r"raw\.jsonl:2: message 1 is an empty assistant turn"):
        pack_file(raw, tmp_path / "o.jsonl.packed", enc, progress=False)
    assert not (tmp_path / "o.jsonl.packed").exists()


@pytest.mark.slow
def test_cli_pack_then_inspect(tmp_path):
    raw = write_jsonl(tmp_path / "raw.jsonl", [{"messages": c} for c in make_conversations(40, seed=5)])
    out = tmp_path / "train.jsonl.packed"
    common = ["--tokenizer", str(DEMO_TOKENIZER), "--seq-length", "512", "--prompt-format", "nemotron-h-aligned",
              "--context-parallel-size", "2"]
    res = subprocess.run([sys.executable, "-m", "energon_nemotron.cli", "pack-megatron", "--input", str(raw),
                          "--output", str(out), "--algorithm", "first_fit_decreasing", "--no-progress", *common],
                         capture_output=True, text=True, check=True)
    assert "conversations      40" in res.stdout and "fill ratio" in res.stdout
    res = subprocess.run([sys.executable, "-m", "energon_nemotron.cli", "inspect-megatron", str(out), "--rows", "2",
                          "--json", *common], capture_output=True, text=True, check=True)
    objs = [json.loads(x) for x in res.stdout.splitlines()]
    enc = MegatronSFTPackedEncoder(DEMO_TOKENIZER, 512, "nemotron-h-aligned", context_parallel_size=2)
    first = json.loads(out.read_text().splitlines()[0])
    direct = enc.encode(first, f"{out}:1")
    assert len(objs) == 2
    for key in ("tokens", "labels", "loss_mask", "position_ids", "cu_seqlens"):
        assert objs[0][key] == direct[key].tolist()
    assert objs[0]["max_seqlen"] == direct["max_seqlen"]
    res = subprocess.run([sys.executable, "-m", "energon_nemotron.cli", "inspect-megatron", str(out), "--rows", "1",
                          "--color", "never", *common], capture_output=True, text=True, check=True)
    assert "segment 0" in res.stdout and "⟦" in res.stdout and "<SPECIAL_11>Assistant" in res.stdout
