"""megatron-core ``PackedSeqParams`` for one packed row (``qkv_format="thd"``), and the one decision
every consumer takes from it: which boundaries attention reads as ``cu_seqlens_q``.

Default (safe for multi-token prediction and context parallelism): ``cu_seqlens_q`` =
``cu_seqlens_q_padded`` = the padded boundaries. megatron-core's MTP roll (``roll_tensor`` over
``packed_seq_params``) reads ``cu_seqlens_q`` as physical offsets, and with CP divides them by the
CP size, so real lengths there would roll trained targets onto pads and across segments. Causal
attention over a segment's trailing pads leaves its real tokens unchanged (Megatron-LM's SFT path
keeps its pads inside the segments the same way). ``exact_lengths``: ``cu_seqlens_q`` = the real
lengths and ``cu_seqlens_q_padded`` the padded ones where they differ (attention skips the pads;
only for models without MTP).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Optional, Sequence

import torch

from energon_nemotron.batch import PackedBatch


#: what importing megatron-core warns on a machine without its GPU kernels (twice, from its package
#: imports): not about the data, so not shown
MEGATRON_IMPORT_NOISE = (r".*Transformer Engine and Apex are not installed.*",
                         r".*imports from `dynamic_context\.py` will be removed.*")


def packed_seq_params_class() -> type:
    """megatron-core's ``PackedSeqParams``, imported without its kernel-fallback warnings (the
    ``megatron`` extra; ``ImportError`` saying so without it)."""
    try:
        with warnings.catch_warnings():
            for message in MEGATRON_IMPORT_NOISE:
                warnings.filterwarnings("ignore", message=message)
            from megatron.core.packed_seq_params import PackedSeqParams
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError("to_packed_seq_params needs megatron-core: "
                          "pip install 'energon-nemotron[megatron]'") from e
    return PackedSeqParams


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
    PackedSeqParams = packed_seq_params_class()

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


def row_boundaries(batch: PackedBatch, i: int = 0, exact_lengths: bool = False
                   ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``(cu_seqlens_q, cu_seqlens_q_padded)`` of row ``i`` (int32 [n+1] each; the second None when
    it equals the first), as the module docstring decides them: the one place that decides it, for
    :func:`packed_seq_params` and the Megatron-Bridge step dicts (``integrations.megatron_bridge``)."""
    padded = batch.cu_seqlens_padded[i]
    if not exact_lengths:
        return padded, padded
    return batch.cu_seqlens[i], None if torch.equal(padded, batch.cu_seqlens[i]) else padded


def packed_seq_params(batch: PackedBatch, i: int = 0, exact_lengths: bool = False, **kwargs: Any):
    """megatron-core ``PackedSeqParams`` (``qkv_format="thd"``) for row ``i`` of ``batch``, with the
    boundaries of :func:`row_boundaries`. ``total_tokens`` (the row width; megatron-core derives
    the Mamba layers' ``seq_idx`` from it) is set when the installed megatron-core's
    ``PackedSeqParams`` has the field. Needs the ``megatron`` extra."""
    if "total_tokens" in {f.name for f in dataclasses.fields(packed_seq_params_class())}:
        kwargs.setdefault("total_tokens", batch.seq_length)
    cu, padded = row_boundaries(batch, i, exact_lengths)
    return to_packed_seq_params(cu, batch.max_seqlen[i], cu_seqlens_padded=padded, **kwargs)
