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


def test_a_second_run_on_one_output_is_refused_naming_the_holder(tmp_path):
    """Two pack-megatron runs on one output at once: the second is a ConfigError naming the first
    (pid, host, start), not a FileNotFoundError; once the first ends the output can be written."""
    import os

    from energon_nemotron.errors import ConfigError
    from energon_nemotron.megatron_packed.output_lock import output_lock

    raw = write_jsonl(tmp_path / "raw.jsonl", [{"messages": c} for c in make_conversations(8, seed=2)])
    enc = MegatronSFTPackedEncoder(DEMO_TOKENIZER, 512, "nemotron-h-aligned")
    out = tmp_path / "o.jsonl.packed"
    with output_lock(out):                             # the first run, here held by this test
        script = ("import sys; from conftest import DEMO_TOKENIZER; from energon_nemotron.errors import ConfigError\n"
                  "from energon_nemotron.megatron_packed import MegatronSFTPackedEncoder\n"
                  "from energon_nemotron.megatron_packed.offline_pack import pack_file\n"
                  "enc = MegatronSFTPackedEncoder(DEMO_TOKENIZER, 512, 'nemotron-h-aligned')\n"
                  "try:\n    pack_file(sys.argv[1], sys.argv[2], enc, progress=False)\n"
                  "except ConfigError as e:\n    print(e)\n")
        res = subprocess.run([sys.executable, "-c", script, str(raw), str(out)], capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, timeout=300)
        assert f"another pack-megatron run is writing it (pid {os.getpid()} on " in res.stdout, res.stdout + res.stderr
        assert not out.exists()
    assert pack_file(raw, out, enc, progress=False).rows > 0 and out.is_file()
    left = (tmp_path / "o.jsonl.packed.lock").read_text().splitlines()  # a finished run's lock file says what it is
    assert left[0].startswith("pid ") and "released lock" in left[1] and "flock" in left[1], left
    with pytest.raises(ConfigError, match="another pack-megatron run"):
        with output_lock(out):
            with output_lock(out):                     # a second lock, even in one process, is refused
                pass


def test_a_full_disk_while_writing_is_one_clear_error(tmp_path):
    """A file-size limit (as a full disk) while a shard is written: exit 2 with one message naming
    the output and the error, not an OSError traceback; rerunning without the limit finishes."""
    raw = write_jsonl(tmp_path / "raw.jsonl", [{"messages": c} for c in make_conversations(60, seed=4)])
    out = tmp_path / "o.jsonl.packed"
    args = ["pack-megatron", "--input", str(raw), "--output", str(out), "--rows-per-shard", "4", "--no-progress",
            "--tokenizer", str(DEMO_TOKENIZER), "--seq-length", "512", "--prompt-format", "nemotron-h-aligned"]
    script = ("import resource, signal, sys\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
              "resource.setrlimit(resource.RLIMIT_FSIZE, (6000, 6000))\n"
              "from energon_nemotron.cli import main\nsys.exit(main(sys.argv[1:]))\n")
    res = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=300)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr and res.stderr.startswith(f"error: {out}: writing failed (File too large"), \
        res.stderr
    res = subprocess.run([sys.executable, "-m", "energon_nemotron.cli", *args], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    assert json.loads(out.with_name(out.name + ".manifest.json").read_text())["complete"]
