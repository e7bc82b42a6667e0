"""Row assembly of the Energon path: shift within sources, padding, boundaries."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from energon_nemotron.packing.assemble import assemble_row, source_labels
from energon_nemotron.types import EncodedSource
from energon_nemotron.batch import IGNORE_INDEX


def src(key, tokens, trained):
    return EncodedSource(key, np.asarray(tokens, dtype=np.int64), np.asarray(trained, dtype=bool))


def test_two_sources_with_pad_multiple():
    # the layout NeMo-RL's packing test uses: lengths 5 and 3, pad multiple 4, capacity 12
    a = src("a", [1, 2, 3, 4, 5], [0, 0, 0, 1, 1])
    b = src("b", [1, 2, 3], [0, 1, 1])
    row = assemble_row([a, b], seq_length=12, pad_multiple=4, pad_id=0)
    assert row["tokens"].tolist() == [1, 2, 3, 4, 5, 0, 0, 0, 1, 2, 3, 0]
    assert row["cu_seqlens"].tolist() == [0, 5, 8]
    assert row["cu_seqlens_padded"].tolist() == [0, 8, 12]
    assert row["cu_seqlens"].dtype == torch.int32 and row["cu_seqlens_padded"].dtype == torch.int32
    # label j = token j+1 when that token is trained; a source's last position is never trained
    assert row["labels"].tolist() == [-100, -100, 4, 5, -100, -100, -100, -100, 2, 3, -100, -100]
    assert row["loss_mask"].tolist() == [0, 0, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0]
    assert row["position_ids"].tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3]
    assert row["max_seqlen"] == 8 and row["keys"] == ["a", "b"]


def test_nothing_predicts_across_a_boundary():
    rng = np.random.default_rng(0)
    sources = [src(str(i), rng.integers(1, 99, n), rng.random(n) > 0.3) for i, n in enumerate([7, 1, 4, 9])]
    row = assemble_row(sources, seq_length=32, pad_multiple=2, pad_id=0)
    cu, cup = row["cu_seqlens"].tolist(), row["cu_seqlens_padded"].tolist()
    labels = row["labels"].tolist()
    for k in range(len(sources)):
        start, n = cup[k], cu[k + 1] - cu[k]
        assert labels[start + n - 1] == IGNORE_INDEX                  # last real position
        assert all(x == IGNORE_INDEX for x in labels[start + n:cup[k + 1]])   # its padding
        assert labels[start:start + n] == source_labels(sources[k].tokens, sources[k].trained).tolist()
        assert row["position_ids"][start].item() == 0
    assert cup[-1] == 32 and row["max_seqlen"] == max(np.diff(cup))


def test_overfull_row_is_refused():
    with pytest.raises(ValueError, match="take 16 positions, more than seq_length=8"):
        assemble_row([src("a", [1] * 5, [1] * 5), src("b", [1] * 7, [1] * 7)], 8, 4, 0)
