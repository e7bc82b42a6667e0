"""Streaming, DP sharding and deterministic validation padding of ``MegatronSFTPackedDataset``."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch

from conftest import DEMO_TOKENIZER, write_jsonl
from energon_nemotron.demo.conversations import make_conversations
from energon_nemotron.errors import DataError
from energon_nemotron.megatron_packed import MegatronSFTPackedDataset, MegatronSFTPackedEncoder, collate_rows


@pytest.fixture(scope="module")
def enc():
    return MegatronSFTPackedEncoder(DEMO_TOKENIZER, 2048, "nemotron-h-aligned")


@pytest.fixture()
def packed_file(tmp_path):
    """11 rows (a prime, so no DP size divides it), blank lines in between."""
    convs = make_conversations(22, seed=3)
    path = tmp_path / "rows.jsonl.packed"
    with open(path, "w") as f:
        for i in range(11):
            row = [m for c in convs[2 * i:2 * i + 2] for m in ([{"role": "system", "content": ""}] + c
                                                              if c[0]["role"] != "system" else c)]
            f.write(json.dumps({"messages": row}) + "\n" + ("\n" if i % 4 == 0 else ""))
    return path


def lines_of(rows):
    return [int(r["sample_keys"][0].split(":")[-1].split("#")[0]) for r in rows]


@pytest.mark.parametrize("dp_size", [1, 2, 3, 4])
def test_train_split_rank_r_gets_rows_r_mod_dp(packed_file, enc, dp_size):
    all_lines = lines_of(MegatronSFTPackedDataset(packed_file, enc))
    assert len(all_lines) == 11
    for r in range(dp_size):
        ds = MegatronSFTPackedDataset(packed_file, enc, dp_rank=r, dp_size=dp_size)
        got = lines_of(ds)
        assert got == all_lines[r::dp_size]
        assert len(ds) == len(got)


@pytest.mark.parametrize("dp_size", [1, 2, 3, 4])
def test_validation_every_row_once_and_ranks_even(packed_file, enc, dp_size):
    per_rank = math.ceil(11 / dp_size)
    real = []
    for r in range(dp_size):
        ds = MegatronSFTPackedDataset(packed_file, enc, dp_rank=r, dp_size=dp_size, validation=True)
        rows = list(ds)
        assert len(rows) == len(ds) == per_rank
        for row in rows:
            if row["is_padding"]:
                assert float(row["loss_mask"].sum()) == 0.0
            else:
                real.append(row["sample_keys"][0])
        again = [r2["tokens"] for r2 in MegatronSFTPackedDataset(packed_file, enc, dp_rank=r, dp_size=dp_size,
                                                                  validation=True)]
        assert all(torch.equal(a["tokens"], b) for a, b in zip(rows, again))   # deterministic
    assert sorted(real) == sorted(r["sample_keys"][0] for r in MegatronSFTPackedDataset(packed_file, enc))
    assert len(real) == 11


@pytest.mark.parametrize("workers", [1, 2])
def test_dataloader_workers_keep_order(packed_file, enc, workers):
    ds = MegatronSFTPackedDataset(packed_file, enc, dp_rank=1, dp_size=2, validation=True)
    plain = [collate_rows([r]) for r in ds]
    loader = torch.utils.data.DataLoader(ds, batch_size=1, collate_fn=collate_rows, num_workers=workers)
    got = list(loader)
    assert [b.sample_keys for b in got] == [b.sample_keys for b in plain]
    assert [b.is_padding for b in got] == [b.is_padding for b in plain]
    for a, b in zip(got, plain):
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.loss_mask, b.loss_mask)


def test_streams_lazily(tmp_path, enc):
    """Only the rows consumed are parsed: a broken line far down does not stop the first rows."""
    good = {"messages": make_conversations(1, seed=1)[0]}
    path = tmp_path / "big.jsonl.packed"
    with open(path, "w") as f:
        for _ in range(500):
            f.write(json.dumps(good) + "\n")
        f.write("{not json\n")
    first = list(itertools.islice(iter(MegatronSFTPackedDataset(path, enc)), 3))
    assert len(first) == 3
    with pytest.raises(DataError, match=r"big\.jsonl\.packed:501: invalid JSON"):
        for _ in MegatronSFTPackedDataset(path, enc, dp_rank=0, dp_size=50):
            pass


def test_bad_dp_arguments(packed_file, enc):
    with pytest.raises(ValueError, match="invalid dp_rank=2 / dp_size=2"):
        MegatronSFTPackedDataset(packed_file, enc, dp_rank=2, dp_size=2)
