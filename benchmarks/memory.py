"""Peak memory against packing-buffer size for video samples: flat, because media decode lazily.

A dataset of video samples (``general_conversations`` with one mp4 member each) is read through the
``nemotron_multimodal`` encoder with packing buffers of increasing size. Each buffer size runs in a
fresh process (``--child``) that reads a fixed number of packs and reports its peak resident set
size (``ru_maxrss``) and its baseline after importing everything. The buffer holds planned samples
(token ids and the compressed video bytes); frames are decoded only for the samples of the pack
being built, so the peak should not grow with the buffer.

``ratio`` = peak growth over the baseline at the largest buffer ÷ at the smallest (goal <= 1.25,
lower is better). An eager design that decoded every buffered video would grow linearly: the
table shows what that would hold (buffer × the decoded size of one video).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

import _common as C

GOAL = 1.25


def build_dataset(folder: Path, n: int) -> Path:
    from energon_nemotron.demo.datasets import prepare, write_shards
    from energon_nemotron.demo.media import make_video

    if (folder / ".nv-meta" / "dataset.yaml").exists():
        return folder
    samples = []
    for i in range(n):
        turns = [{"from": "human", "value": "<video>\nWhat moves?"}, {"from": "gpt", "value": f"Pattern {i}."}]
        samples.append((f"v{i:05d}", {"json": json.dumps({"conversations": turns}).encode(),
                                      "mp4": make_video(320, 180, seconds=4.0, fps=10, seed=i)}))
    write_shards(folder, samples, per_shard=32)
    return prepare(folder, {"cooker": "general_conversations"})


def child(dataset: str, buffer: int, packs: int) -> None:
    C.limit_threads()
    import yaml  # noqa: F401  (imported before the baseline is taken)

    from energon_nemotron.loading import build_train_loader

    cfg = {"tokenizer": str(Path(__file__).resolve().parents[1] / "energon_nemotron" / "demo" / "tokenizer"),
           "task_encoder": {"name": "nemotron_multimodal",
                            "options": {"prompt_format": "nemotron6", "seq_length": 4096,
                                        "video": {"max_frames": 16}}},
           "packing": {"algorithm": "best_fit_decreasing", "buffer_size": buffer},
           "data": {"train": {"path": dataset}},
           "loader": {"batch_size": 1, "num_workers": 0, "shuffle_buffer_size": None}}
    loader = build_train_loader(cfg, repeat=True)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for i, batch in enumerate(loader):
        if i + 1 >= packs:
            break
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"buffer": buffer, "baseline_mib": base / 1024, "peak_mib": peak / 1024}))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--child", nargs=3, metavar=("DATASET", "BUFFER", "PACKS"))
    args = ap.parse_args(argv)
    if args.child:
        child(args.child[0], int(args.child[1]), int(args.child[2]))
        return 0
    buffers = [8, 32, 64] if args.quick else [8, 32, 64, 128]
    dataset = build_dataset(C.CACHE_DIR / "memory_videos", n=max(buffers) + 8)
    packs = 3 if args.quick else 6
    rows = []
    for b in buffers:
        out = subprocess.run([sys.executable, __file__, "--child", str(dataset), str(b), str(packs)],
                             capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    decoded_mib = 16 * 1008 * 768 * 4 / 2**20          # 16 frames of 42x24 patches, float32
    print(f"{'buffer':>8}{'baseline MiB':>15}{'peak MiB':>11}{'growth MiB':>12}{'eager would hold MiB':>22}")
    for r in rows:
        print(f"{r['buffer']:>8}{r['baseline_mib']:>15.1f}{r['peak_mib']:>11.1f}"
              f"{r['peak_mib'] - r['baseline_mib']:>12.1f}{r['buffer'] * decoded_mib:>22.0f}")
    growth = [max(r["peak_mib"] - r["baseline_mib"], 1.0) for r in rows]
    C.emit({"name": "memory", "ratio": round(growth[-1] / growth[0], 3), "goal": GOAL, "better": "lower",
            "buffers": buffers, "peak_mib": [round(r["peak_mib"], 1) for r in rows],
            "growth_mib": [round(g, 1) for g in growth], "packs_read": packs, "quick": bool(args.quick)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
