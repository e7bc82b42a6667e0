"""The command loop the reference-environment workers (``_hf_image_worker.py``, ``_hf_audio_worker.py``)
share, and its driver on the project's side (:class:`RefWorker`, :func:`alternate`).

A worker prints ``ready``; then for every line on stdin: ``round`` processes each item once and prints a
JSON list of seconds per item; ``save OUT`` writes its outputs into ``OUT`` and prints ``saved``;
``quit`` ends. The worker side needs only the standard library (it runs in ``.venv-ref``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

REF_PYTHON = Path(__file__).resolve().parent.parent / ".venv-ref" / "bin" / "python"


def serve(items: Sequence[Any], run: Callable[[Any], Any], save: Callable[[Path], None]) -> None:
    """The worker's loop over stdin (module docs): ``run(item)`` is what one round times per item."""
    print("ready", flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        if cmd[0] == "save":
            save(Path(cmd[1]))
            print("saved", flush=True)
            continue
        seconds = []
        for item in items:
            t = time.perf_counter()
            run(item)
            seconds.append(time.perf_counter() - t)
        print(json.dumps(seconds), flush=True)


class RefWorker:
    """A worker script of ``benchmarks/`` started in ``.venv-ref`` (``with RefWorker(name, *args) as w``);
    :meth:`ask` sends one command and returns its answer line."""

    def __init__(self, script: str, *args: str) -> None:
        self.proc = subprocess.Popen([str(REF_PYTHON), str(Path(__file__).resolve().parent / script), *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONWARNINGS": "ignore"})

    def __enter__(self) -> "RefWorker":
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the reference worker {self.proc.args[1]} did not start")
        return self

    def ask(self, cmd: str) -> str:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline()

    def __exit__(self, *exc) -> None:
        try:
            self.ask("quit")
        finally:
            self.proc.wait(timeout=60)


def alternate(worker: RefWorker, items: Sequence[tuple[str, Any]], ours: Callable[[Any], Any], rounds: int,
              timer: Callable[[Callable[[], Any], int], list[float]]) -> tuple[dict, dict]:
    """``rounds`` rounds of ``ours(payload)`` on every ``(name, payload)`` of ``items`` and of the
    worker's ``round`` (which must hold the same items in the same order), the side going first
    alternating: ``({(name, "ours" | "hf"): [seconds per round]}, {"ours" | "hf": [total per round]})``."""
    per = {(name, side): [] for name, _ in items for side in ("ours", "hf")}
    totals = {"ours": [], "hf": []}
    for r in range(rounds):
        for side in (("ours", "hf") if r % 2 == 0 else ("hf", "ours")):
            if side == "hf":
                seconds = json.loads(worker.ask("round"))
            else:
                seconds = [timer(lambda: ours(payload), 1)[0] for _, payload in items]
            for (name, _), t in zip(items, seconds):
                per[name, side].append(t)
            totals[side].append(sum(seconds))
    return per, totals
