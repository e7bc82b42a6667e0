"""Data types shared by both input paths. ``PackedBatch`` is the one output type of the library."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

IGNORE_INDEX = -100


@dataclass
class PackedBatch:
    """A micro-batch of packed rows, ready for a Megatron model with ``qkv_format="thd"``.

    B = rows in the micro-batch (usually 1), S = sequence length.

    - ``tokens``: int64 [B, S] input ids.
    - ``labels``: int64 [B, S] next-token targets, target-aligned; ``-100`` where not trained
      (the Megatron-LM path also keeps the pad id at pad positions, as Megatron-LM does).
    - ``loss_mask``: float32 [B, S], 1 where ``labels`` is trained; the authority for the loss.
    - ``position_ids``: int64 [B, S], restarting at 0 for every packed segment.
    - ``cu_seqlens``: per row, int32 [n_i + 1], true segment boundaries (first 0, last S).
    - ``cu_seqlens_padded``: per row, int32 [n_i + 1], boundaries including per-segment padding.
    - ``max_seqlen``: per row, the longest padded segment.
    - ``sample_keys``: per row, the key of every source in order.
    - ``is_padding``: per row, True for a row that only evens out data-parallel ranks
      (its ``loss_mask`` is all zero).
    - ``media``: named ``PackedTensor``s (Energon path; empty on the Megatron-LM path).
    """

    tokens: torch.Tensor
    labels: torch.Tensor
    loss_mask: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: list[torch.Tensor]
    cu_seqlens_padded: list[torch.Tensor]
    max_seqlen: list[int]
    sample_keys: list[list[str]]
    is_padding: list[bool] = field(default_factory=list)
    media: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.is_padding:
            self.is_padding = [False] * self.tokens.shape[0]

    @property
    def batch_size(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def seq_length(self) -> int:
        return int(self.tokens.shape[1])

    @property
    def num_valid_tokens(self) -> int:
        """Number of trained label positions (``loss_mask.sum()``)."""
        return int(self.loss_mask.sum().item())

    def validate(self) -> None:
        """Check the contract (dtypes, shapes, boundaries); raise ``ValueError`` on a violation."""
        b, s = self.tokens.shape
        for name, dtype in (("tokens", torch.int64), ("labels", torch.int64),
                            ("loss_mask", torch.float32), ("position_ids", torch.int64)):
            t = getattr(self, name)
            if t.dtype != dtype or tuple(t.shape) != (b, s):
                raise ValueError(f"PackedBatch.{name}: expected {dtype} [{b}, {s}], "
                                 f"got {t.dtype} {list(t.shape)}")
        for name in ("cu_seqlens", "cu_seqlens_padded", "max_seqlen", "sample_keys", "is_padding"):
            if len(getattr(self, name)) != b:
                raise ValueError(f"PackedBatch.{name}: expected {b} rows")
        for i in range(b):
            padded = self.cu_seqlens_padded[i]
            cu = self.cu_seqlens[i]
            for label, c in (("cu_seqlens", cu), ("cu_seqlens_padded", padded)):
                if c.dtype != torch.int32 or c.dim() != 1 or c.numel() < 2:
                    raise ValueError(f"row {i}: {label} must be a 1-D int32 tensor with >= 2 entries")
                if int(c[0]) != 0 or bool((c[1:] < c[:-1]).any()):
                    raise ValueError(f"row {i}: {label} must start at 0 and not decrease")
            if int(padded[-1]) != s:
                raise ValueError(f"row {i}: cu_seqlens_padded must end at {s}, got {int(padded[-1])}")
            if cu.numel() != padded.numel() or bool((cu > padded).any()):
                raise ValueError(f"row {i}: cu_seqlens must pair with cu_seqlens_padded")
            longest = int((padded[1:] - padded[:-1]).max())
            if self.max_seqlen[i] != longest:
                raise ValueError(f"row {i}: max_seqlen {self.max_seqlen[i]} != longest segment {longest}")
        if bool(((self.loss_mask != 0) & (self.labels == IGNORE_INDEX)).any()):
            raise ValueError("loss_mask is 1 at a position whose label is -100")

    def row(self, i: int) -> dict[str, Any]:
        """Row ``i`` as a dict of 1-D tensors and metadata."""
        return {
            "tokens": self.tokens[i],
            "labels": self.labels[i],
            "loss_mask": self.loss_mask[i],
            "position_ids": self.position_ids[i],
            "cu_seqlens": self.cu_seqlens[i],
            "cu_seqlens_padded": self.cu_seqlens_padded[i],
            "max_seqlen": self.max_seqlen[i],
            "sample_keys": self.sample_keys[i],
            "is_padding": self.is_padding[i],
        }

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "PackedBatch":
        """Copy the tensors to ``device`` (boundaries stay int32, loss_mask stays float32)."""

        def move(t: torch.Tensor) -> torch.Tensor:
            return t.to(device, non_blocking=non_blocking)

        media = {k: (v.to(device) if hasattr(v, "to") else v) for k, v in self.media.items()}
        return PackedBatch(
            tokens=move(self.tokens), labels=move(self.labels), loss_mask=move(self.loss_mask),
            position_ids=move(self.position_ids),
            cu_seqlens=[move(c) for c in self.cu_seqlens],
            cu_seqlens_padded=[move(c) for c in self.cu_seqlens_padded],
            max_seqlen=list(self.max_seqlen), sample_keys=[list(k) for k in self.sample_keys],
            is_padding=list(self.is_padding), media=media,
        )

    def packed_seq_params(self, i: int = 0, **kwargs: Any):
        """megatron-core ``PackedSeqParams`` (``qkv_format="thd"``) for row ``i``.

        ``cu_seqlens_q_padded`` is only set where it differs from ``cu_seqlens`` (as megatron-core
        expects for data with padding between sequences). Needs the ``megatron`` extra.
        """
        from energon_nemotron.parallel.packed_seq_params import to_packed_seq_params

        padded = self.cu_seqlens_padded[i]
        same = torch.equal(padded, self.cu_seqlens[i])
        return to_packed_seq_params(self.cu_seqlens[i], self.max_seqlen[i],
                                    cu_seqlens_padded=None if same else padded, **kwargs)
