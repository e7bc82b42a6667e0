"""A ``PackedBatch`` pickles its token tensors as one flat buffer (``tensors.flat``): by value when
small, one shared-memory segment when large; through a real multi-worker ``DataLoader`` the batch
arrives bit-identical."""

from __future__ import annotations

import pickle

import numpy as np
import torch

from energon_nemotron.tensors.flat import BY_VALUE_MAX, pack, unpack
from energon_nemotron.batch import PackedBatch


def make_batch(rows: int, seq: int, seed: int = 0) -> PackedBatch:
    g = torch.Generator().manual_seed(seed)
    cu = [torch.tensor([0, seq // 3, seq], dtype=torch.int32) for _ in range(rows)]
    labels = torch.randint(-100, 1000, (rows, seq), generator=g)
    labels[labels < 0] = -100
    return PackedBatch(tokens=torch.randint(0, 1000, (rows, seq), generator=g), labels=labels,
                       loss_mask=(labels != -100).float(),
                       position_ids=torch.arange(seq).repeat(rows, 1),
                       cu_seqlens=cu, cu_seqlens_padded=[c.clone() for c in cu], max_seqlen=[seq - seq // 3] * rows,
                       sample_keys=[[f"s{seed}r{r}a", f"s{seed}r{r}b"] for r in range(rows)], skipped={"x": 1})


def assert_same(a: PackedBatch, b: PackedBatch) -> None:
    for name in ("tokens", "labels", "loss_mask", "position_ids"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), name
    for name in ("cu_seqlens", "cu_seqlens_padded"):
        assert [t.tolist() for t in getattr(a, name)] == [t.tolist() for t in getattr(b, name)]
        assert all(t.dtype == torch.int32 for t in getattr(b, name))
    assert (a.max_seqlen, a.sample_keys, a.skipped, a.is_padding) == (b.max_seqlen, b.sample_keys, b.skipped, b.is_padding)
    b.validate()


def test_pack_unpack_keeps_dtypes_shapes_values_and_alignment():
    ts = [torch.arange(5, dtype=torch.int64), torch.ones(3, dtype=torch.bool), torch.zeros(0, 4),
          torch.rand(2, 3, dtype=torch.float64).t(), torch.tensor([1, 2, 3], dtype=torch.int32)]   # one not contiguous
    buffer, layout = pack(ts)
    assert isinstance(buffer, np.ndarray) and all(off % 16 == 0 for off, _, _ in layout)
    for t, u in zip(ts, unpack(buffer, layout)):
        assert u.dtype == t.dtype and u.shape == t.shape and torch.equal(u, t)
    assert pack([torch.ones(2, requires_grad=True)]) is None
    big, _ = pack([torch.zeros(BY_VALUE_MAX // 8 + 1, dtype=torch.int64)])
    assert isinstance(big, torch.Tensor)                    # above the limit: a tensor (one segment)


def test_pickle_round_trip_small_and_large():
    for rows, seq in ((1, 64), (2, 40_000)):                # 2 x 40k x 28 bytes: above BY_VALUE_MAX
        batch = make_batch(rows, seq)
        state = batch.__getstate__()
        assert "tokens" not in state and isinstance(state["_flat"][0], np.ndarray) == (rows == 1)
        back = pickle.loads(pickle.dumps(batch))
        assert_same(batch, back)
        # the views share one buffer, and writing one field leaves the others as they were
        assert back.tokens.untyped_storage().data_ptr() == back.cu_seqlens[0].untyped_storage().data_ptr()
        back.tokens.fill_(7)
        assert torch.equal(back.labels, batch.labels) and back.cu_seqlens[0].tolist() == batch.cu_seqlens[0].tolist()


def shape_of(i: int) -> tuple[int, int]:
    """Rows and sequence length of the i-th batch: small ones (by value) and large ones (segment)."""
    return (1 if i % 2 else 2), (64 if i % 3 else 40_000)


class Batches(torch.utils.data.IterableDataset):
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        for i in range(info.id, 6, info.num_workers):
            yield make_batch(*shape_of(i), seed=i)


def test_through_a_two_worker_dataloader():
    loader = torch.utils.data.DataLoader(Batches(), batch_size=None, num_workers=2,
                                         multiprocessing_context="fork")
    got = {}
    for b in loader:
        got[int(b.sample_keys[0][0][1:].split("r")[0])] = b
        assert b.tokens.untyped_storage().data_ptr() == b.labels.untyped_storage().data_ptr()
    assert sorted(got) == list(range(6))
    for i, b in got.items():
        assert_same(make_batch(*shape_of(i), seed=i), b)
