"""megatron-core ``PackedSeqParams`` for one packed row (``qkv_format="thd"``)."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import torch


def to_packed_seq_params(cu_seqlens: torch.Tensor | Sequence[int], max_seqlen: int,
                         cu_seqlens_padded: torch.Tensor | Sequence[int] | None = None,
                         device: torch.device | str | None = None, **extra: Any):
    """Build ``megatron.core.packed_seq_params.PackedSeqParams`` for a row.

    Args:
        cu_seqlens: int [n+1] logical segment boundaries (the Megatron-LM SFT path: its CP pads are
            inside the segments, exactly as Megatron-LM's ``forward_step`` passes them).
        max_seqlen: longest (padded) segment.
        cu_seqlens_padded: int [n+1] physical boundaries when segments carry padding after their
            valid tokens (Energon path with CP); ``None`` when equal to ``cu_seqlens``.
        device: where the int32 boundary tensors go (default: where ``cu_seqlens`` is).
        **extra: further ``PackedSeqParams`` fields supported by the installed megatron-core
            (e.g. ``total_tokens`` on newer releases); an unknown field is an error.

    Returns:
        ``PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu_seqlens_kv=cu_seqlens,
        cu_seqlens_q_padded=cu_seqlens_kv_padded=cu_seqlens_padded,
        max_seqlen_q=max_seqlen_kv=max_seqlen)``.
    """
    try:
        from megatron.core.packed_seq_params import PackedSeqParams
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError("to_packed_seq_params needs megatron-core: "
                          "pip install 'energon-nemotron[megatron]'") from e

    def boundaries(x):
        t = torch.as_tensor(x).reshape(-1).to(torch.int32)
        return t if device is None else t.to(device)

    cu = boundaries(cu_seqlens)
    padded = None if cu_seqlens_padded is None else boundaries(cu_seqlens_padded)
    fields = {f.name for f in dataclasses.fields(PackedSeqParams)}
    unknown = set(extra) - fields
    if unknown:
        raise TypeError(f"this megatron-core's PackedSeqParams has no field(s) {sorted(unknown)}")
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                           cu_seqlens_q_padded=padded, cu_seqlens_kv_padded=padded,
                           max_seqlen_q=int(max_seqlen), max_seqlen_kv=int(max_seqlen), **extra)
