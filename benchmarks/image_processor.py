"""Images per second of the processor-exact image path against the official Nemotron Omni processor.

Ours, per image: ``plan_image(*image_header_size(data))`` then ``process_image(data, plan)`` with the
default ``resize: hf`` (header, EXIF, decode, RGB conversion, float32 antialiased bicubic, CLIP
normalisation, patchify to ``float32 [patches, 768]``). Theirs, on the same bytes in the same run:
``NemotronH_Omni_Reasoning_V3ImageProcessor()(images=[Image.open(...)], return_tensors="pt")``
(transformers 5.24 in ``.venv-ref``; ``make references`` builds it), run by
``_hf_image_worker.py`` in a subprocess that times one round whenever asked, so the two sides
alternate round by round. Both one thread.

Images: JPEG photos (``make_image``) of 640x480, 1024x768, 1920x1080 and 4032x3024 (a phone photo,
downscaled to the 13312-patch budget), 200x150 (upscaled to the 1024-patch minimum), PNG screenshots
(flat panels and text) of 1280x720 and 1988x1362 and a 512x512 RGBA PNG; ``--quick``: the first five.
``ratio`` = our images/s ÷ the processor's (goal >= 2.0, higher is better); each side's time is the
median over rounds of the round's total. Also per image ms and ``max_abs_diff`` of the two outputs.

Then the varied corpus (``_image_corpus.py``: 20 modes and formats, 1x1 to 6000x400, 280 images;
``--quick``: 60): ``ratio_varied_all`` (goal >= 2.0) and ``ratio_varied_<class>`` for the size classes
by the shorter side, tiny < 32 px, small < 256, medium < 1024, large (goal >= 1.0 each); each side's
time the sum of its images' medians. ``goals_met`` says whether all three goals hold.
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
from pathlib import Path

import _common as C
from _ref_worker import REF_PYTHON, RefWorker, alternate

GOAL = 2.0
CLASS_GOAL = 1.0          # every size class of the varied corpus


def screenshot(w: int, h: int, seed: int) -> bytes:
    """A PNG of flat panels, rules and text (what UI screenshots and documents look like)."""
    import numpy as np
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    im = Image.new("RGB", (w, h), (246, 246, 248))
    d = ImageDraw.Draw(im)
    for _ in range(8):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        d.rectangle([x0, y0, x0 + int(rng.integers(40, w // 2)), y0 + int(rng.integers(20, h // 3))],
                    fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
    for row in range(0, h, 18):
        d.text((8, row), "energon-nemotron processor parity benchmark 0123456789", fill=(20, 20, 20))
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue()


def corpus(quick: bool) -> list[tuple[str, bytes]]:
    import numpy as np
    from PIL import Image

    from energon_nemotron.demo.media import make_image

    items = [("a_photo_640x480", make_image(640, 480, seed=1)), ("b_photo_1024x768", make_image(1024, 768, seed=2)),
             ("c_photo_1920x1080", make_image(1920, 1080, seed=3)), ("d_photo_200x150", make_image(200, 150, seed=4)),
             ("e_screenshot_1280x720", screenshot(1280, 720, 5)), ("f_photo_4032x3024", make_image(4032, 3024, seed=6)),
             ("g_screenshot_1988x1362", screenshot(1988, 1362, 7))]
    rgba = np.dstack([np.asarray(Image.open(io.BytesIO(make_image(512, 512, seed=8)))),
                      np.tile(np.arange(512, dtype=np.uint8)[None, :] // 2, (512, 1))])
    buf = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(buf, "PNG")
    items.append(("h_rgba_512x512", buf.getvalue()))
    return items[:5] if quick else items


def measure(images: list[tuple[str, bytes]], rounds: int) -> dict:
    """Ours and the processor on ``images``, rounds alternating: ``{"per": {(name, side): [s, ...]},
    "totals": {side: [s per round]}, "diff": {name: float}}`` (each image's largest difference of the
    two outputs)."""
    import numpy as np

    from energon_nemotron.media.image import image_header_size, plan_image
    from energon_nemotron.media.image_pixels import process_image

    images = sorted(images)                 # the worker's order (it reads the files by name)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name, data in images:
            (folder / f"{name}.img").write_bytes(data)
        with RefWorker("_hf_image_worker.py", str(folder)) as worker:

            def ours(data):
                return process_image(data, plan_image(*image_header_size(data)))

            worker.ask(f"save {folder}")
            diff = {name: float(np.abs(ours(data).numpy() - np.load(folder / f"{name}.npy")).max())
                    for name, data in images}
            per, totals = alternate(worker, images, ours, rounds, C.bench_timer)
    return {"per": per, "totals": totals, "diff": diff}


def decode_floor(data: bytes) -> None:
    """What any processor-exact path must do first: decode the image and make it RGB (PIL)."""
    from PIL import Image

    Image.open(io.BytesIO(data)).convert("RGB")


def varied(quick: bool, rounds: int) -> dict:
    """The varied corpus (``_image_corpus``): the ratio over all of it and per size class, each
    side's time the sum over its images of their median seconds; beside them the decode floor
    (:func:`decode_floor`, median of ``rounds``) and the ceiling it sets, the processor ÷ the floor:
    the ratio a path whose every step after decoding cost nothing would reach."""
    from _image_corpus import CLASSES, SIZES, WIDE_KINDS, varied_corpus

    corpus = varied_corpus(sizes=[SIZES[1], SIZES[3], SIZES[8]] if quick else None)
    got = measure([(name, data) for name, data, _ in corpus], rounds)
    med = {key: C.median(v) for key, v in got["per"].items()}
    for name, data, _ in corpus:
        med[name, "floor"] = C.median(C.bench_timer(lambda: decode_floor(data), rounds))
    out, lines = {}, []
    for label, members in [("all", corpus)] + [(c, [i for i in corpus if i[2] == c]) for c, _ in CLASSES]:
        if not members:
            continue
        o, h, f = (sum(med[n, side] for n, _, _ in members) for side in ("ours", "hf", "floor"))
        out[f"ratio_varied_{label}"] = round(h / o, 4)
        out[f"ceiling_varied_{label}"] = round(h / f, 4)
        lines.append(f"{label:<8}{len(members):>8}{o * 1e3:>12.1f}{h * 1e3:>12.1f}{h / o:>10.2f}"
                     f"{f * 1e3:>12.1f}{f / o:>9.0%}{h / f:>10.2f}")
    print(f"varied corpus: {len(corpus)} images of 20 modes/formats, 1x1 to 6000x400 ({rounds} rounds)")
    print(f"{'class':<8}{'images':>8}{'ours ms':>12}{'hf ms':>12}{'speed-up':>10}{'decode ms':>12}"
          f"{'of ours':>9}{'ceiling':>10}")
    print("\n".join(lines))
    worst = max(med[n, "ours"] / med[n, "hf"] for n, _, _ in corpus)
    same = max(d for n, d in got["diff"].items() if not n.startswith(WIDE_KINDS))
    print(f"max |ours - processor| = {same:.3g} (the 16/32-bit integer kinds, scaled by bit depth as "
          f"documented, aside); slowest image relative to the processor: {1 / worst:.2f}x")
    return {**out, "varied_images": len(corpus), "varied_max_abs_diff": same}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="five images and 60 varied ones, 3 rounds")
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds (default 3 quick, 7 full)")
    args = ap.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 7)
    if not REF_PYTHON.exists():
        print(f"the reference environment is missing ({REF_PYTHON}); run `make references`", file=sys.stderr)
        return 1

    C.limit_threads()
    images = corpus(args.quick)
    got = measure(images, rounds)
    per, totals = got["per"], got["totals"]
    ours_s, hf_s = C.median(totals["ours"]), C.median(totals["hf"])
    print(f"{len(images)} images, {rounds} rounds, one core; dynamic mode, float32 output")
    print(f"{'image':<26}{'ours ms':>10}{'hf ms':>10}{'speed-up':>10}")
    extra = {}
    for name, _ in images:
        o, h = C.median(per[name, "ours"]) * 1e3, C.median(per[name, "hf"]) * 1e3
        print(f"{name:<26}{o:>10.2f}{h:>10.2f}{h / o:>10.2f}")
        extra[f"ours_ms_{name}"], extra[f"hf_ms_{name}"] = round(o, 3), round(h, 3)
    max_diff = max(got["diff"].values())
    print(f"max |ours - processor| = {max_diff:.3g}")
    mix = varied(args.quick, rounds)
    classes = {k: v for k, v in mix.items() if k.startswith("ratio_varied_") and k != "ratio_varied_all"}
    met = hf_s / ours_s >= GOAL and mix["ratio_varied_all"] >= GOAL and min(classes.values()) >= CLASS_GOAL
    C.emit({"name": "image_processor", "ratio": round(hf_s / ours_s, 4), "goal": GOAL, "better": "higher",
            "ours_images_per_s": round(len(images) / ours_s, 2), "hf_images_per_s": round(len(images) / hf_s, 2),
            **extra, "max_abs_diff": max_diff, **mix, "class_goal": CLASS_GOAL, "goals_met": met,
            "images": len(images), "rounds": rounds, "quick": bool(args.quick)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
