"""cProfile of one pass of a text loader, its own time grouped by component (Energon's wrappers and
reading, the project's cooker, tokenization, packing, loader): ``vs_naive_energon.py --profile``."""

from __future__ import annotations

import cProfile
import io
import pstats
from pathlib import Path
from typing import Any, Callable

#: (group, substrings of a profiled function's file path), first match wins
PROFILE_GROUPS = (
    ("energon wrappers", ("energon/wrappers/", "energon/task_encoder/", "energon/savable", "energon/worker",
                          "energon/rng", "energon/flavors/base_dataset", "torch/utils/data/")),
    ("energon reading", ("megatron/energon/", "multistorageclient", "/tarfile.py", "/json/", "webdataset")),
    ("our cooker", ("energon_nemotron/cookers/", "energon_nemotron/json_safety")),
    ("our tokenization", ("energon_nemotron/tokenization/", "tokenizers", "transformers/", "jinja2", "<template>")),
    ("our packing/assembly", ("energon_nemotron/packing/", "energon_nemotron/encoders/", "energon_nemotron/types",
                              "energon_nemotron/media/", "energon_nemotron/parallel", "torch/")),
    ("our loader/guards/telemetry", ("energon_nemotron/",)),
)


def profile_rows(stats: pstats.Stats) -> list[tuple[str, str, float, float]]:
    """(group, function, own s, cumulative s) of every profiled function, by own time. A builtin
    (file ``~``) is charged to the group of the caller that spent the most time in it."""
    def group(path: str) -> str:
        for name, needles in PROFILE_GROUPS:
            if any(n in path for n in needles):
                return name
        return "other"

    rows = []
    for (path, line, fn), (_, _, tottime, cumtime, callers) in stats.stats.items():
        where = path
        if path == "~" and callers:
            where = max(callers.items(), key=lambda kv: kv[1][2])[0][0]
        short = fn if path == "~" else f"{'/'.join(Path(path).parts[-2:])}:{line}({fn})"
        rows.append((group(where), short, tottime, cumtime))
    return sorted(rows, key=lambda r: -r[2])


def profile_pass(run: Callable[[], Any], label: str, top: int = 20) -> None:
    """cProfile one call of ``run`` (a pass over a warm loader); print the top entries by own and
    by cumulative time, the top ``top`` with their group and share, and the own time per group."""
    prof = cProfile.Profile()
    prof.enable()
    run()
    prof.disable()
    stats = pstats.Stats(prof)
    total = stats.total_tt
    for key in ("tottime", "cumulative"):
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats(key).print_stats(top)
        print(f"== {label}, by {key} (total {total:.3f} s)")
        print(s.getvalue())
    rows = profile_rows(stats)
    print(f"== top {top} by own time, grouped (share of {total:.3f} s)")
    for g, fn, own, cum in rows[:top]:
        print(f"  {own / total:>6.1%} {own:>7.3f} s  cum {cum:>7.3f} s  {g:<28}{fn}")
    groups: dict[str, float] = {}
    for g, _, own, _ in rows:
        groups[g] = groups.get(g, 0.0) + own
    print("== own time by group")
    for g, t in sorted(groups.items(), key=lambda kv: -kv[1]):
        print(f"  {g:<28}{t:>8.3f} s {t / total:>7.1%}")
