"""Audio per second of the Nemotron Omni audio path (``energon_nemotron.media.audio``) against the
official Nemotron Omni processor on the same files, in the same run.

Files (synthetic, ``energon_nemotron.demo.media.make_audio``, PCM WAV): 12 recordings of 10-30 s at
16, 22.05, 44.1 and 48 kHz, mono and stereo, 264 s in all (``--quick``: the first four, 98 s). Ours,
per file: ``audio_metadata(path)`` + ``plan_audio`` + ``process_audio`` (decode, channel mean,
``soxr_hq`` to 16 kHz, Parakeet log-mel features). Theirs: what the processor does with an audio path
(``load_audio(path, 16000)`` then ``_process_audio``: the same features and the token count), run by
``_hf_audio_worker.py`` in ``.venv-ref`` (``make references`` builds it), alternating with ours round
by round. Both one thread. ``ratio`` = the processor's seconds ÷ ours (median over rounds of each
round's total; goal >= 1.0, higher is better). The features are checked bit for bit against the
processor's, and the token counts equal, before timing.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import _common as C
from _ref_worker import REF_PYTHON, RefWorker, alternate

GOAL = 1.0
TOKENIZER = C.BENCH_DIR.parent / "energon_nemotron" / "demo" / "tokenizer"
#: (sample rate, channels, seconds) of the files
FILES = [(16000, 1, 30), (44100, 2, 28), (48000, 1, 25), (22050, 2, 20), (16000, 1, 15), (44100, 1, 30),
         (48000, 2, 24), (16000, 2, 12), (22050, 1, 30), (44100, 2, 18), (16000, 1, 10), (48000, 1, 22)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="four files, 3 rounds")
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds (default 3 quick, 9 full)")
    args = ap.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 9)
    if not REF_PYTHON.exists():
        print(f"the reference environment is missing ({REF_PYTHON}); run `make references`", file=sys.stderr)
        return 1

    C.limit_threads()
    import numpy as np

    from energon_nemotron.demo.media import make_audio
    from energon_nemotron.media.audio import audio_metadata, plan_audio, process_audio

    specs = FILES[:4] if args.quick else FILES
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        paths = []
        for i, (rate, channels, seconds) in enumerate(specs):
            paths.append(folder / f"a{i:02d}_{rate}_{channels}ch_{seconds}s.wav")
            paths[-1].write_bytes(make_audio(float(seconds), rate, channels, i, "wav"))
        with RefWorker("_hf_audio_worker.py", str(folder), str(TOKENIZER)) as worker:

            def ours(path):
                plan = plan_audio(audio_metadata(path))
                return plan, process_audio(path, plan)

            saved = folder / "hf"
            saved.mkdir()
            assert worker.ask(f"save {saved}").strip() == "saved"
            for path in paths:                                # warm-up and the bit-for-bit check
                plan, (features, lengths) = ours(path)
                theirs = np.load(saved / f"{path.stem}.npy")
                assert np.array_equal(features[0].numpy(), theirs), f"{path.name}: features differ from the processor's"
                assert plan.tokens == (int((saved / f"{path.stem}.tokens").read_text()),), path.name
            per, totals = alternate(worker, [(p.name, p) for p in paths], ours, rounds, C.bench_timer)

    audio_s = sum(s for _, _, s in specs)
    ours_s, hf_s = C.median(totals["ours"]), C.median(totals["hf"])
    print(f"{len(paths)} WAV files, {audio_s} s of audio, {rounds} rounds, one core; features bit for bit equal")
    print(f"{'file':<28}{'ours ms':>10}{'hf ms':>10}{'speed-up':>10}")
    extra = {}
    for p in paths:
        o, h = C.median(per[p.name, "ours"]) * 1e3, C.median(per[p.name, "hf"]) * 1e3
        print(f"{p.stem:<28}{o:>10.2f}{h:>10.2f}{h / o:>10.2f}")
        extra[f"ours_ms_{p.stem}"], extra[f"hf_ms_{p.stem}"] = round(o, 3), round(h, 3)
    print(f"{'total':<28}{ours_s * 1e3:>10.2f}{hf_s * 1e3:>10.2f}{hf_s / ours_s:>10.2f}")
    C.emit({"name": "audio_path", "ratio": round(hf_s / ours_s, 4), "goal": GOAL, "better": "higher",
            "ours_s": round(ours_s, 4), "hf_s": round(hf_s, 4), "audio_seconds": audio_s,
            "ours_audio_s_per_s": round(audio_s / ours_s, 1), "hf_audio_s_per_s": round(audio_s / hf_s, 1),
            **extra, "bit_exact": True, "files": len(paths), "rounds": rounds, "quick": bool(args.quick)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
