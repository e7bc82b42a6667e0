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


@pytest.mark.parametrize("workers", [0, 2])
def test_a_data_error_is_one_message_and_the_traceback_is_behind_debug(tmp_path, capsys, workers):
    """A sample whose image is missing, read by ``preview`` (also from a loader worker, which PyTorch
    re-raises with the worker's whole traceback): one ``error:`` line naming the sample, the file and
    the reason, exit 2; ``--debug`` shows the traceback first."""
    import json as _json

    import yaml

    from energon_data import energon, text_config

    rows = [{"conversations": [{"from": "human", "value": "<image> What is it?"}, {"from": "gpt", "value": "A cat."}],
             "image": "imgs/pic0.jpg"}]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(_json.dumps(r) + "\n" for r in rows))
    energon("prepare", str(data))
    cfg = text_config(data, workers=workers)
    cfg["data"]["default_cooker"] = "general_conversations"
    (tmp_path / "loader.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["preview", str(tmp_path / "loader.yaml"), "--batches", "1"]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("error: data.jsonl:1: ") and "image file 'imgs/pic0.jpg' not found under the dataset folder" \
        in lines[0], lines[0]
    assert main(["--debug", "preview", str(tmp_path / "loader.yaml"), "--batches", "1"]) == 2
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_the_librarys_warnings_are_one_line(tmp_path):
    """A library warning on the command line is one ``warning: ...`` line, without the library's
    file path and source line (here the BufferOverDataWarning of a buffer over a tiny dataset)."""
    import yaml

    from energon_data import text_config, text_dataset

    ds, _ = text_dataset(tmp_path / "ds", "openai_messages", n=4)
    blend = tmp_path / "blend.yaml"           # weighted: no epoch, so preview --batches reads the repeating stream
    blend.write_text(yaml.safe_dump({"__module__": "megatron.energon", "__class__": "MetadatasetV2",
                                     "splits": {"train": {"blend": [{"weight": 1, "path": str(ds)}]}}}))
    cfg = text_config(blend, workers=0, packing={"algorithm": "first_fit_decreasing", "buffer_size": 16})
    (tmp_path / "loader.yaml").write_text(yaml.safe_dump(cfg))
    res = run_cli("preview", str(tmp_path / "loader.yaml"), "--batches", "1")
    assert res.returncode == 0, res.stderr
    lines = [line for line in res.stderr.splitlines() if "packing.buffer_size 16" in line]
    assert lines and all(line.startswith("warning: packing.buffer_size 16 is larger") for line in lines), res.stderr
    assert "energon_nemotron/" not in res.stderr and "warnings.warn" not in res.stderr, res.stderr
