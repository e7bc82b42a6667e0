"""CP partition and MTP roll: properties, and equality with megatron-core's own code on CPU."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from energon_nemotron.parallel import (packed_seq_params, partition_indices, roll_targets, slice_for_cp_rank,
                                       to_packed_seq_params)
from energon_nemotron.batch import PackedBatch


@st.composite
def segments(draw, multiple=1):
    lengths = draw(st.lists(st.integers(1, 12), min_size=1, max_size=8))
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n * multiple)
    return cu


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_partition_covers_every_position_once(data):
    cp = data.draw(st.sampled_from([1, 2, 3, 4, 8]))
    cu = data.draw(segments(multiple=2 * cp if cp > 1 else 1))
    parts = [partition_indices(cu, cp, r) for r in range(cp)]
    assert all(p.numel() == cu[-1] // cp for p in parts)
    assert sorted(torch.cat(parts).tolist()) == list(range(cu[-1]))
    for r, p in enumerate(parts):        # positions stay inside their segment, in segment order
        seg = torch.bucketize(p, torch.tensor(cu[1:]), right=True)
        assert bool((seg[1:] >= seg[:-1]).all())


def test_partition_rejects_unaligned_boundaries():
    with pytest.raises(ValueError, match=r"multiple of 2\*cp=4; got \[6\]"):
        partition_indices([0, 6, 12], 2, 0)
    with pytest.raises(ValueError, match="invalid cp_size=2 / cp_rank=2"):
        partition_indices([0, 8], 2, 2)
    with pytest.raises(ValueError, match="has length 7 along dim -1"):
        slice_for_cp_rank({"tokens": torch.zeros(7)}, [0, 8], 2, 0)


@settings(max_examples=200, deadline=None)
@given(cu=segments(), depth=st.integers(0, 4))
def test_mtp_roll_never_crosses_a_segment(cu, depth):
    total = cu[-1]
    seg_id = torch.bucketize(torch.arange(total), torch.tensor(cu[1:]), right=True)
    labels = seg_id * 1000 + torch.arange(total) + 1          # encodes its own segment
    mask = torch.ones(total)
    lab, m = roll_targets(labels, mask, cu, depth)
    nonzero = lab != 0
    assert bool(((lab[nonzero] - 1) // 1000 == seg_id[nonzero]).all())
    assert bool(((lab[nonzero] - 1) % 1000 == torch.arange(total)[nonzero] + depth).all())
    assert torch.equal(nonzero.float(), m)


import megatron.core.transformer.multi_token_prediction as megatron  # noqa: E402 (the reference: missing fails)


@settings(max_examples=60, deadline=None)
@given(cu=segments(), depth=st.integers(1, 3))
def test_mtp_roll_equals_megatron_core_roll_tensor(cu, depth):
    """megatron-core's packed roll_tensor applied `depth` times (as process_mtp_loss does)."""
    total = cu[-1]
    g = torch.Generator().manual_seed(total * 31 + depth)
    labels = torch.randint(0, 500, (total,), generator=g)
    mask = (torch.rand(total, generator=g) > 0.3).float()
    params = to_packed_seq_params(cu, max(b - a for a, b in zip(cu, cu[1:])))
    want_l, want_m = labels.unsqueeze(0), mask.unsqueeze(0)
    for _ in range(depth):
        want_l, _ = megatron.roll_tensor(want_l, shifts=-1, dims=-1, packed_seq_params=params)
        want_m, _ = megatron.roll_tensor(want_m, shifts=-1, dims=-1, packed_seq_params=params)
    got_l, got_m = roll_targets(labels, mask, cu, depth)
    assert torch.equal(got_l, want_l[0]) and torch.equal(got_m, want_m[0])


def test_packed_seq_params_fields():
    from megatron.core.packed_seq_params import PackedSeqParams

    p = to_packed_seq_params(torch.tensor([0, 5, 12]), 7)
    assert isinstance(p, PackedSeqParams) and p.qkv_format == "thd"
    assert p.cu_seqlens_q.dtype == torch.int32 and p.cu_seqlens_q.tolist() == [0, 5, 12]
    assert p.cu_seqlens_kv is p.cu_seqlens_q and p.cu_seqlens_q_padded is None
    assert p.max_seqlen_q == p.max_seqlen_kv == 7
    with pytest.raises(TypeError, match="no field"):
        to_packed_seq_params([0, 4], 4, not_a_field=1)
    batch = PackedBatch(tokens=torch.zeros(1, 12, dtype=torch.int64), labels=torch.zeros(1, 12, dtype=torch.int64),
                        loss_mask=torch.zeros(1, 12), position_ids=torch.zeros(1, 12, dtype=torch.int64),
                        cu_seqlens=[torch.tensor([0, 3, 10], dtype=torch.int32)],
                        cu_seqlens_padded=[torch.tensor([0, 4, 12], dtype=torch.int32)],
                        max_seqlen=[8], sample_keys=[["a", "b"]])
    batch.validate()
    q = packed_seq_params(batch, 0)       # MTP/CP-safe: the padded boundaries everywhere
    assert q.cu_seqlens_q.tolist() == q.cu_seqlens_q_padded.tolist() == [0, 4, 12]
    exact = packed_seq_params(batch, 0, exact_lengths=True)
    assert exact.cu_seqlens_q.tolist() == [0, 3, 10] and exact.cu_seqlens_q_padded.tolist() == [0, 4, 12]

def test_megatron_core_imports_without_its_kernel_warnings():
    """Importing megatron-core's PackedSeqParams warned twice that Transformer Engine and Apex are not
    installed (on every CPU machine): not about the data, so not shown."""
    import subprocess
    import sys

    code = ("from energon_nemotron.parallel.packed_seq_params import packed_seq_params_class\n"
            "print(packed_seq_params_class().__name__)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip() == "PackedSeqParams", res.stderr
    assert "Transformer Engine and Apex" not in res.stderr, res.stderr
