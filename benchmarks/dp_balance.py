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
slowest rank's mean step cost (mean cost x straggler ratio, per row position); the gain is
balanced ÷ today's.

Today's figure (``packing.balance: null``, ``packing.carry: null``: main before the balance) is
printed first, then the defaults (the step schedule and carried tails, no cost cap: no token fill
given up), then the balanced setting (``packing.balance.cost_cap: 1.0``, ``packing.carry.max_times:
8``), then ``cost_cap: 1.2`` (less fill given up). The last line is one JSON object with
``straggler_ratio_dp{8,64,1024}`` (balanced) and the same keys with ``_unbalanced`` (today),
``_default`` and ``_cap_1.2``.
Goals: ≤ 1.05 at DP 64, ≤ 1.08 at DP 1024. ``--quick``: fewer steps (under five minutes here).
"""

from __future__ import annotations

import argparse
import time

import _common as C
import numpy as np

from _pack_stream import fill_of, omni_mix, rank_steps
from energon_nemotron.config import PackingConfig

SEQ = 16384
GOALS = {64: 1.05, 1024: 1.08}
FILL_SAMPLES = 20000       # the token fill of a config: one worker's stream of this many samples
WARMUP = 200          # steps before the measured ones: the running cost sums settle


def configs() -> dict[str, PackingConfig]:
    """Today's (``balance: null``, ``carry: null``), the defaults (step schedule, carry; no cap),
    the balanced setting the goals are for (``cost_cap: 1.0``, ``carry.max_times: 8``) and a looser
    cap (``cost_cap: 1.2``) that gives up less token fill."""
    common = {"algorithm": "minimum_bin_slack", "buffer_size": 256}
    return {"unbalanced": PackingConfig(**common, balance=None, carry=None),
            "default": PackingConfig(**common),
            "balanced": PackingConfig(**common, balance={"cost_cap": 1.0}, carry={"max_times": 8}),
            "cap_1.2": PackingConfig(**common, balance={"cost_cap": 1.2}, carry={"max_times": 8})}


def run(packing: PackingConfig, dp: int, steps: int, seed: int, warmup: int = WARMUP) -> dict:
    """Straggler ratio, fill, modelled throughput and p99 cost of ``dp`` ranks over ``steps`` steps
    (after ``warmup``: with a cost cap, the running cost sums settle first; without, 20)."""
    rng = np.random.default_rng(seed)
    capped = packing.balance is not None and packing.balance.cost_cap is not None
    warm = warmup if capped else 20
    cost = np.stack([rank_steps(packing, SEQ, steps, rng, num_workers=2, warmup=warm) for _ in range(dp)], 1)
    ratio = float(np.mean(cost.max(1) / cost.mean(1)))                 # cost: [steps, dp]
    fill = fill_of(packing, SEQ, omni_mix(FILL_SAMPLES, np.random.default_rng(0), SEQ))
    # tokens per step: dp packs at the fill of all buffers; time per step: the slowest rank (mean x ratio)
    return {"ratio": ratio, "fill": fill, "throughput": fill / (ratio * float(cost.mean()) / SEQ),
            "p99_over_mean": float(np.quantile(cost, 0.99) / cost.mean())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps")
    args = ap.parse_args(argv)
    C.limit_threads()
    steps = {8: 100, 64: 100, 1024: 30} if args.quick else {8: 1000, 64: 400, 1024: 100}
    out: dict = {"name": "dp_balance"}
    rows = []
    started = time.perf_counter()
    for label, packing in configs().items():
        for dp, n in steps.items():
            r = run(packing, dp, n, seed=dp)
            rows.append((label, dp, n, r))
            key = f"straggler_ratio_dp{dp}" + ("" if label == "balanced" else f"_{label}")
            out[key] = round(r["ratio"], 4)
            out[f"{label}_dp{dp}"] = {k: round(v, 4) for k, v in r.items()}
            print(f"{label:<11} DP {dp:>5} ({n} steps): straggler ratio {r['ratio']:.4f}  fill {r['fill']:.2%}  "
                  f"p99/mean {r['p99_over_mean']:.3f}", flush=True)
    for label in ("default", "balanced", "cap_1.2"):
        gains = {dp: out[f"{label}_dp{dp}"]["throughput"] / out[f"unbalanced_dp{dp}"]["throughput"] for dp in steps}
        for dp, g in gains.items():
            out[f"throughput_gain_dp{dp}" + ("" if label == "balanced" else f"_{label}")] = round(g, 4)
        print(f"modelled throughput, {label} over today: " + ", ".join(f"DP {dp} {g:.3f}x" for dp, g in gains.items()))
    met = all(out[f"straggler_ratio_dp{dp}"] <= goal for dp, goal in GOALS.items())
    print("goals (DP 64 <= 1.05, DP 1024 <= 1.08): " + ("met" if met else "NOT met"))
    out.update({"ratio": out["straggler_ratio_dp64"], "goal": GOALS[64], "better": "lower", "goals_met": met,
                "seq_length": SEQ, "buffer_size": 256, "workers_per_rank": 2, "steps": steps, "quick": bool(args.quick),
                "seconds": round(time.perf_counter() - started, 1)})
    C.emit(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
