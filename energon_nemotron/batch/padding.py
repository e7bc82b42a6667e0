"""Which positions of a packed row hold no token of any segment: ``PackedBatch.padding_mask``.

In the Energon layout a segment of ``n`` real tokens sits at the start of its padded extent
``[cu_seqlens_padded[i], cu_seqlens_padded[i+1])``; the rest of the extent is alignment padding
(``packing.pad_multiple``, ``2·CP``), and the row's tail after the last segment's tokens belongs to
the last extent. Those positions are padding: no loss, no attention to real tokens, and for a
mixture-of-experts model no routing statistics (expert load, aux loss, expert bias).
"""

from __future__ import annotations

import torch

__all__ = ["alignment_padding"]


def alignment_padding(cu_seqlens: torch.Tensor, cu_seqlens_padded: torch.Tensor, seq_length: int) -> torch.Tensor:
    """bool [seq_length]: True at the positions of one row that hold no real token.

    Args:
        cu_seqlens: int [n+1] cumulative real lengths of the row's segments (first 0).
        cu_seqlens_padded: int [n+1] cumulative padded lengths (first 0, last ``seq_length``).
        seq_length: S, the row's length.
    """
    cu = torch.as_tensor(cu_seqlens, dtype=torch.int64).reshape(-1)
    padded = torch.as_tensor(cu_seqlens_padded, dtype=torch.int64).reshape(-1)
    lengths = cu[1:] - cu[:-1]                               # [n] real tokens per segment
    if lengths.numel() == 0:
        return torch.ones(seq_length, dtype=torch.bool)
    positions = torch.arange(seq_length, dtype=torch.int64)
    segment = torch.searchsorted(padded[1:], positions, right=True).clamp(max=lengths.numel() - 1)
    return positions - padded[segment] >= lengths[segment]
