"""Conversations/s of ``pack-megatron``: the Ray engine on 1 and 2 CPUs against the single-process engine.

Data: 200,000 synthetic conversations (``--quick``: 5,000; ``--conversations N``) in 8 JSONL files,
each a system prompt and 1–2 user/assistant exchanges of English-ish text (``_common._TextMaker``,
about 190 Qwen2.5 tokens per conversation), cached in ``benchmarks/.cache/pack_scale/``. Encoder:
the Qwen2.5 tokenizer, prompt format ``identity`` (prompt turns masked: two tokenizer passes per
conversation), seq_length 8192; output in shards of 500 rows.

Three runs, each in a fresh process (so that its peak RSS is its own): the single-process engine
(one thread), the Ray engine on a local cluster of 1 CPU, and of 2 CPUs (one actor per CPU; the
cluster's start-up is timed apart and not counted, the actors' start-up is). A run's rate is
conversations ÷ the seconds of its count, pack and write stages. The three runs must write the
same shards (sha256 compared).

``ratio`` = Ray 2 CPUs ÷ Ray 1 CPU (goal 1.7, higher is better); also ``per_core_ratio`` = (Ray 2
CPUs ÷ 2) ÷ single-process (goal 0.85). Driver memory: the peak RSS and its growth over the RSS
after the imports; the full run also packs a tenth of the input with the single-process engine and
Ray on 2 CPUs, and reports the growth's difference per million conversations (what the driver
holds per conversation, without Ray's fixed share).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import _common as C

SEQ_LENGTH = 8192
ROWS_PER_SHARD = 500
FILES = 8
SCALING_GOAL = 1.7
PER_CORE_GOAL = 0.85


def scale_conversation(maker: "C._TextMaker") -> list[dict]:
    """A system prompt and 1–2 exchanges; every content ends with a newline (turn boundaries are
    token boundaries, as masked formats require)."""
    return C.conversation(maker, system=(4, 20), exchanges=(1, 2), user=(5, 40), assistant=(10, 90))


def corpus(n: int) -> list[Path]:
    """``FILES`` JSONL files holding ``n`` conversations, one per line (built once, cached)."""
    folder = C.CACHE_DIR / "pack_scale" / f"n{n}"
    paths = [folder / f"part-{k:02d}.jsonl" for k in range(FILES)]
    marker = folder / "done.json"
    if marker.exists() and all(p.exists() for p in paths):
        return paths
    folder.mkdir(parents=True, exist_ok=True)
    maker = C._TextMaker(random.Random(0))
    per = -(-n // FILES)
    for k, path in enumerate(paths):
        with open(path, "w", encoding="utf-8") as f:
            for _ in range(min(per, n - k * per)):
                f.write(json.dumps({"messages": scale_conversation(maker)}) + "\n")
    marker.write_text(json.dumps({"conversations": n}))
    return paths


def rss_mib() -> float:
    """This process's peak resident set so far, MiB (``ru_maxrss``)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(args) -> int:
    """One run (``--run local|ray``): pack the corpus, print one JSON line."""
    import logging

    C.limit_threads()
    from energon_nemotron.megatron_packed import MegatronSFTPackedEncoder
    from energon_nemotron.megatron_packed.offline_pack import LocalEngine, PackOptions, pack

    tok = str(C.qwen_tokenizer_dir())
    encoder = MegatronSFTPackedEncoder(tok, SEQ_LENGTH, prompt_format="identity", pad_token="<|endoftext|>")
    engine, start = LocalEngine(), 0.0
    if args.run == "ray":
        import ray

        from energon_nemotron.megatron_packed.ray_engine import QUIET_ENV, RayEngine

        for k, v in QUIET_ENV.items():
            os.environ.setdefault(k, v)
        t = time.perf_counter()
        ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
        start = time.perf_counter() - t
        engine = RayEngine()
    base = rss_mib()
    t = time.perf_counter()
    summary = pack([str(p) for p in corpus(args.conversations)], Path(args.out) / "rows.jsonl.packed", encoder,
                   PackOptions(rows_per_shard=ROWS_PER_SHARD), engine=engine, progress=False)
    wall = time.perf_counter() - t
    manifest = json.loads(Path(summary.manifest).read_text())
    print(json.dumps({"engine": args.run, "cpus": args.cpus, "conversations": summary.conversations,
                      "rows": summary.rows, "fill_ratio": summary.fill_ratio, "times": summary.times, "wall_s": wall,
                      "cluster_start_s": start, "rss_base_mib": base, "rss_peak_mib": rss_mib(),
                      "shard_sha256": [s["sha256"] for s in manifest["shards"]]}))
    return 0


def run(kind: str, cpus: int, n: int, out: Path) -> dict:
    cmd = [sys.executable, __file__, "--run", kind, "--cpus", str(cpus), "--conversations", str(n), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"{kind} on {cpus} CPU(s) failed (exit status {proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="5,000 conversations (about a minute: two Ray clusters start)")
    ap.add_argument("--conversations", type=int, default=None)
    ap.add_argument("--run", choices=["local", "ray"], default=None, help=argparse.SUPPRESS)
    ap.add_argument("--cpus", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.conversations = args.conversations or (5_000 if args.quick else 200_000)
    if args.run:
        return child(args)

    import shutil
    import tempfile

    n = args.conversations
    t = time.perf_counter()
    paths = corpus(n)
    print(f"corpus: {n} conversations, {sum(p.stat().st_size for p in paths) / 2**20:.1f} MiB in {len(paths)} "
          f"files ({time.perf_counter() - t:.1f} s)", flush=True)
    C.qwen_tokenizer_dir()
    plan = [("local", 1, n), ("ray", 1, n), ("ray", 2, n)]
    if not args.quick:                  # the driver's memory per conversation: against a tenth of the input
        plan += [("local", 1, n // 10), ("ray", 2, n // 10)]
    results = {}
    with tempfile.TemporaryDirectory(prefix="pack_scale_") as tmp:
        for kind, cpus, size in plan:
            out = Path(tmp) / f"{kind}{cpus}_{size}"
            r = run(kind, cpus, size, out)
            shutil.rmtree(out, ignore_errors=True)
            work = r["times"]["count"] + r["times"]["pack"] + r["times"]["write"]
            r["conversations_per_s"] = r["conversations"] / work
            results[(kind, cpus, size)] = r
            print(f"{kind:<6}{cpus} CPU {size:>8} conv {r['conversations_per_s']:>8.0f} conv/s  stages "
                  + ", ".join(f"{k} {v:.2f} s" for k, v in r["times"].items())
                  + f"  (cluster start {r['cluster_start_s']:.1f} s)  driver RSS {r['rss_base_mib']:.0f} -> "
                  f"{r['rss_peak_mib']:.0f} MiB", flush=True)
    full = {f"{k}{c}": r for (k, c, size), r in results.items() if size == n}
    if len({json.dumps(r["shard_sha256"]) for r in full.values()}) != 1:
        raise AssertionError("the engines wrote different shards")
    local, ray1, ray2 = full["local1"], full["ray1"], full["ray2"]

    def growth(r: dict) -> float:
        return r["rss_peak_mib"] - r["rss_base_mib"]

    memory = {}
    for key, (kind, cpus) in (("local", ("local", 1)), ("ray2", ("ray", 2))):
        small = results.get((kind, cpus, n // 10))
        if small is not None:
            memory[f"{key}_driver_mib_per_million_conversations"] = round(
                (growth(full[f"{kind}{cpus}"]) - growth(small)) / ((n - n // 10) / 1e6), 1)
    per_core = ray2["conversations_per_s"] / 2 / local["conversations_per_s"]
    C.emit({
        "name": "pack_scale",
        "ratio": round(ray2["conversations_per_s"] / ray1["conversations_per_s"], 4),
        "goal": SCALING_GOAL,
        "better": "higher",
        "per_core_ratio": round(per_core, 4),
        "per_core_goal": PER_CORE_GOAL,
        "per_core_met": per_core >= PER_CORE_GOAL,
        "ray1_vs_local": round(ray1["conversations_per_s"] / local["conversations_per_s"], 4),
        "conversations": n,
        "rows": local["rows"],
        "fill_ratio": round(local["fill_ratio"], 6),
        "local_conversations_per_s": round(local["conversations_per_s"], 1),
        "ray1_conversations_per_s": round(ray1["conversations_per_s"], 1),
        "ray2_conversations_per_s": round(ray2["conversations_per_s"], 1),
        **{f"{k}_stage_s": {s: round(v, 2) for s, v in r["times"].items()} for k, r in full.items()},
        **{f"{k}_driver_peak_rss_mib": round(r["rss_peak_mib"], 1) for k, r in full.items()},
        **{f"{k}_driver_rss_growth_mib": round(growth(r), 1) for k, r in full.items()},
        **memory,
        "ray_cluster_start_s": round(ray2["cluster_start_s"], 2),
        "cpu_count": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "quick": bool(args.quick),
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
