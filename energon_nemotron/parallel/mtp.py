"""Multi-token-prediction (MTP) targets of a packed row, as megatron-core derives them.

megatron-core's MTP loss rolls the labels and the loss mask left by one position per depth, inside
each packed segment, writing 0 at the segment's last position (``roll_tensor`` with
``packed_seq_params``). At depth ``k`` position ``i`` therefore holds the value at ``i + k`` when
that position is in the same segment, else 0. No target ever crosses a segment boundary.

Megatron derives these itself from ``labels``/``loss_mask``: pass those, never pre-rolled ones.
These functions exist for tests, inspection and non-Megatron consumers.
"""

from __future__ import annotations

from typing import Sequence

import torch

from energon_nemotron.batch import PackedBatch


def roll_targets(labels: torch.Tensor, loss_mask: torch.Tensor,
                 cu_seqlens: torch.Tensor | Sequence[int], depth: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels and loss mask of MTP depth ``depth`` (1-based) for one packed row.

    Args:
        labels: int64 [T] target-aligned labels.
        loss_mask: float32 [T] target-aligned loss mask.
        cu_seqlens: int [n+1] segment boundaries, first 0, last T.
        depth: MTP depth k >= 1 (0 returns copies of the inputs).

    Returns:
        (labels_k int64 [T], loss_mask_k float32 [T]) with ``X_k[i] = X[i+k]`` if ``i+k`` is
        before the end of ``i``'s segment, else 0.
    """
    if depth < 0:
        raise ValueError(f"MTP depth must be >= 0, got {depth}")
    if labels.dim() != 1 or labels.shape != loss_mask.shape:
        raise ValueError("roll_targets expects 1-D labels and loss_mask of equal length")
    cu = torch.as_tensor(cu_seqlens, dtype=torch.int64).reshape(-1)
    total = labels.numel()
    if int(cu[0]) != 0 or int(cu[-1]) != total:
        raise ValueError(f"cu_seqlens must span [0, {total}], got {cu.tolist()}")
    lengths = cu[1:] - cu[:-1]
    seg_end = torch.repeat_interleave(cu[1:], lengths)          # [T] end of each position's segment
    src = torch.arange(total) + depth
    keep = src < seg_end
    src = torch.where(keep, src, torch.zeros_like(src))
    out_labels = torch.where(keep, labels[src], torch.zeros_like(labels))
    out_mask = torch.where(keep, loss_mask[src], torch.zeros_like(loss_mask))
    return out_labels, out_mask


def mtp_targets(batch: PackedBatch, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels int64 [B, S] and loss mask float32 [B, S] of multi-token-prediction depth ``depth``
    (1-based, at most ``batch.mtp_num_layers`` when that is set), as megatron-core's per-segment
    roll derives them from ``labels`` and ``loss_mask`` (:func:`roll_targets` per row over
    ``cu_seqlens_padded``): no target crosses a segment boundary."""
    if depth < 1 or (batch.mtp_num_layers and depth > batch.mtp_num_layers):
        raise ValueError(f"MTP depth must be in 1..{batch.mtp_num_layers or 'inf'}, got {depth}")
    rolled = [roll_targets(batch.labels[i], batch.loss_mask[i], batch.cu_seqlens_padded[i], depth)
              for i in range(batch.batch_size)]
    return torch.stack([r[0] for r in rolled]), torch.stack([r[1] for r in rolled])
