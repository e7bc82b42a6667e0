"""``energon-nemotron demo``: raw conversations → offline-packed rows → PackedBatch, with a summary.

Everything runs offline on the tokenizer shipped in ``demo/tokenizer``.
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
    from energon_nemotron.inspect_rows import row_text
    from energon_nemotron.megatron_packed.offline_pack import pack_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    raw = out / "raw_conversations.jsonl"
    packed = out / "train.jsonl.packed"
    with open(raw, "w", encoding="utf-8") as f:
        for conv in make_conversations(NUM_CONVERSATIONS, seed=0):
            f.write(json.dumps({"messages": conv}) + "\n")
    print(f"[1/3] wrote {NUM_CONVERSATIONS} raw conversations to {raw}")

    encoder = MegatronSFTPackedEncoder(TOKENIZER_DIR, SEQ_LENGTH, prompt_format="nemotron-h-aligned")
    summary = pack_file(raw, packed, encoder, progress=progress)
    print(f"[2/3] packed them offline into {packed} (Megatron-LM offline-packed rows)")
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
    print(f"[3/3] read back {rows} PackedBatch rows of {SEQ_LENGTH} tokens in {seconds:.2f} s "
          f"({rows * SEQ_LENGTH / max(seconds, 1e-9):,.0f} tokens/s)")
    print(f"      conversations {conversations}/{summary.conversations}, non-pad tokens "
          f"{real / (rows * SEQ_LENGTH):.2%} of positions, trained labels {trained}, "
          f"truncated rows {len(dataset.last_report.get('truncated_lines', []))}")
    if first is not None:
        print("\nFirst row (trained tokens highlighted):")
        text = row_text(0, first.row(0), encoder.tokenizer, sys.stdout.isatty(), pad_id=encoder.pad_id)
        print(text[:3000] + ("\n..." if len(text) > 3000 else ""))
    ok = conversations == summary.conversations and not dataset.last_report.get("truncated_lines")
    print("\ndemo OK" if ok else "\ndemo FAILED: conversations lost or truncated")
    return 0 if ok else 1
