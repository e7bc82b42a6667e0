"""``PackedBatch.padding_mask`` (bool [B, S], True where no segment's token sits): on both paths,
through pickling, the CP slice and the TP broadcast wire, and in the Megatron-Bridge dicts."""

from __future__ import annotations

import pickle

import pytest
import torch

from conftest import FORMATS, fixture_rows, load_reference
from energon_data import text_config, text_dataset
from energon_nemotron.batch import PackedBatch
from energon_nemotron.batch.padding import alignment_padding
from energon_nemotron.integrations import to_gpt_step_batch, to_nemotron_omni_step_batch
from energon_nemotron.loading import build_task_encoder, build_train_loader
from energon_nemotron.megatron_packed import collate_rows
from energon_nemotron.parallel import partition_indices, slice_for_cp_rank
from energon_nemotron.parallel.broadcast import packed_batch_from_wire, packed_batch_to_wire
from test_megatron_parity import encoder_for


def test_alignment_padding_by_hand():
    # segments of 3 and 2 real tokens in extents of 4 and 4; then 3 and 2 in 4 and 6 (the tail)
    assert alignment_padding(torch.tensor([0, 3, 5]), torch.tensor([0, 4, 8]), 8).tolist() == \
        [False, False, False, True, False, False, True, True]
    assert alignment_padding(torch.tensor([0, 3, 5]), torch.tensor([0, 4, 10]), 10).tolist() == \
        [False] * 3 + [True] + [False] * 2 + [True] * 4
    assert alignment_padding(torch.tensor([0, 0, 2]), torch.tensor([0, 0, 4]), 4).tolist() == [False, False, True, True]
    assert alignment_padding(torch.tensor([0]), torch.tensor([0]), 3).tolist() == [True] * 3


@pytest.fixture(scope="module")
def energon_batches(tmp_path_factory):
    """Text batches packed with pad_multiple 8 (alignment gaps inside every row) and a tail."""
    root = tmp_path_factory.mktemp("pad")
    ds, _ = text_dataset(root / "ds", "openai_messages", n=24)
    cfg = text_config(ds, workers=0, seq_length=1024, batch_size=2,
                      packing={"algorithm": "first_fit_decreasing", "buffer_size": 12, "pad_multiple": 8})
    loader = build_train_loader(cfg, repeat=False)
    return list(loader), build_task_encoder(cfg).pad_id


def test_energon_rows_mark_the_alignment_gaps_and_the_tail(energon_batches):
    batches, pad_id = energon_batches
    gaps = 0
    for b in batches:
        b.validate()
        assert b.padding_mask.dtype == torch.bool and b.padding_mask.shape == b.tokens.shape
        for r in range(b.batch_size):
            real = ~b.padding_mask[r]
            assert int(real.sum()) == int(b.cu_seqlens[r][-1])               # exactly the real tokens
            assert bool((b.tokens[r][b.padding_mask[r]] == pad_id).all())
            assert float(b.loss_mask[r][b.padding_mask[r]].sum()) == 0.0 and bool((b.labels[r][b.padding_mask[r]] == -100).all())
            for start, end, n in zip(b.cu_seqlens_padded[r][:-1], b.cu_seqlens_padded[r][1:],
                                     b.cu_seqlens[r][1:] - b.cu_seqlens[r][:-1]):
                seg = b.padding_mask[r][int(start):int(end)]
                assert seg.tolist() == [False] * int(n) + [True] * (int(end - start) - int(n))
                gaps += int(end - start) - int(n)
    assert gaps > 0


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "default"])    # default pads with EOS
def test_megatron_rows_mark_the_pads_megatron_lm_wrote(fmt):
    """Where Megatron-LM's own tensors (the fixture) hold the pad id, and only there: the pad id
    of these formats is not a content token."""
    enc = encoder_for(fmt, 2)
    ref = load_reference(fmt, 2)
    rows = [enc.encode(row, f"train.jsonl.packed:{i + 1}") for i, row in enumerate(fixture_rows())]
    for out, want in zip(rows, ref["rows"]):
        assert out["padding_mask"].tolist() == [t == ref["meta"]["pad_id"] for t in want["tokens"]]
    batch = collate_rows(rows)
    batch.validate()
    assert batch.padding_mask.any() and torch.equal(batch.padding_mask, torch.stack([r["padding_mask"] for r in rows]))


def test_default_format_pads_with_eos_and_still_marks_only_the_pads():
    """``default`` pads with EOS, which also ends every conversation: the mask is not ``tokens ==
    pad``; it leaves each conversation's own EOS unmasked."""
    enc = encoder_for("default", 2)
    out = enc.encode(fixture_rows()[0], "train.jsonl.packed:1")
    pad = enc.pad_id
    assert bool((out["tokens"][out["padding_mask"]] == pad).all())
    assert int(((out["tokens"] == pad) & ~out["padding_mask"]).sum()) >= 1          # a real EOS


def test_the_mask_travels_through_pickle_cp_and_the_wire(energon_batches):
    batch = energon_batches[0][0]
    assert torch.equal(pickle.loads(pickle.dumps(batch)).padding_mask, batch.padding_mask)
    header, buffers = packed_batch_to_wire(batch)
    assert torch.equal(packed_batch_from_wire(header, buffers).padding_mask, batch.padding_mask)
    derived = PackedBatch(tokens=batch.tokens, labels=batch.labels, loss_mask=batch.loss_mask,
                          position_ids=batch.position_ids, cu_seqlens=batch.cu_seqlens,
                          cu_seqlens_padded=batch.cu_seqlens_padded, max_seqlen=batch.max_seqlen,
                          sample_keys=batch.sample_keys)
    assert torch.equal(derived.padding_mask, batch.padding_mask)     # derived from the boundaries
    for rank in range(2):
        local = slice_for_cp_rank(batch, None, 2, rank)
        for r in range(batch.batch_size):
            index = partition_indices(batch.cu_seqlens_padded[r], 2, rank)
            assert torch.equal(local.padding_mask[r], batch.padding_mask[r][index])


def test_bridge_dicts_carry_the_mask(energon_batches):
    batch = energon_batches[0][0]
    for r in range(batch.batch_size):
        assert torch.equal(to_gpt_step_batch(batch, r)["padding_mask"], batch.padding_mask[r].unsqueeze(0))
        omni = to_nemotron_omni_step_batch(batch, r)
        assert torch.equal(omni["padding_mask"], batch.padding_mask[r].unsqueeze(0))


def test_a_trained_pad_is_refused(energon_batches):
    batch = energon_batches[0][0]
    bad = batch.replace(padding_mask=batch.padding_mask.clone())
    r, pos = torch.nonzero(batch.loss_mask)[0].tolist()
    bad.padding_mask[r, pos] = True
    with pytest.raises(ValueError, match="loss_mask is 1 at a position padding_mask marks as padding"):
        bad.validate()
    with pytest.raises(ValueError, match=r"PackedBatch.padding_mask: expected torch.bool"):
        batch.replace(padding_mask=batch.padding_mask.float()).validate()
