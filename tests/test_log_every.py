"""``loader.log_every`` prints its telemetry line without the user setting up logging (stderr,
``energon_nemotron: ...``), and logs it through ``logging`` where that is set up to show INFO."""

from __future__ import annotations

import subprocess
import sys

import yaml

from energon_data import text_config, text_dataset

SCRIPT = """
import logging, sys
from energon_nemotron import build_train_loader
if sys.argv[2] == "logging":
    logging.basicConfig(level=logging.INFO, format="LOGGED %(name)s %(message)s", stream=sys.stdout)
batches = list(build_train_loader(sys.argv[1], repeat=False))
print("BATCHES", len(batches))
"""


def run(tmp_path, mode: str) -> subprocess.CompletedProcess:
    ds, _ = text_dataset(tmp_path / "ds", "openai_messages", n=8)
    cfg = text_config(ds, workers=0, seq_length=512)
    cfg["loader"]["log_every"] = 2
    (tmp_path / "l.yaml").write_text(yaml.safe_dump(cfg))
    return subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "l.yaml"), mode],
                          capture_output=True, text=True, timeout=300)


def test_log_every_prints_without_logging_set_up(tmp_path):
    res = run(tmp_path, "plain")
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [line for line in res.stderr.splitlines() if line.startswith("energon_nemotron: batches ")]
    assert len(lines) == 4 and lines[0].startswith("energon_nemotron: batches 2 | packs 2 | samples 2 ")
    assert "BATCHES 8" in res.stdout


def test_log_every_goes_through_logging_when_it_is_set_up(tmp_path):
    res = run(tmp_path, "logging")
    assert res.returncode == 0, res.stderr[-3000:]
    assert sum(line.startswith("LOGGED energon_nemotron batches ") for line in res.stdout.splitlines()) == 4
    assert "energon_nemotron: batches" not in res.stderr
