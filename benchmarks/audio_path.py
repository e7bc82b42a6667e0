"""Seconds per audio item of the Nemotron Omni audio path (``energon_nemotron.media.audio``) against a
decode-only floor.

Items (synthetic, ``energon_nemotron.demo.media.make_audio``): a 20 s stereo 44.1 kHz WAV and a 10 s
stereo 44.1 kHz MP3. Ours per item: ``audio_metadata`` + ``plan_audio`` + ``process_audio`` (decode,
channel mean, resample to 16 kHz, clip split, Parakeet log-mel features). The floor, written here:
``av.open`` with FFmpeg's defaults, decode the first audio stream, ``av.AudioResampler(flt, mono,
16000)`` with its flush, concatenate. ``ratio`` = ours / floor summed over the items (median of
interleaved rounds), goal 1.25, lower is better. The floor does no features, so the script also reports
``ratio_excluding_features`` (metadata + plan + ``decode_audio`` / floor) and ``features_share`` (the
part of ours spent in the feature extractor and the clip assembly). One core.
"""

from __future__ import annotations

import argparse
import io
import sys

import _common as C

GOAL = 1.25


def floor_decode(data: bytes):
    """PyAV decode + resample to 16 kHz mono float32, nothing else."""
    import av
    import numpy as np

    out = []
    with av.open(io.BytesIO(data)) as container:
        resampler = av.AudioResampler(format="flt", layout="mono", rate=16000)
        for frame in container.decode(audio=0):
            out.extend(o.to_ndarray()[0] for o in resampler.resample(frame))
        out.extend(o.to_ndarray()[0] for o in resampler.resample(None))
    return np.concatenate(out)


def floor_decode_small_probe(data: bytes):
    """The floor with the 32 KiB probe the package uses (shows what the probe size alone is worth)."""
    import av
    import numpy as np

    out = []
    with av.open(io.BytesIO(data), options={"probesize": "32768"}) as container:
        resampler = av.AudioResampler(format="flt", layout="mono", rate=16000)
        for frame in container.decode(audio=0):
            out.extend(o.to_ndarray()[0] for o in resampler.resample(frame))
        out.extend(o.to_ndarray()[0] for o in resampler.resample(None))
    return np.concatenate(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved timed rounds")
    args = ap.parse_args(argv)
    rounds = args.rounds or (5 if args.quick else 15)

    C.limit_threads()
    from energon_nemotron.demo.media import make_audio
    from energon_nemotron.media.audio import audio_metadata, decode_audio, plan_audio, process_audio

    items = {"wav_20s_44k_stereo": make_audio(20.0, 44100, 2, 0, "wav"),
             "mp3_10s_44k_stereo": make_audio(10.0, 44100, 2, 1, "mp3")}

    def ours(data):
        plan = plan_audio(audio_metadata(data))
        return process_audio(data, plan)

    def ours_no_features(data):
        plan = plan_audio(audio_metadata(data))
        return plan, decode_audio(data)

    fns = {"ours": ours, "no_features": ours_no_features, "floor": floor_decode,
           "floor_small_probe": floor_decode_small_probe}
    for data in items.values():                 # warm up (imports, the cached extractor) and check
        features, lengths = ours(data)
        plan, wave = ours_no_features(data)
        ref = floor_decode(data)
        assert abs(wave.shape[0] - ref.shape[0]) <= 0.05 * 16000 and lengths.tolist() == list(plan.frames)
        assert features.shape == (plan.num_clips, plan.frames_per_clip, 128)
    secs = {(k, f): [] for k in items for f in fns}
    for _ in range(rounds):
        for k, data in items.items():
            for f, fn in fns.items():
                secs[(k, f)] += C.bench_timer(lambda: fn(data), 1)
    med = {key: C.median(v) for key, v in secs.items()}
    total = {f: sum(med[(k, f)] for k in items) for f in fns}

    print(f"{len(items)} audio items, median of {rounds} interleaved rounds, one core (ms)")
    print(f"{'item':<22}" + "".join(f"{f:>19}" for f in fns))
    for k in items:
        print(f"{k:<22}" + "".join(f"{med[(k, f)] * 1e3:>19.2f}" for f in fns))
    print(f"{'total':<22}" + "".join(f"{total[f] * 1e3:>19.2f}" for f in fns))

    result = {
        "name": "audio_path",
        "ratio": round(total["ours"] / total["floor"], 4),
        "goal": GOAL,
        "better": "lower",
        "ratio_excluding_features": round(total["no_features"] / total["floor"], 4),
        "features_share": round(1 - total["no_features"] / total["ours"], 4),
        "ours_ms": round(total["ours"] * 1e3, 3),
        "ours_no_features_ms": round(total["no_features"] * 1e3, 3),
        "floor_ms": round(total["floor"] * 1e3, 3),
        "floor_small_probe_ms": round(total["floor_small_probe"] * 1e3, 3),
        "ratio_vs_small_probe_floor": round(total["ours"] / total["floor_small_probe"], 4),
        "audio_seconds": 30.0,
        "quick": bool(args.quick),
    }
    for k in items:
        result[f"{k}_ratio"] = round(med[(k, "ours")] / med[(k, "floor")], 4)
    C.emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
