"""A loader never waits without end (issue 27 A): a worker that yields nothing for
``loader.watchdog_timeout_seconds`` ends with a message naming it, its pid and the sample it began
last, with its threads' stacks; the loader then fails with a ``LoaderError``. Without workers the
process itself ends with that message (Energon's watchdog)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from energon_nemotron.config import LoaderSettings
from energon_nemotron.errors import LoaderError, original_message
from energon_nemotron.guards.stalls import describe_stall, worker_exit_error

_STUCK = """
import sys, time, yaml
from energon_nemotron.encoders.nemotron_multimodal import NemotronMultimodalTaskEncoder
from energon_nemotron.errors import LoaderError
from energon_nemotron.loading import build_train_loader

prepare = NemotronMultimodalTaskEncoder.prepare_sample
def stuck(self, sample):                    # the third line never finishes (a stand-in for a hung read)
    if sample.__key__.endswith(":3"):
        time.sleep(3600)
    return prepare(self, sample)
NemotronMultimodalTaskEncoder.prepare_sample = stuck
cfg = yaml.safe_load(open(sys.argv[1]))
try:
    print(sum(1 for _ in build_train_loader(cfg, repeat=False)))
except LoaderError as e:
    print("LoaderError:", e, file=sys.stderr)
    sys.exit(3)
"""


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stuck_loader_ends_naming_the_worker_and_the_sample(tmp_path, workers):
    import json

    import yaml

    from energon_data import energon, text_config

    rows = [{"messages": [{"role": "user", "content": f"Q{i}"}, {"role": "assistant", "content": f"A{i}"}]}
            for i in range(6)]
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    energon("prepare", str(data))
    cfg = text_config(data, workers=workers)
    cfg["data"]["default_cooker"] = "openai_messages"
    cfg["loader"]["watchdog_timeout_seconds"] = 3
    (tmp_path / "loader.yaml").write_text(yaml.safe_dump(cfg))
    start = time.monotonic()
    res = subprocess.run([sys.executable, "-c", _STUCK, str(tmp_path / "loader.yaml")], capture_output=True,
                         text=True, timeout=240)
    assert time.monotonic() - start < 200
    out = res.stdout + res.stderr
    who = "loader worker " if workers else "the loader (pid "
    assert f"{who}" in out and "made no progress for 3 s (loader.watchdog_timeout_seconds): the last sample it " \
        "began is chat.jsonl:3" in out, out[-3000:]
    assert "Watchdog triggered: Dumping thread stacks" in out and "time.sleep" in out or "stuck" in out, out[-3000:]
    if workers:
        assert res.returncode == 3 and "LoaderError: DataLoader worker" in res.stderr, res.stderr[-2000:]
    else:
        assert res.returncode == 1, out[-2000:]


def test_the_watchdog_is_on_by_default():
    assert LoaderSettings().watchdog_timeout_seconds == 600


def test_messages():
    assert describe_stall(5).startswith("the loader (pid ")
    e = worker_exit_error(RuntimeError("DataLoader worker (pid(s) 123) exited unexpectedly"))
    assert isinstance(e, LoaderError) and original_message(e).startswith("DataLoader worker (pid(s) 123) exited")
    assert worker_exit_error(RuntimeError("something else")) is None
