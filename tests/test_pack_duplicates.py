"""A pack never holds the same source sample twice: with a dataset smaller than a worker's share of
the packing buffer, a repeating loader fills the buffer with several reads of each sample, and the
packer must not put two of them into one pack. Such a configuration is warned about once."""

from __future__ import annotations

import warnings
from collections import Counter

import pytest

from energon_data import text_config
from energon_nemotron.demo.datasets import text_dataset
from energon_nemotron.packing import BufferOverDataWarning
from energon_nemotron.loading import build_train_loader


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    text_dataset(root / "t", "general_conversations", 5, seed=4, per_shard=3)
    text_dataset(root / "j", "general_conversations", 3, seed=5, per_shard=3)
    (root / "mix.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
        "      - {weight: 1, path: t}\n      - {weight: 1, path: j}\n")
    return root


def cfg(root, path, workers, buffer):
    return text_config(root / path, workers=workers, seq_length=8192,
                       packing={"algorithm": "first_fit_shuffle", "buffer_size": buffer})


@pytest.mark.parametrize("workers, path", [(0, "t"), (2, "t"), (0, "mix.yaml")])
def test_no_pack_holds_a_sample_twice(tiny, workers, path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = build_train_loader(cfg(tiny, path, workers, 16))
    over = [w for w in caught if issubclass(w.category, BufferOverDataWarning)]
    assert len(over) == 1 and "packing.buffer_size 16" in str(over[0].message)
    packs = 0
    for _, batch in zip(range(12), loader):
        for row in batch.sample_keys:
            assert len(row) == len(set(row)), f"a pack holds a sample twice: {row}"
            packs += 1
    assert packs == 12
    # the seq_length fits every sample of the small dataset, so the packer would have wanted them together
    assert max(len(r) for r in batch.sample_keys) >= 2


def test_a_buffer_within_the_share_is_not_warned_about(tiny):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = build_train_loader(cfg(tiny, "t", 0, 4))
    assert not [w for w in caught if issubclass(w.category, BufferOverDataWarning)]
    counts = Counter()
    for _, batch in zip(range(6), loader):
        for row in batch.sample_keys:
            assert len(row) == len(set(row))
            counts.update(row)
    assert counts


def test_separate_repeats_keeps_every_item_once_within_budgets():
    import random

    from energon_nemotron.packing import separate_repeats
    from energon_nemotron.registry import PACKERS

    rng = random.Random(0)
    for trial in range(200):
        n = rng.randint(1, 40)
        ids = [rng.randint(0, max(1, n // 3)) for _ in range(n)]           # many repeated reads
        sizes = [rng.randint(1, 100) for _ in range(n)]
        patches = [rng.randint(0, 50) for _ in range(n)]
        cap, most = 250, rng.choice([None, 3])
        bins = PACKERS.get("first_fit_shuffle")(sizes, cap, max_sequences_per_bin=most, seed=trial)
        out = separate_repeats(bins, ids, sizes, cap, most, secondary=patches, secondary_capacity=120)
        assert sorted(i for b in out for i in b) == list(range(n))
        for b in out:
            assert len({ids[i] for i in b}) == len(b)
            assert sum(sizes[i] for i in b) <= cap and (most is None or len(b) <= most)
            received = not any(set(b) <= set(c) for c in bins)            # a bin that took a moved read
            assert not received or len(b) == 1 or sum(patches[i] for i in b) <= 120
    distinct = [[0, 1], [2]]
    assert separate_repeats(distinct, ["a", "b", "c"], [1, 1, 1], 10) is distinct
