"""Peak RSS per loader worker with large audio clips: the packing buffer's media bytes bounded.

A planned sample waits in the packing buffer with its compressed media bytes until its pack is
built, so a worker holds about ``buffer_size`` × the clip size (NeMo-RL's configs shrink the buffer
from 5000 to 32 to survive 162 MB clips). ``packing.max_buffer_bytes`` bounds that
(``encoders.held_media``): a sample whose bytes do not fit leaves them out and reads them again by
its restore key when its pack is built.

The real loader (``nemotron_multimodal``, ``general_conversations`` tar shards, one WAV clip per
sample of ``--clip-mb`` MB: 48 kHz stereo PCM, 9 minutes at 100 MB), packing buffer 64, 2 workers,
seq 16,384 (two clips a pack), reads ``--batches`` batches three times, each in a fresh process:
without a bound (today), with ``max_buffer_bytes`` = the budget, and with 0 (no media held: the
worker's constant, what it needs besides the buffer: its imports, a pack's clips read again and
decoded). The peak RSS per worker is the largest ``ru_maxrss`` of the workers once they have exited.

``ratio`` = (peak with the budget − the constant) ÷ the budget: goal ≤ 1.0 (the bound holds:
peak ≤ budget + constant). The batches of the three runs must be bit for bit the same (digests).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import io
import json
import resource
import subprocess
import sys
import wave
from pathlib import Path

import _common as C

GOAL = 1.0
BUFFER, WORKERS, SEQ = 64, 2, 16384
RATE, CHANNELS = 48000, 2


def wav_clip(nbytes: int, seed: int) -> bytes:
    """A WAV file of about ``nbytes``: 48 kHz stereo s16 noise at a low level."""
    import numpy as np

    frames = max(nbytes - 44, 4) // (2 * CHANNELS)
    pcm = np.random.default_rng(seed).integers(-3000, 3000, size=frames * CHANNELS, dtype=np.int16)
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(CHANNELS)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(pcm.tobytes())
    return buf.getvalue()


def build_dataset(clip_mb: int, clips: int) -> Path:
    def samples():
        for i in range(clips):
            turns = [{"from": "human", "value": "<audio>\nTranscribe the recording."},
                     {"from": "gpt", "value": f"Recording {i} holds noise only."}]
            yield f"a{i:04d}", {"json": json.dumps({"conversations": turns}).encode(),
                                "wav": wav_clip(clip_mb * 10**6, seed=i)}

    folder = C.CACHE_DIR / f"buffer_bytes_{clip_mb}mb"
    return C.cached_prepared_dataset(folder, {"clip_mb": clip_mb, "clips": clips}, samples,
                                     "general_conversations", per_shard=2)


def child(dataset: str, bound: str, batches: int) -> None:
    C.limit_threads()
    from energon_nemotron.loading import build_train_loader

    cfg = {"tokenizer": str(Path(__file__).resolve().parents[1] / "energon_nemotron" / "demo" / "tokenizer"),
           "task_encoder": {"name": "nemotron_multimodal", "options": {"prompt_format": "nemotron6",
                                                                        "seq_length": SEQ}},
           "packing": {"algorithm": "first_fit_decreasing", "buffer_size": BUFFER,
                       "max_buffer_bytes": None if bound == "none" else int(bound)},
           "data": {"train": {"path": dataset}},
           "loader": {"batch_size": 1, "num_workers": WORKERS, "shuffle_buffer_size": None}}
    loader = build_train_loader(cfg, repeat=True)
    digest, clips = hashlib.sha256(), 0
    for i, batch in enumerate(loader):
        digest.update(repr(batch.sample_keys).encode())
        for t in (batch.tokens, batch.labels, batch.loss_mask, batch.media.sound_features.as_tensor()):
            digest.update(t.contiguous().numpy().tobytes())
        clips += sum(len(k) for k in batch.sample_keys)
        if i + 1 >= batches:
            break
    telemetry = loader.telemetry()
    del loader, batch
    gc.collect()                                  # the workers exit and are waited for
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    print(json.dumps({"bound": bound, "peak_worker_bytes": peak, "digest": digest.hexdigest(), "clips": clips,
                      "buffer_bytes": telemetry["buffer_bytes"], "seconds": telemetry["seconds"]}))


def run(dataset: Path, bound, batches: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", str(dataset), str(bound), str(batches)],
                         capture_output=True, text=True)
    if out.returncode:
        sys.stderr.write(out.stderr[-4000:])
        raise SystemExit(f"the child run with max_buffer_bytes {bound} failed")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="20 MB clips, fewer batches")
    ap.add_argument("--clip-mb", type=int, default=None, help="clip size in MB (default 100; --quick 20)")
    ap.add_argument("--budget-mib", type=int, default=None,
                    help="max_buffer_bytes per worker, MiB (default 1024; --quick 256)")
    ap.add_argument("--batches", type=int, default=None)
    ap.add_argument("--child", nargs=3, metavar=("DATASET", "BOUND", "BATCHES"))
    args = ap.parse_args(argv)
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]))
        return 0
    clip_mb = args.clip_mb or (20 if args.quick else 100)
    batches = args.batches or (6 if args.quick else 10)
    args.budget_mib = args.budget_mib or (256 if args.quick else 1024)
    budget = args.budget_mib * 2**20
    dataset = build_dataset(clip_mb, clips=16)
    today, bounded, none = (run(dataset, b, batches) for b in ("none", budget, 0))
    mib = 2**20
    constant = none["peak_worker_bytes"]
    print(f"clips {clip_mb} MB, packing buffer {BUFFER}, {WORKERS} workers, {batches} batches read "
          f"({today['clips']} clips)")
    print(f"{'max_buffer_bytes':>18}{'peak RSS / worker MiB':>24}{'held peak MiB':>15}{'reread':>8}{'s':>7}")
    for name, r in (("null (today)", today), (f"{args.budget_mib} MiB", bounded), ("0", none)):
        b = r["buffer_bytes"]
        print(f"{name:>18}{r['peak_worker_bytes'] / mib:>24,.0f}{b.get('peak_per_worker', 0) / mib:>15,.0f}"
              f"{b.get('reread', 0):>8}{r['seconds']:>7.0f}")
    print(f"today's buffer holds about {BUFFER} x {clip_mb} MB = {BUFFER * clip_mb * 10**6 / mib:,.0f} MiB per worker; "
          f"bounded: peak <= budget {args.budget_mib:,} MiB + constant {constant / mib:,.0f} MiB "
          f"= {(budget + constant) / mib:,.0f} MiB")
    same = today["digest"] == bounded["digest"] == none["digest"]
    if not same:
        print("the batches differ between the runs", file=sys.stderr)
    ratio = (bounded["peak_worker_bytes"] - constant) / budget
    C.emit({"name": "buffer_bytes", "ratio": round(ratio if same else float("inf"), 3), "goal": GOAL,
            "better": "lower", "clip_mb": clip_mb, "buffer_size": BUFFER, "workers": WORKERS,
            "budget_mib": args.budget_mib, "constant_mib": round(constant / mib, 1),
            "peak_worker_mib": round(bounded["peak_worker_bytes"] / mib, 1),
            "peak_worker_mib_unbounded": round(today["peak_worker_bytes"] / mib, 1),
            "held_peak_mib": round(bounded["buffer_bytes"]["peak_per_worker"] / mib, 1),
            "reread": bounded["buffer_bytes"]["reread"], "batches_identical": same, "batches": batches,
            "quick": bool(args.quick)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
