"""Throughput of the Energon loader with 2 workers ÷ with 1 worker, on a CPU-bound image workload.

Data: 200 ``general_conversations`` samples, each a WebDataset sample with one 1024x768 JPEG member
(``demo.media.make_image``) referenced by an ``<image>`` tag and a short text exchange; prepared
with the real ``energon prepare`` and cached in ``benchmarks/.cache/scaling/``. Loader:
``nemotron_multimodal`` (``nemotron6``, the demo tokenizer, default image options: 3,072 patches,
768 tokens per image), best-fit-decreasing packing with buffer 32, seq_length 16384 (about 12
images per packed row), batch size 1, no shuffle buffer, ``repeat=True``.

Each setting (``num_workers`` 1 and 2) runs in a fresh process (``--child``): it builds the loader,
reads 2 warm-up batches (worker start, first packing buffer), then times a fixed number of batches.
samples/s = samples in the timed batches ÷ their wall time. The full run alternates the settings
over 3 trials each and takes the median; ``--quick`` runs one trial each.

``workers_ratio`` = samples/s with 2 workers ÷ with 1 worker. The workers are
processes (PyTorch ``DataLoader``); the main process receives the batches (its unpickling of the
shared-memory tensors is part of the time). Each run also reports the cores' worth of CPU that the
main process and the workers (all their threads) used in the timed window, and the load average
before it. A worker writes each batch's pixel tensors (about 130 MiB of float32 patches per batch
here) straight into fresh shared memory, whose pages the kernel zeroes and maps; on a 2-core
machine, with the main process and any other load competing too, 2 workers cannot double the
throughput. ``cpu_count`` is recorded, and so is the machine's
own ceiling measured in the same run: a pure-Python CPU loop in 2 processes ÷ in 1
(``machine_ceiling``). ``ratio`` = ``workers_ratio`` ÷ that ceiling (goal 0.9, higher is better).
``workers_kernel_share``: the share of the workers' CPU time spent in the kernel (page faults and
the zeroing of fresh pages, the shared memory each batch's tensors are written into among them).
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

os.environ.setdefault("TQDM_DISABLE", "1")      # Energon's "Filling reading buffer" progress bar

import _common as C  # noqa: E402

GOAL = 0.9                  # of the machine's own two-process ceiling, measured in the same run
SAMPLES = 200
WIDTH, HEIGHT = 1024, 768
SEQ_LENGTH = 16384
BUFFER = 32
WARMUP = 2
DATA_VERSION = 1            # bump when the samples change: the cached dataset is rebuilt
TOKENIZER = Path(__file__).resolve().parents[1] / "energon_nemotron" / "demo" / "tokenizer"


def build_dataset(folder: Path, n: int = SAMPLES, seed: int = 0) -> Path:
    """The prepared dataset of ``n`` one-image conversations, reused when its marker matches."""
    from energon_nemotron.demo.media import make_image

    def samples() -> list[tuple[str, dict]]:
        maker = C._TextMaker(random.Random(seed))
        out = []
        for i in range(n):
            turns = [{"from": "system", "value": maker.text(maker.rng.randint(8, 30)).rstrip("\n")},
                     {"from": "human", "value": "<image>\n" + maker.text(maker.rng.randint(10, 40)).rstrip("\n")},
                     {"from": "gpt", "value": maker.text(maker.rng.randint(20, 80)).rstrip("\n")}]
            out.append((f"img{i:05d}", {"json": json.dumps({"conversations": turns}).encode(),
                                        "jpg": make_image(WIDTH, HEIGHT, seed=i)}))
        return out

    want = {"samples": n, "seed": seed, "size": [WIDTH, HEIGHT], "version": DATA_VERSION}
    return C.cached_prepared_dataset(folder, want, samples, "general_conversations", per_shard=20)


def loader_config(dataset: str, workers: int) -> dict:
    return {"tokenizer": str(TOKENIZER),
            "task_encoder": {"name": "nemotron_multimodal",
                             "options": {"prompt_format": "nemotron6", "seq_length": SEQ_LENGTH}},
            "packing": {"algorithm": "best_fit_decreasing", "buffer_size": BUFFER},
            "data": {"train": {"path": dataset}},
            "loader": {"batch_size": 1, "num_workers": workers, "shuffle_buffer_size": None, "seed": 0}}


def cpu_seconds(pids: list[int]) -> tuple[float, float]:
    """``(user, system)`` CPU seconds used so far by the processes ``pids`` (Linux ``/proc``)."""
    tick = os.sysconf("SC_CLK_TCK")
    user = system = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        user, system = user + int(fields[11]), system + int(fields[12])        # utime, stime
    return user / tick, system / tick


def child(dataset: str, workers: int, batches: int) -> None:
    """Warm up, time ``batches`` batches, print one JSON line (with the CPU seconds the main
    process and the workers used in the timed window: how much of the cores each got)."""
    import multiprocessing

    C.limit_threads()
    from energon_nemotron.loading import build_train_loader

    loader = build_train_loader(loader_config(dataset, workers), repeat=True)
    it = iter(loader)
    t0 = time.perf_counter()
    for _ in range(WARMUP):
        next(it)
    warm_s = time.perf_counter() - t0
    samples = images = 0
    media_bytes = 0
    pids = [p.pid for p in multiprocessing.active_children()]
    load = os.getloadavg()[0]
    cpu_main, (user0, sys0) = time.process_time(), cpu_seconds(pids)
    t = time.perf_counter()
    for _ in range(batches):
        batch = next(it)
        samples += sum(len(k) for k in batch.sample_keys)
        images += sum(len(spans) for spans in batch.media_spans)
        media_bytes += sum(v.data.nbytes if hasattr(v, "data") else v.nbytes for v in batch.media.values())
    s = time.perf_counter() - t
    user1, sys1 = cpu_seconds(pids)
    cpu_main, user, system = time.process_time() - cpu_main, user1 - user0, sys1 - sys0
    cpu_workers = user + system
    print(json.dumps({"workers": workers, "batches": batches, "samples": samples, "images": images,
                      "seconds": s, "samples_per_s": samples / s, "warmup_s": warm_s,
                      "main_cpu_share": cpu_main / s, "workers_cpu_share": cpu_workers / s,
                      "workers_kernel_share": system / cpu_workers if cpu_workers else 0.0,
                      "worker_pids": len(pids), "loadavg_1min_before": load,
                      "media_mib_per_batch": media_bytes / batches / 2**20}), flush=True)


def run_child(dataset: Path, workers: int, batches: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", str(dataset), str(workers), str(batches)],
                         capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"child with {workers} worker(s) failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _spin(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


def machine_scaling(n: int = 3_000_000) -> float:
    """The machine's own limit: a pure-Python CPU loop in 2 processes ÷ in 1 (same run)."""
    import multiprocessing as mp

    t = time.perf_counter()
    _spin(n)
    one = time.perf_counter() - t
    with mp.get_context("fork").Pool(2) as pool:
        t = time.perf_counter()
        pool.map(_spin, [n, n])
        two = time.perf_counter() - t
    return 2 * one / two


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one trial per setting, fewer batches")
    ap.add_argument("--batches", type=int, default=None, help="timed batches per run (after 2 warm-up)")
    ap.add_argument("--trials", type=int, default=None, help="runs per setting, alternating (median)")
    ap.add_argument("--child", nargs=3, metavar=("DATASET", "WORKERS", "BATCHES"))
    args = ap.parse_args(argv)
    if args.child:
        child(args.child[0], int(args.child[1]), int(args.child[2]))
        return 0
    batches = args.batches or (12 if args.quick else 30)
    trials = args.trials or (1 if args.quick else 3)

    t = time.perf_counter()
    dataset = build_dataset(C.CACHE_DIR / "scaling" / f"n{SAMPLES}")
    dataset_s = time.perf_counter() - t
    runs: dict[int, list[dict]] = {1: [], 2: []}
    for trial in range(trials):
        for w in ((1, 2) if trial % 2 == 0 else (2, 1)):
            runs[w].append(run_child(dataset, w, batches))

    def med(w: int, k: str) -> float:
        return C.median([r[k] for r in runs[w]])

    print(f"{'workers':>8}{'samples/s':>11}{'samples':>9}{'seconds':>9}{'warm-up s':>11}{'main CPU':>10}"
          f"{'workers CPU':>13}{'kernel':>8}{'load':>6}   per trial samples/s")
    for w, rs in runs.items():
        print(f"{w:>8}{med(w, 'samples_per_s'):>11.2f}{rs[0]['samples']:>9}{med(w, 'seconds'):>9.2f}"
              f"{med(w, 'warmup_s'):>11.2f}{med(w, 'main_cpu_share'):>10.2f}{med(w, 'workers_cpu_share'):>13.2f}"
              f"{med(w, 'workers_kernel_share'):>8.0%}"
              f"{med(w, 'loadavg_1min_before'):>6.1f}   " + " ".join(f"{r['samples_per_s']:.2f}" for r in rs))
    print("(CPU: cores' worth used in the timed window, by the main process and by all workers together;"
          " kernel: the share of the workers' CPU spent in the kernel; load: 1-minute load average before the"
          " window, other processes included)")
    print(f"dataset ready in {dataset_s:.1f} s; cpu_count {os.cpu_count()}")
    sps = {w: C.median([r["samples_per_s"] for r in rs]) for w, rs in runs.items()}
    machine = C.median([machine_scaling() for _ in range(3)])
    print(f"this machine's own ceiling (pure-Python loop, 2 processes / 1): {machine:.2f}x; the loader reaches "
          f"{sps[2] / sps[1] / machine:.0%} of it")
    C.emit({"name": "scaling", "ratio": round(sps[2] / sps[1] / machine, 4), "goal": GOAL, "better": "higher",
            "workers_ratio": round(sps[2] / sps[1], 4), "machine_ceiling": round(machine, 3),
            "samples_per_s_1_worker": round(sps[1], 3), "samples_per_s_2_workers": round(sps[2], 3),
            "cpu_count": os.cpu_count(),
            "main_cpu_share": {str(w): round(med(w, "main_cpu_share"), 3) for w in runs},
            "workers_cpu_share": {str(w): round(med(w, "workers_cpu_share"), 3) for w in runs},
            "workers_kernel_share": {str(w): round(med(w, "workers_kernel_share"), 3) for w in runs},
            "loadavg_1min": {str(w): round(med(w, "loadavg_1min_before"), 2) for w in runs},
            "media_mib_per_batch": round(runs[1][0]["media_mib_per_batch"], 1),
            "timed_batches": batches, "warmup_batches": WARMUP,
            "trials": trials, "samples_per_batch_mean": round(runs[1][0]["samples"] / batches, 2),
            "image_size": [WIDTH, HEIGHT], "dataset_samples": SAMPLES, "seq_length": SEQ_LENGTH,
            "packing_buffer": BUFFER, "quick": bool(args.quick)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
