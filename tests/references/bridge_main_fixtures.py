"""Make ``tests/fixtures/bridge_main/``: Megatron-Bridge main's results on the project's rows.

    git -C BRIDGE_REPO archive 067f987 src | tar -x -C WORK
    .venv/bin/python tests/references/bridge_main_fixtures.py WORK/src

Builds the cases of ``tests/bridge_main_cases.py`` in a temporary folder, runs
``bridge_main_merge.py`` (Bridge main's step and model) on them in a subprocess and writes
``results.pt.gz``: ``{"commit", "cases": [{"name", "cp_size", "model", "expect", "inputs"}],
"results": [...]}`` (``inputs``: ``bridge_main_cases.fixture_inputs``; ``results``: the runner's,
integer tensors as int32). ``tests/test_bridge_main.py`` rebuilds the cases and checks them against it.
"""

from __future__ import annotations

import gzip
import subprocess
import sys
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

import torch  # noqa: E402

from bridge_main_cases import BRIDGE_MAIN_COMMIT, build_cases, fixture_inputs  # noqa: E402

FIXTURE = TESTS / "fixtures" / "bridge_main" / "results.pt.gz"


def _small(value):
    """Integer tensors as int32 (the fixture's size), everything else as it is, recursively."""
    if isinstance(value, torch.Tensor) and value.dtype == torch.int64:
        return value.to(torch.int32)
    if isinstance(value, dict):
        return {k: _small(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_small(v) for v in value]
    return value


def main(bridge_src: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cases = build_cases(Path(tmp) / "data")
        runner_cases = [{k: c[k] for k in ("name", "cp_size", "batch", "model")} for c in cases]
        torch.save(runner_cases, Path(tmp) / "cases.pt")
        subprocess.run([sys.executable, str(TESTS / "references" / "bridge_main_merge.py"), bridge_src,
                        str(Path(tmp) / "cases.pt"), str(Path(tmp) / "results.pt")], check=True)
        results = torch.load(Path(tmp) / "results.pt", weights_only=False)
    fixture = {"commit": BRIDGE_MAIN_COMMIT,
               "cases": [{"name": c["name"], "cp_size": c["cp_size"], "model": c["model"], "expect": c["expect"],
                          "inputs": _small(fixture_inputs(c))} for c in cases],
               "results": _small(results)}
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(FIXTURE, "wb", compresslevel=9) as f:
        torch.save(fixture, f)
    print(f"{FIXTURE.relative_to(TESTS.parent)}: {len(cases)} cases, {FIXTURE.stat().st_size} bytes")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
