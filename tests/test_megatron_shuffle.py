"""Seeded per-epoch shuffle of ``megatron_sft_packed`` training rows: a permutation of all rows
(``loader.seed``; ``shuffle_buffer_size: null`` keeps file order), each row once across DP ranks,
the same order with 0 and 2 workers, exact resume mid-epoch; validation stays in file order."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import DEMO_TOKENIZER
from energon_nemotron.demo.conversations import make_conversations
from energon_nemotron.loading import build_train_loader, build_val_loader
from energon_nemotron.megatron_packed import MegatronSFTPackedDataset, collate_rows
from test_megatron_dataset import enc, lines_of, packed_file  # noqa: F401  (fixtures)


@pytest.fixture(scope="module")
def rows_file(tmp_path_factory):
    """A ``.jsonl.packed`` file packed for L=512, with a blank line and one broken row (line 6)."""
    from energon_nemotron.megatron_packed import MegatronSFTPackedEncoder
    from energon_nemotron.megatron_packed.offline_pack import pack_file

    root = tmp_path_factory.mktemp("shuffle")
    raw = root / "raw.jsonl"
    raw.write_text("".join(json.dumps({"messages": c}) + "\n" for c in make_conversations(120, seed=4)))
    pack_file(raw, root / "rows.jsonl.packed", MegatronSFTPackedEncoder(DEMO_TOKENIZER, 512, "nemotron-h-aligned"),
              progress=False)
    lines = (root / "rows.jsonl.packed").read_text().splitlines()
    lines.insert(5, '{"messages": "broken"}')
    lines.insert(9, "")
    (root / "rows.jsonl.packed").write_text("\n".join(lines) + "\n")
    return root / "rows.jsonl.packed"


def config(path, workers=0, **loader):
    src = {"format": "megatron_sft_packed", "path": str(path), "seq_length": 512, "prompt_format": "nemotron-h-aligned"}
    return {"tokenizer": str(DEMO_TOKENIZER), "data": {"train": src, "validation": src},
            "loader": {"batch_size": 2, "num_workers": workers, "on_error": "skip", "seed": 3, **loader}}


def batch_lines(batches) -> list[int]:
    """The line of every row's first conversation, in batch order (padding rows left out)."""
    return [int(keys[0].split(":")[-1].split("#")[0]) for b in batches
            for keys, pad in zip(b.sample_keys, b.is_padding) if not pad]


def test_seeded_order_is_a_reproducible_permutation(packed_file, enc):
    file_order = lines_of(MegatronSFTPackedDataset(packed_file, enc))
    seeded = lines_of(MegatronSFTPackedDataset(packed_file, enc, shuffle_seed=5))
    assert seeded != file_order and sorted(seeded) == sorted(file_order)
    assert lines_of(MegatronSFTPackedDataset(packed_file, enc, shuffle_seed=5)) == seeded      # same seed
    assert lines_of(MegatronSFTPackedDataset(packed_file, enc, shuffle_seed=6)) != seeded      # another seed
    other_epoch = MegatronSFTPackedDataset(packed_file, enc, shuffle_seed=5)
    other_epoch.epoch = 1
    assert lines_of(other_epoch) != seeded and sorted(lines_of(other_epoch)) == sorted(file_order)


def test_shuffled_rows_are_the_file_rows(packed_file, enc):
    """Rows read by byte offset are the very rows of file order (blank lines in the file)."""
    by_key = {r["sample_keys"][0]: r["tokens"] for r in MegatronSFTPackedDataset(packed_file, enc)}
    shuffled = list(MegatronSFTPackedDataset(packed_file, enc, shuffle_seed=5))
    assert len(shuffled) == len(by_key)
    assert all(torch.equal(by_key[r["sample_keys"][0]], r["tokens"]) for r in shuffled)


@pytest.mark.parametrize("dp_size", [2, 3])
@pytest.mark.parametrize("workers", [0, 2])
def test_each_row_once_across_ranks(packed_file, enc, dp_size, workers):
    everything = sorted(lines_of(MegatronSFTPackedDataset(packed_file, enc)))
    seen = []
    for r in range(dp_size):
        ds = MegatronSFTPackedDataset(packed_file, enc, dp_rank=r, dp_size=dp_size, shuffle_seed=5)
        in_process = lines_of(ds)
        loader = torch.utils.data.DataLoader(ds, batch_size=1, collate_fn=collate_rows, num_workers=workers)
        assert batch_lines(loader) == in_process        # the workers keep the rank's order
        assert len(ds) == len(in_process)
        seen += in_process
    assert sorted(seen) == everything and len(seen) == len(everything)


def test_validation_rows_are_not_shuffled(packed_file, enc):
    from energon_nemotron.errors import ConfigError

    with pytest.raises(ConfigError, match="validation rows are read in file order"):
        MegatronSFTPackedDataset(packed_file, enc, validation=True, shuffle_seed=5)


def test_loader_shuffles_training_rows_with_loader_seed(rows_file):
    file_order = batch_lines(build_train_loader(config(rows_file, shuffle_buffer_size=None)))
    shuffled = batch_lines(build_train_loader(config(rows_file)))
    assert shuffled != file_order and sorted(shuffled) == sorted(file_order)
    assert batch_lines(build_train_loader(config(rows_file))) == shuffled
    assert batch_lines(build_train_loader(config(rows_file, seed=4))) != shuffled
    assert batch_lines(build_val_loader(config(rows_file))) == file_order       # validation: file order


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_mid_epoch_is_exact(rows_file, workers):
    cfg = config(rows_file, workers)
    first = build_train_loader(cfg)
    it = iter(first)
    head = [next(it) for _ in range(3)]
    state = json.loads(json.dumps(first.state_dict()))
    expected = list(it)
    assert first.skipped() == {"invalid_sample": 1}
    in_file_order = build_train_loader(config(rows_file, workers, shuffle_buffer_size=None))
    assert batch_lines(head + expected) != batch_lines(in_file_order)                    # shuffled
    second = build_train_loader(cfg)
    second.load_state_dict(state)
    got = list(second)
    assert batch_lines(got) == batch_lines(expected) and len(got) == len(expected)
    for a, b in zip(expected, got):
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.loss_mask, b.loss_mask)
        assert torch.equal(a.labels, b.labels) and a.sample_keys == b.sample_keys


def test_index_follows_a_changed_file(tmp_path, enc, packed_file):
    ds = MegatronSFTPackedDataset(packed_file, enc, shuffle_seed=5)
    n = len(lines_of(ds))
    packed_file.write_text(packed_file.read_text() + packed_file.read_text().splitlines()[0] + "\n")
    assert len(lines_of(ds)) == n + 1
