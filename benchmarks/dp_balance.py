"""Straggler ratio of data-parallel steps, without and with the loader's cost balance.

Every data-parallel rank waits at each step for the slowest one. Each rank here runs the loader's
per-buffer packing (``_pack_stream``: the task encoder's pre-packer, the code the loader runs, on
stand-in samples) over its own draw of a Nemotron Omni SFT mix (``_pack_stream.omni_mix``: text;
1-12 images; temporal video; audio of 1 s to 10 min; lognormal text lengths), seq_length 16,384,
buffer 256, ``minimum_bin_slack``, 2 workers per rank, batch size 1. A pack's cost is
``packing.balance.CostModel``'s: every row position's LLM work plus attention over each segment
(s²), vision patches and audio mel frames, with the coefficients of a Nemotron 3 Nano Omni-like
model (docs/packing.md). Per step, max over ranks ÷ mean over ranks; the straggler ratio is its
mean over the steps. Token fill: one worker's stream of 20,000 samples of the mix (a steady
state, where the ranks' runs are too short for it). Modelled throughput: the token fill ÷ the
slowest rank's mean step cost (mean cost x straggler ratio, per row position); the gain is a
setting's ÷ the unbalanced one's.

The figure without any balance (``packing.balance: null``, ``packing.carry: null``) is printed
first, then the defaults (even packs, even buffers, the step schedule and carried tails; no cost
cap), then ``packing.balance.cost_cap: 1.0`` with ``packing.carry.max_times: 8`` (the most even
packs, for token fill) and ``cost_cap: 1.2``. The last line is one JSON object with
``straggler_ratio_dp{8,64,1024}`` (the defaults) and the same keys with ``_unbalanced``,
``_cap_1.0`` and ``_cap_1.2``.
Goals, with the defaults: ≤ 1.05 at DP 64, ≤ 1.08 at DP 1024, token fill ≥ 99 %. ``--quick``: fewer steps, and a warm-up of about one
buffer a worker for the capped settings too (their caps then come from fewer buffers). The configs
and DP sizes are independent runs (each seeded by its DP size), spread over ``--processes`` (2)
processes: the figures are those of a serial run.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Optional

import _common as C
import numpy as np

from _pack_stream import fill_of, omni_mix, rank_steps
from energon_nemotron.config import PackingConfig
from energon_nemotron.guards import orphans

SEQ = 16384
GOALS = {64: 1.05, 1024: 1.08}
FILL_GOAL = 0.99
FILL_SAMPLES = 20000       # the token fill of a config: one worker's stream of this many samples
WARMUP = 200          # steps before the measured ones: the running cost sums settle
QUICK_WARMUP = 20     # --quick: every worker packs about one buffer before the measured steps


def configs() -> dict[str, PackingConfig]:
    """No balance (``balance: null``, ``carry: null``), the defaults (the goals are theirs), the
    tightest cap (``cost_cap: 1.0``, ``carry.max_times: 8``) and a looser one (``cost_cap: 1.2``)."""
    common = {"algorithm": "minimum_bin_slack", "buffer_size": 256}
    return {"unbalanced": PackingConfig(**common, balance=None, carry=None),
            "default": PackingConfig(**common),
            "cap_1.0": PackingConfig(**common, balance={"cost_cap": 1.0}, carry={"max_times": 8}),
            "cap_1.2": PackingConfig(**common, balance={"cost_cap": 1.2}, carry={"max_times": 8})}


def run(packing: PackingConfig, dp: int, steps: int, seed: int, warmup: int = WARMUP) -> dict:
    """Straggler ratio and step costs of ``dp`` ranks over ``steps`` steps (after ``warmup``: with a
    cost cap, the running cost sums settle first; without, 20). The token fill is :func:`fill`."""
    rng = np.random.default_rng(seed)
    capped = packing.balance is not None and packing.balance.cost_cap is not None
    warm = warmup if capped else min(warmup, 20)
    cost = np.stack([rank_steps(packing, SEQ, steps, rng, num_workers=2, warmup=warm) for _ in range(dp)], 1)
    return {"ratio": float(np.mean(cost.max(1) / cost.mean(1))),         # cost: [steps, dp]
            "mean_cost": float(cost.mean()), "p99_over_mean": float(np.quantile(cost, 0.99) / cost.mean())}


def fill(packing: PackingConfig) -> float:
    """Token fill of ``packing``: one worker's stream of ``FILL_SAMPLES`` samples of the mix."""
    return fill_of(packing, SEQ, omni_mix(FILL_SAMPLES, np.random.default_rng(0), SEQ))


def _job(label: str, dp: Optional[int], steps: int, warmup: int) -> tuple[str, Optional[int], Any]:
    """One independent piece of the benchmark, in a pool process: a config's ratio at ``dp`` (its
    generator seeded by ``dp`` alone, so the pool changes no figure), or its fill (``dp`` None)."""
    C.limit_threads()
    packing = configs()[label]
    return label, dp, (fill(packing) if dp is None else run(packing, dp, steps, seed=dp, warmup=warmup))


def measure(steps: dict[int, int], warmup: int, processes: int) -> dict[tuple[str, Optional[int]], Any]:
    """Every config's fill and its ratio at each DP size, the dearest jobs first, on ``processes``
    forked processes (the jobs are independent: the figures are those of a serial run)."""
    jobs = [(label, dp, n, warmup) for dp, n in sorted(steps.items(), reverse=True) for label in configs()]
    jobs += [(label, None, 0, warmup) for label in configs()]
    if processes <= 1:
        return {(label, dp): r for label, dp, r in (_job(*j) for j in jobs)}
    orphans.install()                   # forked pool processes die with this one, killed or not
    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("fork")) as pool:
        return {(label, dp): r for label, dp, r in pool.map(_job, *zip(*jobs))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps, a shorter warm-up")
    ap.add_argument("--processes", type=int, default=min(2, os.cpu_count() or 1),
                    help="processes to run the independent configs and DP sizes on (default: 2, or the cores)")
    args = ap.parse_args(argv)
    C.limit_threads()
    steps = {8: 100, 64: 100, 1024: 30} if args.quick else {8: 1000, 64: 400, 1024: 100}
    warmup = QUICK_WARMUP if args.quick else WARMUP
    out: dict = {"name": "dp_balance"}
    started = time.perf_counter()
    print(f"{len(configs()) * (len(steps) + 1)} runs on {args.processes} processes ...", flush=True)
    results = measure(steps, warmup, args.processes)
    for label in configs():
        f = results[(label, None)]
        for dp, n in steps.items():
            r = dict(results[(label, dp)], fill=f)
            # tokens per step: dp packs at the fill of all buffers; time per step: the slowest rank (mean x ratio)
            r["throughput"] = f / (r["ratio"] * r.pop("mean_cost") / SEQ)
            key = f"straggler_ratio_dp{dp}" + ("" if label == "default" else f"_{label}")
            out[key] = round(r["ratio"], 4)
            out[f"{label}_dp{dp}"] = {k: round(v, 4) for k, v in r.items()}
            print(f"{label:<11} DP {dp:>5} ({n} steps): straggler ratio {r['ratio']:.4f}  fill {r['fill']:.2%}  "
                  f"p99/mean {r['p99_over_mean']:.3f}", flush=True)
    for label in ("default", "cap_1.0", "cap_1.2"):
        gains = {dp: out[f"{label}_dp{dp}"]["throughput"] / out[f"unbalanced_dp{dp}"]["throughput"] for dp in steps}
        for dp, g in gains.items():
            out[f"throughput_gain_dp{dp}" + ("" if label == "default" else f"_{label}")] = round(g, 4)
        print(f"modelled throughput, {label} over unbalanced: " + ", ".join(f"DP {dp} {g:.3f}x" for dp, g in gains.items()))
    met = all(out[f"straggler_ratio_dp{dp}"] <= goal for dp, goal in GOALS.items()) and \
        results[("default", None)] >= FILL_GOAL
    print("goals with the defaults (DP 64 <= 1.05, DP 1024 <= 1.08, fill >= 99 %): " + ("met" if met else "NOT met"))
    out.update({"ratio": out["straggler_ratio_dp64"], "goal": GOALS[64], "better": "lower", "goals_met": met,
                "seq_length": SEQ, "buffer_size": 256, "workers_per_rank": 2, "steps": steps, "warmup": warmup,
                "quick": bool(args.quick), "processes": args.processes,
                "seconds": round(time.perf_counter() - started, 1)})
    C.emit(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
