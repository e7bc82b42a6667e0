"""Encoded Megatron-LM rows → ``PackedBatch``."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from energon_nemotron.batch import PackedBatch


def collate_rows(rows: Sequence[dict[str, Any]]) -> PackedBatch:
    """Stack encoded rows (``MegatronSFTPackedEncoder.encode`` outputs) into a ``PackedBatch``.

    ``cu_seqlens_padded`` equals ``cu_seqlens`` here: Megatron-LM bakes the CP pads into the
    segments. A row with ``is_padding`` (validation padding) keeps its all-zero loss mask;
    ``__restore_key__`` records the resume position.
    """
    if not rows:
        raise ValueError("collate_rows needs at least one row")
    lengths = {int(r["tokens"].shape[0]) for r in rows}
    if len(lengths) != 1:
        raise ValueError(f"rows of different lengths cannot be batched: {sorted(lengths)}")
    return PackedBatch(
        tokens=torch.stack([r["tokens"] for r in rows]),
        labels=torch.stack([r["labels"] for r in rows]),
        loss_mask=torch.stack([r["loss_mask"] for r in rows]),
        position_ids=torch.stack([r["position_ids"] for r in rows]),
        padding_mask=torch.stack([r["padding_mask"] for r in rows]),
        cu_seqlens=[r["cu_seqlens"] for r in rows],
        cu_seqlens_padded=[r["cu_seqlens"] for r in rows],
        max_seqlen=[int(r["max_seqlen"]) for r in rows],
        sample_keys=[list(r.get("sample_keys", [])) for r in rows],
        is_padding=[bool(r.get("is_padding", False)) for r in rows],
        skipped=_summed(r.get("skipped", {}) for r in rows),
        # ("megatron_rows", worker id, items of that worker's stream consumed): the resume position
        __restore_key__=("megatron_rows", *rows[-1]["position"]) if "position" in rows[-1] else (),
    )


def _summed(counts) -> dict[str, int]:
    """The per-reason sums of ``counts`` (dicts of reason -> count)."""
    out: dict[str, int] = {}
    for c in counts:
        for reason, n in c.items():
            out[reason] = out.get(reason, 0) + n
    return out
