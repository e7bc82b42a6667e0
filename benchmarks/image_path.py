"""Seconds per image of the dynamic-resolution image path against a minimal inline floor.

Ours, per JPEG: ``plan_image(*image_header_size(data), ImageOptions(resize="pil"))`` then
``process_image(data, plan)`` (header parse, EXIF check, decode, PIL bicubic resize, ``/255``, CLIP
mean/std, patchify to ``float32 [patches, 768]``): the ``pil`` option, the path this floor mirrors
(the default ``hf`` resize is measured against the Omni processor by ``image_processor.py``). The floor, on the same bytes in the same run: PIL decode, ``convert("RGB")``,
bicubic resize to the same target (given, not planned), ``np.asarray(float32)``, in-place ``/255``,
``-mean``, ``/std``, one transpose copy into patch order, ``torch.from_numpy``.

Images: ``make_image`` JPEGs of 640x480, 1024x768 and 1920x1080 (4 seeds each; ``--quick``: 1 seed).
Rounds alternate which side runs first; each side's time is the median over rounds of the round's
total. ``ratio`` = ours / floor seconds (goal <= 1.15, lower is better); also per-size medians in ms.
"""

from __future__ import annotations

import argparse
import io
import sys

import _common as C

SIZES = ((640, 480), (1024, 768), (1920, 1080))
GOAL = 1.15


def floor_process(data: bytes, size: tuple[int, int], patch: int, np, torch, Image, mean, std):
    """The minimal straightforward path: decode, resize, normalise, patchify (target size given)."""
    img = Image.open(io.BytesIO(data)).convert("RGB")
    if img.size != size:
        img = img.resize(size, Image.Resampling.BICUBIC)
    x = np.asarray(img, dtype=np.float32)
    x /= 255.0
    x -= mean
    x /= std
    h, w = x.shape[0] // patch, x.shape[1] // patch
    x = np.ascontiguousarray(x.reshape(h, patch, w, patch, 3).transpose(0, 2, 4, 1, 3))
    return torch.from_numpy(x.reshape(h * w, 3 * patch * patch))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one image per size, 3 rounds")
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds (default 3 quick, 7 full)")
    args = ap.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 7)
    seeds = 1 if args.quick else 4

    C.limit_threads()
    import numpy as np
    import torch
    from PIL import Image

    from energon_nemotron.demo.media import make_image
    from energon_nemotron.media.image import CLIP_MEAN, CLIP_STD, ImageOptions, image_header_size, plan_image
    from energon_nemotron.media.image_pixels import process_image

    mean, std = np.asarray(CLIP_MEAN, np.float32), np.asarray(CLIP_STD, np.float32)
    images = [((w, h), make_image(w, h, seed=s, fmt="JPEG")) for (w, h) in SIZES for s in range(seeds)]

    pil = ImageOptions(resize="pil")

    def ours(data):
        return process_image(data, plan_image(*image_header_size(data), pil))

    targets = {}
    max_diff = 0.0
    for size, data in images:                                # warm-up and agreement check
        plan = plan_image(*size)
        targets[size] = plan.unit_size
        a, b = ours(data), floor_process(data, plan.unit_size, plan.patch_size, np, torch, Image, mean, std)
        max_diff = max(max_diff, float((a - b).abs().max()))

    per = {(size, side): [] for size in SIZES for side in ("ours", "floor")}
    totals = {"ours": [], "floor": []}
    for r in range(rounds):
        round_total = {"ours": 0.0, "floor": 0.0}
        order = ("ours", "floor") if r % 2 == 0 else ("floor", "ours")
        for size, data in images:
            for side in order:
                if side == "ours":
                    fn = lambda: ours(data)                  # noqa: E731
                else:
                    fn = lambda: floor_process(data, targets[size], 16, np, torch, Image, mean, std)  # noqa: E731
                t = C.bench_timer(fn, 1)[0]
                per[size, side].append(t)
                round_total[side] += t
        for side in totals:
            totals[side].append(round_total[side])

    ours_s, floor_s = C.median(totals["ours"]), C.median(totals["floor"])
    print(f"{len(images)} JPEGs ({seeds} per size), {rounds} rounds, one core; dynamic mode, float32 output")
    print(f"{'size':<12}{'target':>12}{'ours ms':>10}{'floor ms':>10}{'ratio':>8}")
    extra = {}
    for size in SIZES:
        o, f = C.median(per[size, "ours"]) * 1e3, C.median(per[size, "floor"]) * 1e3
        tw, th = targets[size]
        print(f"{size[0]}x{size[1]:<7}{f'{tw}x{th}':>12}{o:>10.2f}{f:>10.2f}{o / f:>8.3f}")
        key = f"{size[0]}x{size[1]}"
        extra[f"ours_ms_{key}"] = round(o, 3)
        extra[f"floor_ms_{key}"] = round(f, 3)
    print(f"max |ours - floor| = {max_diff:.3g}")

    C.emit({
        "name": "image_path",
        "ratio": round(ours_s / floor_s, 4),
        "goal": GOAL,
        "better": "lower",
        "ours_seconds": round(ours_s, 5),
        "floor_seconds": round(floor_s, 5),
        **extra,
        "max_abs_diff": max_diff,
        "images": len(images),
        "rounds": rounds,
        "quick": bool(args.quick),
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
