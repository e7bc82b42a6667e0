"""Bit-exact parity with tensors produced by Megatron-LM's own SFTDataset (main d98e8a64dd).

All 12 reference files: 4 prompt formats x CP 1/2/4, sequence length 96, two offline-packed rows
(one with a truncation). Compared: tokens, labels (-100 and pad ids as emitted), loss_mask,
position_ids, stripped cu_seqlens, max_seqlen, MTP depth 1..2 targets and, for CP > 1, every CP
rank's shard (global indices, tensors and CP-local MTP targets).
"""

from __future__ import annotations

import pytest
import torch

from conftest import CP_SIZES, FIXTURE_TOKENIZER, FORMATS, fixture_rows, load_reference
from energon_nemotron.megatron_packed import MegatronSFTPackedEncoder, collate_rows
from energon_nemotron.parallel import partition_indices, roll_targets, slice_for_cp_rank

TENSORS = ["tokens", "labels", "loss_mask", "position_ids"]
_ENCODERS: dict = {}


def encoder_for(fmt: str, cp: int) -> MegatronSFTPackedEncoder:
    if (fmt, cp) not in _ENCODERS:
        # The fixture tokenizer has no pad token, so Megatron-LM's `default` pads with EOS.
        _ENCODERS[fmt, cp] = MegatronSFTPackedEncoder(FIXTURE_TOKENIZER, 96, prompt_format=fmt,
                                                      context_parallel_size=cp,
                                                      allow_eos_pad=fmt == "default")
    return _ENCODERS[fmt, cp]


def encoded(fmt: str, cp: int):
    enc = encoder_for(fmt, cp)
    return [enc.encode(row, f"train.jsonl.packed:{i + 1}") for i, row in enumerate(fixture_rows())]


@pytest.mark.parametrize("cp", CP_SIZES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_rows_match_megatron_lm(fmt, cp):
    ref = load_reference(fmt, cp)
    assert ref["meta"]["seq_length"] == 96 and ref["meta"]["cp"] == cp
    assert encoder_for(fmt, cp).pad_id == ref["meta"]["pad_id"]
    rows = encoded(fmt, cp)
    assert len(rows) == len(ref["rows"]) == 2
    for out, want in zip(rows, ref["rows"]):
        assert out["tokens"].dtype == torch.int64 and out["labels"].dtype == torch.int64
        assert out["position_ids"].dtype == torch.int64 and out["loss_mask"].dtype == torch.float32
        assert out["cu_seqlens"].dtype == torch.int32
        for key in TENSORS:
            assert out[key].tolist() == want[key], key
        assert out["cu_seqlens"].tolist() == want["cu_seqlens_stripped"]
        assert out["max_seqlen"] == want["max_seqlen"]
        # the fixed-length form Megatron-LM's dataset returns: real entries, then L repeated
        fixed = out["cu_seqlens"].tolist() + [96] * (97 - out["cu_seqlens"].numel())
        assert fixed == want["cu_seqlens"]
    # row 1's second conversation overflows (in `default`'s longer template, row 0's too)
    assert [r["truncated"] for r in rows] == [fmt == "default", True]
    for r, want in zip(rows, ref["rows"]):
        if r["truncated"]:   # the last input is real, its label the pad Megatron-LM appends
            assert want["tokens"][-1] != ref["meta"]["pad_id"] and want["labels"][-1] == ref["meta"]["pad_id"]


@pytest.mark.parametrize("cp", CP_SIZES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_mtp_targets_match_megatron_core_roll(fmt, cp):
    ref = load_reference(fmt, cp)
    for out, want in zip(encoded(fmt, cp), ref["rows"]):
        assert [m["depth"] for m in want["mtp"]] == [1, 2]
        for m in want["mtp"]:
            labels, mask = roll_targets(out["labels"], out["loss_mask"], out["cu_seqlens"], m["depth"])
            assert labels.tolist() == m["labels"]
            assert mask.tolist() == m["loss_mask"]


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("fmt", FORMATS)
def test_cp_shards_match_per_document_zigzag(fmt, cp):
    ref = load_reference(fmt, cp)
    for out, want in zip(encoded(fmt, cp), ref["rows"]):
        shards = want["cp_shards"]
        assert len(shards) == cp
        for rank, shard in enumerate(shards):
            assert partition_indices(out["cu_seqlens"], cp, rank).tolist() == shard["global_index"]
            local = slice_for_cp_rank({k: out[k] for k in TENSORS}, out["cu_seqlens"], cp, rank)
            for key in TENSORS:
                assert local[key].tolist() == shard[key], (rank, key)
            for m in shard["mtp"]:
                labels, mask = roll_targets(out["labels"], out["loss_mask"], out["cu_seqlens"], m["depth"])
                rolled = slice_for_cp_rank({"l": labels, "m": mask}, out["cu_seqlens"], cp, rank)
                assert rolled["l"].tolist() == m["labels"] and rolled["m"].tolist() == m["loss_mask"]


def test_collate_builds_a_valid_packed_batch():
    rows = encoded("nemotron-h-aligned", 2)
    batch = collate_rows(rows)
    batch.validate()
    assert batch.tokens.shape == (2, 96)
    assert batch.cu_seqlens_padded[1].tolist() == batch.cu_seqlens[1].tolist()
    assert batch.num_valid_tokens == int(sum(r["loss_mask"].sum() for r in rows))
    assert batch.sample_keys[0] == ["train.jsonl.packed:1#0", "train.jsonl.packed:1#1"]
