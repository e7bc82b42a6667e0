"""Run every benchmark script of this folder and summarise their results.

Each ``benchmarks/*.py`` (except ``_*.py`` and this file) runs as a subprocess with the same
Python, with ``--quick`` when given here; ``packing.py`` runs twice (online buffers, then ``--offline``). The last stdout
line of each is its JSON result. Prints a table (name, ratio, goal, better, met) and writes
``benchmarks/results/summary.json``. Exit status 0 even when a goal is missed; 1 when a script
crashes or prints no JSON result.
"""

from __future__ import annotations

import platform
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: argument lists per script; each list is one run (packing.py runs twice: online buffers, then --offline)
RUNS = {"packing.py": [[], ["--offline"]]}


def scripts() -> list[Path]:
    """The benchmark scripts, in name order."""
    return sorted(p for p in HERE.glob("*.py") if not p.name.startswith("_") and p.name != Path(__file__).name)


def last_json(stdout: str):
    """The JSON object on the last non-empty line of ``stdout``, or None."""
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    if not lines:
        return None
    try:
        obj = json.loads(lines[-1])
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def met(r: dict) -> bool:
    """Whether ``r["ratio"]`` reaches ``r["goal"]`` in the ``better`` direction."""
    return r["ratio"] >= r["goal"] if r["better"] == "higher" else r["ratio"] <= r["goal"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="pass --quick to every script")
    ap.add_argument("--only", nargs="*", help="script names to run (default: all)")
    args = ap.parse_args(argv)

    results, crashed = [], []
    runs = [(path, extra) for path in scripts() for extra in RUNS.get(path.name, [[]])]
    for path, extra in runs:
        if args.only and path.stem not in args.only and path.name not in args.only:
            continue
        cmd = [sys.executable, str(path), *(["--quick"] if args.quick else []), *extra]
        print(f"== {path.name} {' '.join(cmd[2:])}", flush=True)
        t = time.perf_counter()
        proc = subprocess.run(cmd, cwd=HERE.parent, capture_output=True, text=True)
        wall = time.perf_counter() - t
        sys.stdout.write(proc.stdout)
        if proc.returncode:
            sys.stdout.write(proc.stderr)
        result = last_json(proc.stdout)
        if proc.returncode or result is None or not {"name", "ratio", "goal", "better"} <= set(result):
            why = f"exit status {proc.returncode}" if proc.returncode else "no JSON result on the last line"
            print(f"!! {path.name} crashed: {why}", flush=True)
            crashed.append({"script": path.name, "error": why, "stderr_tail": proc.stderr[-2000:]})
            continue
        result["met"] = met(result)
        result["script"] = path.name
        result["wall_s"] = round(wall, 2)
        results.append(result)

    print()
    print(f"{'name':<20}{'ratio':>12}{'goal':>10}  {'better':<8}{'met':<5}{'wall s':>8}")
    for r in results:
        print(f"{r['name']:<20}{r['ratio']:>12.4g}{r['goal']:>10.4g}  {r['better']:<8}"
              f"{'yes' if r['met'] else 'no':<5}{r['wall_s']:>8.1f}")
    for c in crashed:
        print(f"{c['script']:<20}  CRASHED ({c['error']})")

    out = HERE / "results" / "summary.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    summary = {"quick": bool(args.quick), "python": platform.python_version(), "results": results, "crashed": crashed}
    out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"summary written to {out.relative_to(HERE.parent)}")
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
