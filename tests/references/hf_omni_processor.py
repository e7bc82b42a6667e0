"""Reference outputs of the official Nemotron Omni processor (``transformers`` 5.24,
``models/nemotron_h_omni``) on the generated media corpus (``tests/media_corpus.py``).

Runs in the ``.venv-ref`` environment (torch 2.14.1 + torchvision 0.29.1 + transformers 5.24.0:
the processor classes need torchvision, which cannot be imported beside the project's CPU torch),
never imports the project, and writes what the processor produced::

    python tests/references/hf_omni_processor.py CORPUS OUT --tokenizer TOKENIZER_DIR

``OUT/results.json`` holds versions, image grids / patch counts / float64 sums, video frame indices /
fps / prompt text / ids and audio token counts / mask sums; ``OUT/images/NAME.npy`` (and
``OUT/wide_images/NAME.npy``) the image ``pixel_values`` ``[P, 768]`` (for items not marked ``full``: only the rows listed in ``rows``),
``OUT/videos/NAME.npy`` the video ``pixel_values_videos[0]`` ``[tubelets, 6, H, W]`` and
``OUT/audio/NAME.npy`` the ``input_features[0]`` ``[1 + L // 160, 128]`` (float32 each).

How each item is fed is what a user of the processor does: images opened with PIL and upright
(``ImageOps.exif_transpose``, as ``transformers.image_utils.load_image`` does); 16-bit images
scaled to 8 bits first (``v >> 8``; the processor's own conversion clips them), the wide-integer set
as it opens where its data fits in 8 bits, else scaled by its bit depth; videos decoded by
``transformers.video_utils.load_video(backend="pyav")`` with the processor's ``sample_frames``
and the manifest's ``fps`` / ``num_frames``, frames turned upright by the manifest's rotation;
audio as the WAV's ``int16 / 32768`` waveform, and the audio-file set (every codec, resampled rates,
stereo) by path through ``transformers.audio_utils.load_audio``, as the processor loads a path.
``OUT/audio_files/NAME.npy``: those files' ``input_features[0]``.
"""

from __future__ import annotations

import argparse
import json
import wave
import zlib
from functools import partial
from pathlib import Path

import numpy as np
import torch
import transformers
from PIL import Image, ImageOps
from transformers import AutoTokenizer, ParakeetFeatureExtractor
from transformers.audio_utils import load_audio
from transformers.models.nemotron_h_omni import (
    NemotronH_Omni_Reasoning_V3ImageProcessor,
    NemotronH_Omni_Reasoning_V3Processor,
    NemotronH_Omni_Reasoning_V3VideoProcessor,
)
from transformers.video_utils import load_video

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


def processor(tokenizer_dir: str, target_patches: int = 1024) -> NemotronH_Omni_Reasoning_V3Processor:
    return NemotronH_Omni_Reasoning_V3Processor(
        image_processor=NemotronH_Omni_Reasoning_V3ImageProcessor(),
        video_processor=NemotronH_Omni_Reasoning_V3VideoProcessor(
            norm_mean=CLIP_MEAN, norm_std=CLIP_STD, video_target_num_patches=target_patches),
        tokenizer=AutoTokenizer.from_pretrained(tokenizer_dir),
        feature_extractor=ParakeetFeatureExtractor(feature_size=128, sampling_rate=16000, hop_length=160))


def reference_image(path: Path, how: str) -> Image.Image:
    """``how``: ``exif_transpose`` (what ``load_image`` does), ``as_opened`` (the PIL image as it opens),
    ``scale16`` (16-bit data as ``v >> 8``) or ``scale_depth`` (integer data as ``v >> (bits - 8)``,
    ``bits`` the bit length of its largest value: the project's documented rule for data over 8 bits)."""
    im = Image.open(path)
    if how in ("scale16", "scale_depth"):
        wide = np.maximum(np.asarray(im).astype(np.int64), 0)
        shift = 8 if how == "scale16" else max(0, int(wide.max()).bit_length() - 8)
        return Image.fromarray((wide >> shift).astype(np.uint8), "L")
    return im if how == "as_opened" else ImageOps.exif_transpose(im)


SAMPLED_ROWS = 48


def sampled_rows(name: str, n: int) -> list[int]:
    """Patch rows kept for a large-corpus item: the first, the last and ``SAMPLED_ROWS`` seeded ones."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    picked = set(rng.choice(n, size=min(n, SAMPLED_ROWS), replace=False).tolist()) | {0, n - 1}
    return sorted(int(i) for i in picked)


def run_images(items: list, corpus: Path, out: Path, proc, folder: str = "images") -> dict:
    """Every item's ``pixel_values`` (see the module docs); items not fed as opened also record
    ``as_opened_mean``, the mean of what the processor makes of the image as it opens."""
    results = {}
    (out / folder).mkdir(parents=True, exist_ok=True)
    for item in items:
        feats = proc.image_processor(images=[reference_image(corpus / item["file"], item["reference_input"])],
                                     return_tensors="pt")
        pixels = feats["pixel_values"].numpy().astype(np.float32)
        entry = {"grid": feats["image_grid_hw"][0].tolist(), "num_patches": int(pixels.shape[0]),
                 "sum": float(pixels.astype(np.float64).sum())}
        if item["reference_input"] == "scale_depth":
            raw = proc.image_processor(images=[Image.open(corpus / item["file"])], return_tensors="pt")
            entry["as_opened_mean"] = float(raw["pixel_values"].double().mean())
        if not item.get("full", True):
            entry["rows"] = sampled_rows(item["name"], pixels.shape[0])
            pixels = pixels[entry["rows"]]
        np.save(out / folder / f"{item['name']}.npy", pixels)
        results[item["name"]] = entry
    return results


def run_videos(items: list, corpus: Path, out: Path, tokenizer_dir: str) -> dict:
    results = {}
    (out / "videos").mkdir(parents=True, exist_ok=True)
    for item in items:
        proc = processor(tokenizer_dir, item["target_patches"])
        sampler = partial(proc.video_processor.sample_frames, **item["sampling"])
        frames, metadata = load_video(str(corpus / item["file"]), backend="pyav", sample_indices_fn=sampler)
        if item["rotation"]:
            frames = np.ascontiguousarray(np.rot90(frames, k=-item["rotation"] // 90, axes=(1, 2)))
        batch = proc(text=["<video>"], videos=[frames], video_metadata=[metadata], do_sample_frames=False,
                     return_tensors="pt")
        np.save(out / "videos" / f"{item['name']}.npy", batch["pixel_values_videos"][0].numpy().astype(np.float32))
        video_inputs = proc.video_processor(videos=[frames], video_metadata=[metadata], do_sample_frames=False,
                                            return_metadata=True, temporal_patch_size=proc.video_temporal_patch_dim)
        results[item["name"]] = {
            "frames_indices": [int(i) for i in metadata.frames_indices],
            "fps": float(metadata.fps), "total_num_frames": int(metadata.total_num_frames),
            "num_frames": int(batch["num_frames"][0]) if "num_frames" in batch else len(frames),
            "prompt": proc.replace_video_token(video_inputs, 0),
            "input_ids": batch["input_ids"][0].tolist(),
            "frame_shape": list(frames.shape[1:]),
        }
    return results


def run_audio(items: list, corpus: Path, out: Path, proc) -> dict:
    results = {}
    (out / "audio").mkdir(parents=True, exist_ok=True)
    for item in items:
        with wave.open(str(corpus / item["file"]), "rb") as w:
            pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        waveform = (pcm.astype(np.float32) / 32768.0)
        features, mask, tokens = proc._process_audio(waveform, {})
        np.save(out / "audio" / f"{item['name']}.npy", features[0].numpy().astype(np.float32))
        results[item["name"]] = {"num_samples": int(pcm.shape[0]), "num_tokens": int(tokens[0]),
                                 "num_frames": int(features.shape[1]),
                                 "mask_sum": int(mask[0].sum()) if mask is not None else None}
    return results


def run_audio_files(items: list, corpus: Path, out: Path, proc) -> dict:
    """Each file as the processor loads a path: ``transformers.audio_utils.load_audio(path, 16000)``
    (its default backend; without torchcodec: soundfile + soxr), then ``_process_audio``. A file it
    cannot load records ``error``; ``nan`` tells whether its features hold a NaN."""
    results = {}
    (out / "audio_files").mkdir(parents=True, exist_ok=True)
    for item in items:
        try:
            waveform = load_audio(str(corpus / item["file"]), sampling_rate=16000)
        except Exception as e:  # noqa: BLE001 - recorded for the test, whatever the backend raises
            results[item["name"]] = {"error": f"{type(e).__name__}: {e}"}
            continue
        features, mask, tokens = proc._process_audio(waveform, {})
        feats = features[0].numpy().astype(np.float32)
        np.save(out / "audio_files" / f"{item['name']}.npy", feats)
        results[item["name"]] = {"num_samples": int(waveform.shape[0]), "num_tokens": int(tokens[0]),
                                 "num_frames": int(feats.shape[0]), "nan": bool(np.isnan(feats).any())}
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("corpus", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--only", default="images,videos,audio")
    args = ap.parse_args()
    torch.set_num_threads(1)
    manifest = json.loads((args.corpus / "manifest.json").read_text())
    proc = processor(args.tokenizer)
    results = {"versions": {"torch": torch.__version__, "transformers": transformers.__version__}}
    kinds = args.only.split(",")
    if "images" in kinds:
        results["images"] = run_images(manifest["images"], args.corpus, args.out, proc)
    if "wide_images" in kinds:
        results["wide_images"] = run_images(manifest["wide_images"], args.corpus, args.out, proc, "wide_images")
    if "videos" in kinds:
        results["videos"] = run_videos(manifest["videos"], args.corpus, args.out, args.tokenizer)
    if "audio_files" in kinds:
        results["audio_files"] = run_audio_files(manifest["audio_files"], args.corpus, args.out, proc)
    if "audio" in kinds:
        results["audio"] = run_audio(manifest["audio"], args.corpus, args.out, proc)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
