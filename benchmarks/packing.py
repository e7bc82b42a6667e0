"""Fill of every packer in online buffers, and seconds and fill of the offline packers.

Without ``--offline`` (name ``packing``): every registered packer over consecutive buffers of 64,
256 and 1024 samples, capacity 4096, on (a) lognormal lengths (median 600, sigma 0.9) and (b) a
multimodal mix (text, image and video samples, each with a token length and a count of vision
patches). Fill = tokens / (packs × capacity); the per-buffer bound is ⌈Σ/capacity⌉ packs. For the
mix, ``minimum_bin_slack`` also runs with a second budget of vision patches per pack
(``max_media_patches_per_pack``): the table shows token fill, patch fill and the largest pack's
patches against the mean (balance of vision-encoder work). ``ratio`` = the best packer's fill at
buffer 256 on (a), goal >= 0.99. Then the buffer tails: one worker's stream of buffers through the
loader's pre-packer (``_pack_stream``) at buffers 32 and 256, without and with carried tails
(``packing.carry``); goal with them: fill at 32 within 0.3 points of 256 on both mixes.

``--offline`` (name ``packing_offline``; ``--quick``: 100,000 lengths):

Timed in the same run: ``best_fit_decreasing`` (the result: ``ratio`` = its seconds, goal 1.0 s,
lower is better), ``first_fit_decreasing``, and a plain-Python best-fit-decreasing written here
(sorted list of bin rooms searched with ``bisect``, one item at a time) as the reference. Fill is
``fill_ratio`` of the same module (goal 0.9998); ``lower_bound_fill`` = total / (ceil(total /
capacity) · capacity), the best any packing can do.
"""

from __future__ import annotations

import argparse
import bisect
import math
import sys

import _common as C

CAPACITY = 4096
FILL_GOAL = 0.9998
SECONDS_GOAL = 1.0
ONLINE_GOAL = 0.99
PATCH_BUDGET = 8192
TAIL_GOAL = 0.003           # fill at buffer 32 within 0.3 points of buffer 256, with carried tails


def multimodal_mix(n: int, np, seed: int = 1):
    """(tokens, patches) int64 [n]: 60 % text, 30 % image (256-1024 image tokens, 4 patches per
    token), 10 % video (1000-2000 visual tokens), text parts lognormal."""
    rng = np.random.default_rng(seed)
    kind = rng.choice(3, size=n, p=[0.6, 0.3, 0.1])
    text = np.maximum(np.rint(rng.lognormal(math.log(400), 0.8, size=n)), 1).astype(np.int64)
    visual = np.where(kind == 1, rng.integers(256, 1025, size=n), np.where(kind == 2, rng.integers(1000, 2001, size=n), 0))
    return np.minimum(text + visual, CAPACITY), 4 * visual


def online(args) -> int:
    """Per-buffer fill of every packer (see the module docstring)."""
    C.limit_threads()
    import numpy as np

    from energon_nemotron.registry import PACKERS

    n = 4096 if args.quick else 32768
    lengths = lognormal_lengths(n, np)
    mix_tokens, mix_patches = multimodal_mix(n, np)
    buffers = (64, 256, 1024)
    rows, best = [], {}
    for dist, toks in (("lognormal", lengths), ("multimodal", mix_tokens)):
        toks = np.minimum(toks, CAPACITY)
        for b in buffers:
            chunks = [toks[s:s + b] for s in range(0, n - n % b, b)]
            bound = sum(math.ceil(int(c.sum()) / CAPACITY) for c in chunks)
            total = sum(int(c.sum()) for c in chunks)
            rows.append((dist, b, "(bound)", total / (bound * CAPACITY), 0.0))
            for name in PACKERS.names():
                fn = PACKERS.get(name)
                secs = C.bench_timer(lambda: best.__setitem__("bins", [fn(c, CAPACITY) for c in chunks]), 1)[0]
                packs = sum(len(x) for x in best["bins"])
                rows.append((dist, b, name, total / (packs * CAPACITY), secs * 1000 / len(chunks)))
    print(f"{'lengths':<11}{'buffer':>7}  {'packer':<26}{'fill':>9}{'ms/buffer':>11}")
    for dist, b, name, fill, ms in rows:
        print(f"{dist:<11}{b:>7}  {name:<26}{fill:>9.4%}{ms:>11.2f}")
    at256 = {name: fill for dist, b, name, fill, _ in rows if dist == "lognormal" and b == 256 and name != "(bound)"}
    winner = max(at256, key=at256.get)

    # the second budget: vision patches per pack
    from energon_nemotron.packing import minimum_bin_slack

    balance = {}
    for label, kwargs in (("tokens only", {}), (f"+ {PATCH_BUDGET} patches", {"secondary": None})):
        packs_t = packs_p = 0
        peaks, means, total_t, total_p = [], [], 0, 0
        for s in range(0, n - n % 256, 256):
            t, p = mix_tokens[s:s + 256], mix_patches[s:s + 256]
            extra = {"secondary": p, "secondary_capacity": PATCH_BUDGET} if kwargs else {}
            bins = minimum_bin_slack(t, CAPACITY, **extra)
            per = [int(p[x].sum()) for x in bins]
            peaks.append(max(per))
            means.append(sum(per) / len(per))
            packs_t += len(bins)
            total_t += int(t.sum())
            total_p += int(p.sum())
        balance[label] = {"token_fill": total_t / (packs_t * CAPACITY), "patch_fill": total_p / (packs_t * PATCH_BUDGET),
                          "max_patches": max(peaks), "peak_over_mean": float(np.mean(peaks) / np.mean(means))}
    print(f"\nmultimodal mix, buffer 256, minimum_bin_slack: vision patches per pack")
    print(f"{'budgets':<22}{'token fill':>11}{'patch fill':>11}{'max patches':>13}{'peak/mean':>11}")
    for label, r in balance.items():
        print(f"{label:<22}{r['token_fill']:>11.4%}{r['patch_fill']:>11.4%}{r['max_patches']:>13}{r['peak_over_mean']:>11.2f}")
    tails = tail_fills(n, np, lengths, mix_tokens, mix_patches)
    C.emit({"name": "packing", "ratio": round(at256[winner], 6), "goal": ONLINE_GOAL, "better": "higher",
            "tails": tails, "tail_goal_points": TAIL_GOAL * 100,
            "tail_goal_met": all(t["gap_points"] <= TAIL_GOAL * 100 for k, t in tails.items() if k.endswith("carried")),
            "packer": winner, "fill_at_256": {k: round(v, 6) for k, v in at256.items()},
            "bound_at_256": round(next(f for d, b, nm, f, _ in rows if d == "lognormal" and b == 256 and nm == "(bound)"), 6),
            "fills": [{"lengths": d, "buffer": b, "packer": nm, "fill": round(f, 6)} for d, b, nm, f, _ in rows],
            "media_balance": {k: {kk: round(vv, 4) for kk, vv in v.items()} for k, v in balance.items()},
            "patch_budget": PATCH_BUDGET, "n": n, "quick": bool(args.quick)})
    return 0


def tail_fills(n: int, np, lengths, mix_tokens, mix_patches) -> dict:
    """Token fill of one worker's stream of buffers (``_pack_stream.fill_of``: the loader's
    pre-packer) at buffers 32 and 256, ``minimum_bin_slack``, without carried tails (today's
    ``packing.carry: null``) and with them (the default), on both mixes; the gap of buffer 32 to
    buffer 256 in points (goal with carried tails: <= 0.3)."""
    from _pack_stream import fill_of

    from energon_nemotron.config import PackingConfig

    out = {}
    print(f"\nbuffer tails: one worker's stream of buffers, minimum_bin_slack")
    print(f"{'lengths':<11}{'tails':<9}{'fill @32':>10}{'fill @256':>11}{'gap (points)':>14}")
    text = [(int(t), 0, 0) for t in np.minimum(lengths, CAPACITY)]
    mix = [(int(t), int(p), 0) for t, p in zip(mix_tokens, mix_patches)]
    for dist, samples in (("lognormal", text), ("multimodal", mix)):
        for label, carry in (("today", None), ("carried", {})):
            fills = [fill_of(PackingConfig(algorithm="minimum_bin_slack", buffer_size=b, carry=carry), CAPACITY,
                             samples) for b in (32, 256)]
            gap = (fills[1] - fills[0]) * 100
            out[f"{dist}_{label}"] = {"fill_32": round(fills[0], 6), "fill_256": round(fills[1], 6),
                                      "gap_points": round(gap, 4)}
            print(f"{dist:<11}{label:<9}{fills[0]:>10.4%}{fills[1]:>11.4%}{gap:>14.3f}")
    return out


def lognormal_lengths(n: int, np, median: float = 600.0, sigma: float = 0.9, seed: int = 0):
    """``n`` int64 lengths, lognormal with the given median and sigma, rounded, >= 1."""
    rng = np.random.default_rng(seed)
    x = rng.lognormal(mean=math.log(median), sigma=sigma, size=n)
    return np.maximum(np.rint(x), 1).astype(np.int64)


def python_bfd(lengths: list[int], capacity: int) -> list[list[int]]:
    """Reference best-fit-decreasing in plain Python: each item goes to the open bin with the least
    room that still fits it (ties: the lowest-numbered bin), else to a new bin; items longer than
    ``capacity`` get a bin of their own. Open bins are kept as a sorted list of (room, bin id)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])    # stable: equal keep order
    rooms: list[tuple[int, int]] = []
    bins: list[list[int]] = []
    for i in order:
        s = lengths[i]
        if s > capacity:
            bins.append([i])
            continue
        at = bisect.bisect_left(rooms, (s, -1))
        if at < len(rooms):
            room, b = rooms.pop(at)
            bins[b].append(i)
            room -= s
        else:
            b = len(bins)
            bins.append([i])
            room = capacity - s
        if room > 0:
            bisect.insort(rooms, (room, b))
    return bins


def check_bins(bins: list[list[int]], lengths, capacity: int) -> None:
    """Every item exactly once, no bin over capacity (except a lone oversized item)."""
    seen = sorted(i for b in bins for i in b)
    if seen != list(range(len(lengths))):
        raise AssertionError("bins do not hold every item exactly once")
    for b in bins:
        if len(b) > 1 and sum(int(lengths[i]) for i in b) > capacity:
            raise AssertionError(f"bin over capacity: {b[:5]}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer lengths (offline: 100k)")
    ap.add_argument("--offline", action="store_true", help="1M lengths (the main number)")
    ap.add_argument("--repeats", type=int, default=None, help="timed runs of the package packers")
    args = ap.parse_args(argv)
    if not args.offline:
        return online(args)
    offline = not args.quick
    n = 1_000_000 if offline else 100_000
    repeats = args.repeats or (3 if args.quick else 5)
    name = "packing_offline"

    C.limit_threads()
    import numpy as np

    from energon_nemotron.packing import best_fit_decreasing, fill_ratio, first_fit_decreasing

    lengths = lognormal_lengths(n, np)
    total = int(np.minimum(lengths, CAPACITY).sum())
    lower_bound_fill = total / (math.ceil(total / CAPACITY) * CAPACITY)

    results, secs = {}, {"bfd": [], "ffd": []}
    for _ in range(repeats):                             # interleaved, median
        for key, fn in (("bfd", best_fit_decreasing), ("ffd", first_fit_decreasing)):
            out = []
            secs[key] += C.bench_timer(lambda: out.append(fn(lengths, CAPACITY)), 1)
            results[key] = out[0]
    as_list = lengths.tolist()
    ref_secs = C.bench_timer(lambda: results.__setitem__("ref", python_bfd(as_list, CAPACITY)), 1)[0]

    for key in results:
        check_bins(results[key], lengths, CAPACITY)
    same_as_ref = results["bfd"] == results["ref"]
    fill = {k: fill_ratio(lengths, b, CAPACITY) for k, b in results.items()}
    bfd_s, ffd_s = C.median(secs["bfd"]), C.median(secs["ffd"])

    print(f"{n:,} lognormal lengths (median 600, sigma 0.9), capacity {CAPACITY}, one core")
    print(f"{'packer':<28}{'seconds':>9}{'bins':>10}{'fill':>10}")
    for label, key, s in (("best_fit_decreasing", "bfd", bfd_s), ("first_fit_decreasing", "ffd", ffd_s),
                          ("python bisect BFD (ref)", "ref", ref_secs)):
        print(f"{label:<28}{s:>9.3f}{len(results[key]):>10,}{fill[key]:>10.6f}")
    print(f"{'lower bound':<28}{'':>9}{math.ceil(total / CAPACITY):>10,}{lower_bound_fill:>10.6f}")
    print(f"BFD bins identical to the Python reference: {same_as_ref}")

    C.emit({
        "name": name,
        "ratio": round(bfd_s, 4),
        "goal": SECONDS_GOAL,
        "better": "lower",
        "n_lengths": n,
        "capacity": CAPACITY,
        "fill": round(fill["bfd"], 6),
        "fill_goal": FILL_GOAL,
        "fill_met": fill["bfd"] >= FILL_GOAL,
        "bins": len(results["bfd"]),
        "ffd_seconds": round(ffd_s, 4),
        "ffd_fill": round(fill["ffd"], 6),
        "reference_python_bfd_seconds": round(ref_secs, 4),
        "reference_fill": round(fill["ref"], 6),
        "same_bins_as_reference": same_as_ref,
        "speedup_vs_python": round(ref_secs / bfd_s, 2),
        "lower_bound_fill": round(lower_bound_fill, 6),
        "quick": bool(args.quick),
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
