"""The console script: demo end to end, errors exit 2 with the row named."""

from __future__ import annotations

import pytest

import json
import subprocess
import sys

from conftest import FIXTURE_TOKENIZER, MEGATRON_FIXTURES, write_jsonl
from energon_nemotron.cli import main


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "energon_nemotron.cli", *args], capture_output=True, text=True)


@pytest.mark.slow
def test_demo_runs_end_to_end(tmp_path):
    res = run_cli("demo", "--out", str(tmp_path), "--no-progress")
    assert res.returncode == 0, res.stderr
    assert "conversations 400/400" in res.stdout and "truncated rows 0" in res.stdout
    assert "demo OK" in res.stdout
    rows = (tmp_path / "train.jsonl.packed").read_text().splitlines()
    assert rows and all("messages" in json.loads(r) for r in rows)


def test_inspect_fixture_rows_json_matches_reference():
    res = run_cli("inspect-megatron", str(MEGATRON_FIXTURES / "train.jsonl.packed"), "--tokenizer",
                  str(FIXTURE_TOKENIZER), "--seq-length", "96", "--prompt-format", "nemotron-nano-v2",
                  "--context-parallel-size", "2", "--json")
    assert res.returncode == 0, res.stderr
    got = [json.loads(x) for x in res.stdout.splitlines()]
    ref = json.loads((MEGATRON_FIXTURES / "ref_nemotron-nano-v2_L96_cp2.json").read_text())["rows"]
    assert len(got) == 2
    for g, r in zip(got, ref):
        for key in ("tokens", "labels", "loss_mask", "position_ids"):
            assert g[key] == r[key]
        assert g["cu_seqlens"] == r["cu_seqlens_stripped"] and g["max_seqlen"] == r["max_seqlen"]
    assert [g["truncated"] for g in got] == [False, True]


def test_bad_row_exits_2_naming_file_and_line(tmp_path, capsys):
    path = write_jsonl(tmp_path / "bad.jsonl.packed", [{"messages": [{"role": "user", "content": 3}]}])
    code = main(["inspect-megatron", str(path), "--tokenizer", str(FIXTURE_TOKENIZER), "--seq-length", "96"])
    assert code == 2
    assert "bad.jsonl.packed:1: message 0 (user) content must be a string, got int" in capsys.readouterr().err


def test_a_closed_pipe_ends_the_command_quietly():
    """``energon-nemotron cookers | head -1`` where the reader has gone before the output is
    written: no traceback, no "Exception ignored", exit status 0."""
    proc = subprocess.Popen([sys.executable, "-m", "energon_nemotron.cli", "cookers"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()                         # the reader goes away before the command writes
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err
