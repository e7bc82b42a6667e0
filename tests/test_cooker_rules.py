"""The ordered cooker list (``data.cookers``), matched as Energon's ``Cooker`` matches; a blend's
free-form subflavors; the loader knobs (virtual epochs, validation limit, shard read runs, worker
settings, cache pool), all on the real Energon loader."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml
from megatron.energon import Cooker

from energon_data import text_config
from energon_nemotron.cookers.selection import CookerSelection
from energon_nemotron.demo.conversations import make_conversations
from energon_nemotron.demo.datasets import prepare, shown_keys, to_schema, with_system, write_shards
from energon_nemotron.errors import ConfigError
from energon_nemotron.loading import build_train_loader, build_val_loader


def crude(folder: Path, cooker: str, n: int, subflavors: dict, seed: int = 0) -> list[str]:
    """A prepared crude dataset of ``n`` samples in ``cooker``'s schema whose subflavors are exactly
    ``subflavors`` (no ``cooker`` key: the cooker list selects); returns the keys as shown."""
    convs = make_conversations(n, seed=seed)
    samples = [(f"{folder.name}-{i:04d}", {"json": json.dumps(to_schema(cooker, [with_system(c)])).encode()})
               for i, c in enumerate(convs)]
    write_shards(folder, samples, per_shard=4)
    prepare(folder, subflavors)
    return shown_keys(folder, [k for k, _ in samples], 4)


def blend(path: Path, leaves: list[dict]) -> Path:
    path.write_text(yaml.safe_dump({"__module__": "megatron.energon", "__class__": "MetadatasetV2",
                                    "splits": {"train": {"blend_epochized": leaves}}}))
    return path


RULES = [{"name": "nemotron_conversation", "has_subflavors": {"cook": "conversation"}},
         {"name": "openai_messages", "options": {}, "has_subflavors": {"cook": "openai_messages_jsonl"}},
         {"name": "general_conversations"}]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("rules")
    keys = crude(root / "conv", "nemotron_conversation", 6, {"cook": "conversation"})
    keys += crude(root / "oai", "openai_messages", 5, {"cook": "openai_messages_jsonl"}, seed=1)
    keys += crude(root / "gen", "general_conversations", 4, {"category": "chat"}, seed=2)
    meta = blend(root / "blend.yaml", [
        {"path": "conv", "repetitions": 1, "subflavors": {"name": "c", "length": 6, "orig_length": 9, "category": "x"}},
        {"path": "oai", "repetitions": 1, "subflavors": {"name": "o", "data_augment": False, "quality": "high"}},
        {"path": "gen", "repetitions": 1}])
    return root, meta, keys


def config(meta: Path, **data) -> dict:
    cfg = text_config(meta, workers=0, packing={"algorithm": "best_fit_decreasing", "buffer_size": 8},
                      seq_length=2048)
    cfg["data"].update(data)
    return cfg


def epoch_keys(cfg) -> list[str]:
    return [k for b in build_train_loader(cfg, repeat=False) for row in b.sample_keys for k in row]


def test_rules_validated_when_built():
    with pytest.raises(ConfigError, match=r"entries \[0, 1\] have no has_subflavors; at most one"):
        CookerSelection([{"name": "openai_messages"}, {"name": "general_conversations"}])
    with pytest.raises(ConfigError, match=r"entries \[0\] have no has_subflavors; .* it must be last"):
        CookerSelection([{"name": "openai_messages"}, {"name": "general_conversations", "has_subflavors": {"a": 1}}])
    with pytest.raises(ConfigError, match=r"data.cookers\[1\].has_subflavors: the same filter as entry 0"):
        CookerSelection([{"name": "openai_messages", "has_subflavors": {"a": 1}},
                         {"name": "general_conversations", "has_subflavors": {"a": 1}}])
    with pytest.raises(ConfigError, match=r"data.cookers\[0\].name: unknown cooker 'nope'; known: "):
        CookerSelection([{"name": "nope"}])
    with pytest.raises(ConfigError, match=r"data.cookers\[0\].options: cooker 'openai_messages' takes no "
                                          r"options; got 'media_source'"):
        CookerSelection([{"name": "openai_messages", "options": {"media_source": "m"}}])
    with pytest.raises(ConfigError, match=r"empty filter matches every dataset"):
        CookerSelection([{"name": "openai_messages", "has_subflavors": {}}])
    with pytest.raises(ConfigError, match=r"the list is empty"):
        CookerSelection([])


def test_matching_equals_energon_cooker():
    """The rule a dataset gets is the first whose Energon ``Cooker`` (same filter) matches it."""
    rng = random.Random(3)
    values = [None, 0, 1, "a", "b", True, False]
    for _ in range(300):
        rules = [{"name": "openai_messages", "has_subflavors": {k: rng.choice(values) for k in rng.sample("xyz", 2)}},
                 {"name": "nemotron_conversation", "has_subflavors": {rng.choice("xyz"): rng.choice(values)}}]
        if rules[0]["has_subflavors"] == rules[1]["has_subflavors"]:
            continue
        sel = CookerSelection(rules + [{"name": "general_conversations"}])
        sub = {k: rng.choice(values) for k in rng.sample("xyzw", rng.randint(0, 4))}
        energon = [Cooker(lambda s: s, has_subflavors=r["has_subflavors"]) for r in rules]
        want = next((r["name"] for r, c in zip(rules, energon) if c.is_match(sub)), "general_conversations")
        assert sel.cooker_for(sub) == want
        assert [c.is_match(sub) for c in sel.energon_cookers()[:2]] == [c.is_match(sub) for c in energon]


def test_cooker_list_selects_by_arbitrary_subflavors(source):
    """A blend whose leaves carry NeMo-RL's ``cook:`` selector and free-form bookkeeping keys: each
    leaf is cooked by the first matching rule, every sample once."""
    _, meta, keys = source
    got = epoch_keys(config(meta, cookers=RULES, other_subflavors="allow"))
    assert sorted(got) == sorted(keys)


def test_bookkeeping_keys_pass_and_other_keys_follow_the_setting(source):
    _, meta, _ = source
    with pytest.raises(ConfigError, match=r"unknown subflavor 'quality' .*or set data.other_subflavors: allow"):
        build_train_loader(config(meta, cookers=RULES), repeat=False)


def test_data_augment_is_read_and_checked(tmp_path, source):
    """``data_augment`` is a key every cooker reads (bool): true turns on NeMo-RL's tiling
    augmentation for the dataset's images (``tests/test_augment_loader.py``), which needs image mode
    ``dynamic`` (refused by name with ``tiling``); another value is refused."""
    root, _, keys = source
    meta = blend(tmp_path / "augment.yaml", [{"path": str(root / "oai"), "repetitions": 1,
                                              "subflavors": {"cook": "openai_messages_jsonl", "data_augment": True}}])
    assert len(epoch_keys(config(meta, cookers=RULES))) > 0
    tiled = config(meta, cookers=RULES)
    tiled["task_encoder"]["options"]["image"] = {"mode": "tiling"}
    with pytest.raises(ConfigError, match=r"subflavor data_augment .* image mode dynamic; .*image.mode is 'tiling'"):
        list(build_train_loader(tiled, repeat=False))
    meta.write_text(meta.read_text().replace("data_augment: true", "data_augment: 'yes'"))
    with pytest.raises(ConfigError, match=r"subflavor 'data_augment' .* must be true or false, got 'yes'"):
        build_train_loader(config(meta, cookers=RULES), repeat=False)


def test_a_near_miss_of_a_read_key_stays_an_error(tmp_path, source):
    root, _, _ = source
    meta = blend(tmp_path / "typo.yaml", [{"path": str(root / "oai"), "repetitions": 1,
                                           "subflavors": {"skip_chat_templat": True}}])
    with pytest.raises(ConfigError, match=r"subflavor 'skip_chat_templat' .* reads 'skip_chat_template': a misspelling"):
        build_train_loader(config(meta, cookers=RULES, other_subflavors="allow"), repeat=False)


def test_no_matching_rule_names_the_dataset_and_the_filters(source):
    _, meta, _ = source
    with pytest.raises(ConfigError, match=r"gen: no entry of data.cookers matches the dataset's subflavors "
                                          r"\{'category': 'chat'\}"):
        build_train_loader(config(meta, cookers=RULES[:2], other_subflavors="allow"), repeat=False)


def test_default_cooker_and_cookers_exclude_each_other(source):
    _, meta, _ = source
    with pytest.raises(ConfigError, match=r"data.default_cooker: set either it or data.cookers"):
        build_train_loader(config(meta, cookers=RULES, default_cooker="openai_messages"), repeat=False)


def test_virtual_epoch_length_is_in_batches(source):
    _, meta, _ = source
    cfg = config(meta, cookers=RULES, other_subflavors="allow")
    cfg["data"]["train"]["virtual_epoch_length"] = 3
    loader = build_train_loader(cfg)
    it = iter(loader)
    assert len([next(it) for _ in range(3)]) == 3
    with pytest.raises(StopIteration):
        next(it)
    assert len(list(loader)) == 3                          # the next epoch: three more


def test_validation_limit_in_batches(source):
    _, meta, _ = source
    cfg = config(meta, cookers=RULES, other_subflavors="allow")
    full = len(list(build_val_loader({**cfg, "data": {**cfg["data"], "validation": {"path": str(meta)}}})))
    cfg["data"]["validation"] = {"path": str(meta), "limit": 1}
    assert full >= 2 and len(list(build_val_loader(cfg))) == 1


def test_worker_settings_and_cache_pool_reach_energon(tmp_path, source):
    _, meta, keys = source
    cfg = config(meta, cookers=RULES, other_subflavors="allow")
    cfg["loader"].update(num_workers=1, prefetch_factor=3, checkpoint_every_sec=30, watchdog_timeout_seconds=600,
                         gc_collect_every_n_steps=5, max_samples_per_sequence=2,
                         cache_pool={"max_gbytes": 0.5, "num_workers": 2, "directory": str(tmp_path / "pool")})
    loader = build_train_loader(cfg, repeat=False)
    inner = loader.inner
    chain, d = {}, inner.dataset
    while d is not None:                                  # Energon's wrappers, outermost first
        chain[type(d).__name__] = d
        d = vars(d).get("dataset") or (vars(d).get("datasets") or [None])[0]
    assert inner.prefetch_factor == 3 and chain["SavableDatasetWrapper"].checkpoint_every_sec == 30
    assert chain["WatchdogDataset"].timeout_seconds == 600 and chain["GcDataset"].every_n_iter == 5
    pool = chain["SavableDatasetWrapper"].cache_pool
    assert type(pool).__name__ == "FileStoreCachePool" and pool.num_workers == 2
    assert pool.max_cache_size == int(0.5 * 1024**3) and Path(pool.parent_cache_dir) == tmp_path / "pool"
    got = [k for b in loader for row in b.sample_keys for k in row]
    assert sorted(got) == sorted(keys)                     # shard read runs of 2: still every sample once
