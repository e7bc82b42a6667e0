"""Character spans of a rendered conversation → per-token flags, using the tokenizer's offsets."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def token_mask_from_spans(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """bool [n]: token i is True when its character range overlaps one of ``spans``.

    The rule of Hugging Face ``apply_chat_template(..., return_assistant_tokens_mask=True)``
    (transformers 5): a token ``[s, e)`` is marked when ``s < span_end`` and ``e > span_start``.

    Args:
        offsets: (start, end) character offsets of the n tokens, in order.
        spans: sorted, non-overlapping (start, end) character spans.
    """
    n = len(offsets)
    mask = np.zeros(n, dtype=bool)
    if not n or not spans:
        return mask
    off = np.asarray(offsets, dtype=np.int64).reshape(n, 2)
    sp = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
    # for each token, the first span whose end is beyond the token's start
    j = np.searchsorted(sp[:, 1], off[:, 0], side="right")
    inside = j < sp.shape[0]
    jj = np.minimum(j, sp.shape[0] - 1)
    mask[:] = inside & (off[:, 1] > sp[jj, 0])
    return mask


def misaligned(offsets: Sequence[tuple[int, int]], boundaries: Sequence[int]) -> list[int]:
    """The character positions of ``boundaries`` that fall strictly inside a token."""
    if not len(offsets) or not len(boundaries):
        return []
    off = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    b = np.asarray(boundaries, dtype=np.int64)
    starts, ends = off[:, 0], off[:, 1]
    k = np.searchsorted(ends, b, side="right")          # tokens ending at or before b
    k = np.minimum(k, len(starts) - 1)
    bad = (starts[k] < b) & (ends[k] > b)
    return b[bad].tolist()
