"""Context-parallel (CP) sharding of packed THD rows: per-document zig-zag.

Each packed segment ``[cu[i], cu[i+1])`` is split into ``2*cp`` equal chunks; CP rank ``r`` keeps
chunk ``r`` and chunk ``2*cp-1-r`` of every segment, segment after segment. This is the partition of
Transformer Engine's ``thd_get_partitioned_indices`` that megatron-core's
``get_batch_on_this_cp_rank`` applies to SFT (per-document) batches; the boundaries themselves stay
global. Every boundary must be a multiple of ``2*cp``.
"""

from __future__ import annotations

from typing import Sequence

import torch

from energon_nemotron.batch import PackedBatch


def _as_boundaries(cu_seqlens_padded: torch.Tensor | Sequence[int]) -> torch.Tensor:
    cu = torch.as_tensor(cu_seqlens_padded, dtype=torch.int64).reshape(-1)
    if cu.numel() < 2 or int(cu[0]) != 0 or bool((cu[1:] < cu[:-1]).any()):
        raise ValueError(f"cu_seqlens_padded must start at 0 and not decrease, got {cu.tolist()}")
    return cu


def partition_indices(cu_seqlens_padded: torch.Tensor | Sequence[int], cp_size: int,
                      cp_rank: int) -> torch.Tensor:
    """Global positions kept by ``cp_rank``, in the order the rank holds them.

    Args:
        cu_seqlens_padded: int [n+1] segment boundaries of one packed row (first 0, last = T);
            every entry must be a multiple of ``2*cp_size``.
        cp_size: context-parallel world size (>= 1).
        cp_rank: this rank, ``0 <= cp_rank < cp_size``.

    Returns:
        int64 [T / cp_size]: for each segment, chunk ``cp_rank`` then chunk
        ``2*cp_size-1-cp_rank`` (chunk length = segment length / (2*cp_size)).
    """
    if cp_size < 1 or not 0 <= cp_rank < cp_size:
        raise ValueError(f"invalid cp_size={cp_size} / cp_rank={cp_rank}")
    cu = _as_boundaries(cu_seqlens_padded)
    total = int(cu[-1])
    if cp_size == 1:
        return torch.arange(total, dtype=torch.int64)
    g = 2 * cp_size
    bad = cu[cu % g != 0]
    if bad.numel():
        raise ValueError(f"every cu_seqlens entry must be a multiple of 2*cp={g}; "
                         f"got {bad.tolist()} in {cu.tolist()}")
    starts, lengths = cu[:-1], cu[1:] - cu[:-1]
    chunk = lengths // g                                   # [n]
    local = 2 * chunk                                      # tokens per segment on this rank
    seg = torch.repeat_interleave(torch.arange(lengths.numel()), local)   # [T/cp]
    # position of each local token inside its segment's local slice
    offset_in_seg = torch.arange(seg.numel()) - torch.repeat_interleave(
        torch.cumsum(local, 0) - local, local)
    c = chunk[seg]
    first_half = offset_in_seg < c
    chunk_id = torch.where(first_half, torch.full_like(c, cp_rank), torch.full_like(c, g - 1 - cp_rank))
    within = torch.where(first_half, offset_in_seg, offset_in_seg - c)
    return starts[seg] + chunk_id * c + within


ROW_TENSORS = ("tokens", "labels", "loss_mask", "position_ids", "padding_mask")


def slice_for_cp_rank(tensors, cu_seqlens_padded, cp_size: int, cp_rank: int, dim: int = -1):
    """Apply :func:`partition_indices` to every tensor of ``tensors`` along ``dim``.

    Args:
        tensors: name → tensor whose ``dim`` has length T (e.g. tokens, labels, loss_mask,
            position_ids of one row, [T] or [1, T]). Boundaries and max_seqlen are *not* sliced:
            keep them out of this dict; they stay global. Or a ``PackedBatch``: each row's
            tokens/labels/loss_mask/position_ids/padding_mask [B, S] are sliced by its own
            ``cu_seqlens_padded`` (pass None for ``cu_seqlens_padded``) and a ``PackedBatch`` of
            [B, S / cp_size] comes back, boundaries and media unchanged (global).
        cu_seqlens_padded: int [n+1] boundaries of that row.

    Returns:
        name → tensor with ``dim`` of length T / cp_size, same dtype (or the sliced ``PackedBatch``).
    """
    if isinstance(tensors, PackedBatch):
        rows = [slice_for_cp_rank({k: getattr(tensors, k)[i] for k in ROW_TENSORS},
                                  tensors.cu_seqlens_padded[i], cp_size, cp_rank)
                for i in range(tensors.batch_size)]
        return tensors.replace(**{k: torch.stack([r[k] for r in rows]) for k in ROW_TENSORS})
    index = partition_indices(cu_seqlens_padded, cp_size, cp_rank)
    total = int(torch.as_tensor(cu_seqlens_padded).reshape(-1)[-1])
    out = {}
    for name, t in tensors.items():
        if t.shape[dim] != total:
            raise ValueError(f"slice_for_cp_rank: {name!r} has length {t.shape[dim]} along dim {dim}, "
                             f"but the boundaries end at {total}")
        out[name] = t.index_select(dim, index.to(t.device))
    return out
