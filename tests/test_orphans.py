"""A loader's workers die with its process: the main process of a 2-worker loader killed (SIGKILL or
SIGTERM) mid-iteration leaves no worker behind (``guards.orphans``). A loader dropped or closed
mid-iteration ends its workers at once, also when the cyclic collector frees it: they exit on
their own, not terminated after PyTorch's 5 s wait per worker."""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from energon_data import text_config, text_dataset
from energon_nemotron.loading import build_train_loader

SCRIPT = """
import json, sys, time
from energon_nemotron.loading import build_train_loader
it = iter(build_train_loader(json.loads(open(sys.argv[1]).read())))
next(it)
print("ready", flush=True)
time.sleep(600)
"""


def children(pid: int) -> list[int]:
    """The live (not zombie) processes whose parent is ``pid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(entry.name))
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_workers_die_with_the_main_process(tmp_path, sig):
    ds, _ = text_dataset(tmp_path / "ds", "openai_messages", n=40)
    cfg = text_config(ds, workers=2, packing={"algorithm": "first_fit_decreasing", "buffer_size": 4})
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    (tmp_path / "run.py").write_text(SCRIPT)
    proc = subprocess.Popen([sys.executable, str(tmp_path / "run.py"), str(tmp_path / "cfg.json")],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    workers: list[int] = []
    try:
        assert proc.stdout.readline().strip() == "ready"
        workers = children(proc.pid)
        assert len(workers) >= 2, workers
        os.kill(proc.pid, sig)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        while any(alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [w for w in workers if alive(w)]
        assert not left, f"workers {left} outlived their parent"
    finally:                                  # never leave a process behind, whatever failed
        for w in workers + children(proc.pid):
            if alive(w):
                os.kill(w, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()


def started_workers(tmp_path, before: set) -> tuple[object, object, list]:
    """A 2-worker loader (its workers still reading ahead, the packing buffer 4 of 40 samples), an
    iterator that has taken one batch, and the worker processes it started."""
    ds, _ = text_dataset(tmp_path / "ds", "openai_messages", n=40)
    loader = build_train_loader(text_config(ds, workers=2, packing={"algorithm": "first_fit_decreasing",
                                                                     "buffer_size": 4}))
    it = iter(loader)
    next(it)
    return loader, it, [p for p in multiprocessing.active_children() if p not in before]


@pytest.mark.parametrize("how", ["dropped", "closed"])
def test_a_loader_left_mid_epoch_ends_its_workers_at_once(tmp_path, monkeypatch, how):
    gc.collect()                          # a loader of an earlier test must not be collected below
    before = set(multiprocessing.active_children())
    loader, it, workers = started_workers(tmp_path, before)
    killed = []                           # PyTorch terminates the workers that did not end within 5 s
    terminate = multiprocessing.process.BaseProcess.terminate
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "terminate",
                        lambda self: (killed.append(self), terminate(self)))
    assert len(workers) == 2 and all(w.exitcode is None for w in workers)
    if how == "closed":
        loader.close()
        loader.close()                    # idempotent
    else:
        # the last references; Energon's config converter leaves a reference cycle that holds the
        # frames that built the loader (and so the caller's locals), so the loader goes at the
        # next collection: before, PyTorch's 5 s wait per worker, then terminate()
        del loader, it
        gc.collect()
    try:
        assert [w.exitcode for w in workers] == [0, 0] and not killed    # joined, each having ended on its own
    finally:
        for w in workers:
            if w.exitcode is None:
                w.kill()
                w.join(timeout=30)
