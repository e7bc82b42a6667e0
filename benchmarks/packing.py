"""Seconds and fill of the offline packers in ``energon_nemotron.packing.algorithms``.

Lengths: lognormal (median 600, sigma 0.9, ``numpy.random.default_rng(0)``), rounded, clipped to
>= 1; capacity 4096. ``--offline`` (the main number): 1,000,000 lengths, name ``packing_offline``;
without it (and always with ``--quick``): 100,000 lengths, name ``packing``.

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
    ap.add_argument("--quick", action="store_true", help="100k lengths for everything")
    ap.add_argument("--offline", action="store_true", help="1M lengths (the main number)")
    ap.add_argument("--repeats", type=int, default=None, help="timed runs of the package packers")
    args = ap.parse_args(argv)
    offline = args.offline and not args.quick
    n = 1_000_000 if offline else 100_000
    repeats = args.repeats or (3 if args.quick else 5)
    name = "packing_offline" if args.offline else "packing"

    C.limit_threads()
    import numpy as np

    from energon_nemotron.packing.algorithms import best_fit_decreasing, fill_ratio, first_fit_decreasing

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
