"""``energon-nemotron demo``: both input paths end to end, offline, on the shipped tokenizer.

1-3. Megatron-LM prepacked path: raw conversations → offline-packed rows → ``PackedBatch``.
4-5. Energon path: WebDataset shards (text, ASR, and a four-modality dataset) → ``energon prepare``
     → cooker by subflavor → ``nemotron_multimodal`` with online packing → ``PackedBatch``, through
     a YAML loader config; ``preview.html`` shows the first packed batches.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from energon_nemotron.demo.conversations import make_conversations

TOKENIZER_DIR = Path(__file__).parent / "tokenizer"
SEQ_LENGTH = 1024
NUM_CONVERSATIONS = 400


def run_demo(out: str | Path = "demo_out", progress: bool = True) -> int:
    """Write raw data, pack it offline, read it back as ``PackedBatch``es; print a summary."""
    from energon_nemotron.megatron_packed import MegatronSFTPackedDataset, MegatronSFTPackedEncoder, collate_rows
    from energon_nemotron.inspection.rows import row_text
    from energon_nemotron.megatron_packed.offline_pack import pack_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    raw = out / "raw_conversations.jsonl"
    packed = out / "train.jsonl.packed"
    with open(raw, "w", encoding="utf-8") as f:
        for conv in make_conversations(NUM_CONVERSATIONS, seed=0):
            f.write(json.dumps({"messages": conv}) + "\n")
    print(f"[1/5] wrote {NUM_CONVERSATIONS} raw conversations to {raw}")

    encoder = MegatronSFTPackedEncoder(TOKENIZER_DIR, SEQ_LENGTH, prompt_format="nemotron-h-aligned")
    summary = pack_file(raw, packed, encoder, progress=progress)
    print(f"[2/5] packed them offline into {packed} (Megatron-LM offline-packed rows)")
    print("      " + summary.text().replace("\n", "\n      "))

    dataset = MegatronSFTPackedDataset(packed, encoder)
    loader = torch.utils.data.DataLoader(dataset, batch_size=1, collate_fn=collate_rows)
    start = time.perf_counter()
    rows = conversations = trained = real = 0
    first = None
    for batch in tqdm(loader, total=len(dataset), desc="reading rows", unit="row", disable=not progress):
        batch.validate()
        rows += batch.batch_size
        conversations += sum(len(k) for k in batch.sample_keys)
        trained += batch.num_valid_tokens
        real += int((batch.tokens != encoder.pad_id).sum())
        if first is None:
            first = batch
    seconds = time.perf_counter() - start
    print(f"[3/5] read back {rows} PackedBatch rows of {SEQ_LENGTH} tokens in {seconds:.2f} s "
          f"({rows * SEQ_LENGTH / max(seconds, 1e-9):,.0f} tokens/s)")
    print(f"      conversations {conversations}/{summary.conversations}, non-pad tokens "
          f"{real / (rows * SEQ_LENGTH):.2%} of positions, trained labels {trained}, "
          f"truncated rows {len(dataset.last_report.get('truncated_lines', []))}")
    if first is not None:
        print("\nFirst row (trained tokens highlighted):")
        text = row_text(0, first.row(0), encoder.tokenizer, sys.stdout.isatty(), pad_id=encoder.pad_id)
        print(text[:3000] + ("\n..." if len(text) > 3000 else ""))
    ok = conversations == summary.conversations and not dataset.last_report.get("truncated_lines")
    ok = run_energon_demo(out, progress) and ok
    print("\ndemo OK" if ok else "\ndemo FAILED: samples lost or truncated")
    return 0 if ok else 1


ENERGON_SAMPLES = 60
DEMO_MEDIA = {"image": {"min_patches": 256, "max_patches": 1024},
              "video": {"target_patches": 256, "min_frames": 4, "max_frames": 8}}


def run_energon_demo(out: Path, progress: bool) -> bool:
    """Build a text and a four-modality dataset with ``energon prepare``; read the multimodal one
    for one epoch through a loader config and preview its first packed batch."""
    import shutil

    import yaml

    from energon_nemotron.demo.datasets import asr_dataset, multimodal_dataset, text_dataset
    from energon_nemotron.loading import build_train_loader
    from energon_nemotron.inspection.preview import run_preview

    for name in ("text_dataset", "multimodal_dataset", "asr_dataset"):
        shutil.rmtree(out / name, ignore_errors=True)
    text_dataset(out / "text_dataset", "openai_messages", ENERGON_SAMPLES, seed=1, per_shard=32)
    asr_dataset(out / "asr_dataset", ENERGON_SAMPLES // 3, seed=3)
    _, keys = multimodal_dataset(out / "multimodal_dataset", ENERGON_SAMPLES, seed=2, per_shard=20)
    print(f"\n[4/5] wrote WebDataset shards and ran `energon prepare` on {out / 'text_dataset'} "
          f"(cooker openai_messages), {out / 'asr_dataset'} (granary_asr) and {out / 'multimodal_dataset'} "
          f"(cooker general_conversations: text, images, video, audio; {ENERGON_SAMPLES} samples)")
    config = out / "loader.yaml"
    packing = {"algorithm": "best_fit_decreasing", "buffer_size": 32, "pad_multiple": 8}   # under the 60 samples
    config.write_text(yaml.safe_dump({
        "tokenizer": str(TOKENIZER_DIR),
        "task_encoder": {"name": "nemotron_multimodal",
                         "options": {"prompt_format": "nemotron6", "seq_length": 4096, **DEMO_MEDIA}},
        "packing": packing,
        "data": {"train": {"path": "multimodal_dataset", "split": "train"}},
        "loader": {"batch_size": 1, "num_workers": 0, "shuffle_buffer_size": 16, "seed": 1234},
    }, sort_keys=False))
    loader = build_train_loader(config, repeat=False)
    bar = tqdm(loader, desc="packing", unit="pack", disable=not progress)
    for batch in bar:
        batch.validate()
        t = loader.telemetry()
        bar.set_postfix(fill=f"{t['fill_ratio']:.1%}", tokens_per_s=f"{t['tokens_per_s']:,.0f}")
    t = loader.telemetry()
    print(f"[5/5] one epoch through {config} (nemotron_multimodal, nemotron6, {packing['algorithm']}): "
          f"{t['packs']} packs of 4096, {t['samples']}/{len(keys)} samples, media decoded {t['media_decoded']}, "
          f"fill {t['fill_ratio']:.2%}, {t['tokens_per_s']:,.0f} tokens/s")
    html = out / "preview.html"
    run_preview(str(config), html=str(html), batches=4)
    print(f"\nwrote {html}: the first packed batches as a page (segments, trained tokens, media). "
          "The first one as text (`energon-nemotron preview " + str(config) + " --batches 1`):")
    run_preview(str(config), batches=1)
    return t["samples"] == len(keys)
