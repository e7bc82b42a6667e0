"""``stats``: the epoch a user budgets steps with, against one epoch of the real loader; the HTML
page rounds as the text does; the Ray engine's small-input hint (issue 27, items 7 and 8).

A ``blend_epochized`` metadataset takes a WebDataset leaf twice (``repetitions: 2``; one of its
samples is no JSON) and a JSONL leaf once. One epoch of the loader (``build_train_loader(...,
repeat=False)``, ``on_error: skip``) must yield exactly the samples the stats epoch says.
"""

from __future__ import annotations

import html
import io
import json
import math
import re
from collections import Counter
from pathlib import Path

import pytest
import yaml

from energon_data import jsonl_dataset, prepare, shown_keys, text_config, to_schema, write_shards
from energon_nemotron.demo.conversations import make_conversations
from energon_nemotron.demo.datasets import with_system
from energon_nemotron.stats import run_stats

A, B, BAD = 12, 7, 2                 # samples of leaf a (sample BAD is no JSON), of leaf b.jsonl
PACKING = {"algorithm": "first_fit_decreasing", "buffer_size": 4}


def leaf_a(folder: Path) -> list[str]:
    convs = make_conversations(A, seed=4)
    samples = []
    for i in range(A):
        body = b'{"messages": [oops' if i == BAD else json.dumps(to_schema("openai_messages", [with_system(convs[i])]))
        samples.append((f"a-{i:05d}", {"json": body if isinstance(body, bytes) else body.encode()}))
    write_shards(folder, samples, per_shard=4)
    prepare(folder, {"cooker": "openai_messages"})
    return shown_keys(folder, [k for k, _ in samples], 4)


def config(root: Path, name: str, train: Path, **loader) -> Path:
    cfg = text_config(train, workers=0, packing=PACKING, seq_length=1024)
    cfg["loader"].update({"on_error": "skip", "shuffle_buffer_size": None, **loader})
    path = root / name
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("epoch")
    keys_a = leaf_a(root / "a")
    _, keys_b = jsonl_dataset(root / "b.jsonl", B, seed=8)
    (root / "epochized.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend_epochized:\n"
        "      - {repetitions: 2, path: a}\n"
        "      - {repetitions: 1, path: b.jsonl, subflavors: {cooker: openai_messages}}\n")
    (root / "weighted.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
        "      - {weight: 2, path: a}\n      - {weight: 1, path: b.jsonl, subflavors: {cooker: openai_messages}}\n")
    return {"root": root, "keys_a": keys_a, "keys_b": keys_b,
            "epochized": config(root, "epochized_loader.yaml", root / "epochized.yaml", batch_size=2),
            "weighted": config(root, "weighted_loader.yaml", root / "weighted.yaml")}


def stats(config: Path, *args: str) -> tuple[dict, str]:
    """(the JSON result, the text report) of ``stats`` over ``config``."""
    from energon_nemotron.stats.report import render_text
    from energon_nemotron.stats.run import StatsOptions

    out = io.StringIO()
    limit = int(args[1]) if args[:1] == ("--limit",) else None
    assert run_stats(str(config), StatsOptions(limit=limit), as_json=True, progress=False, out=out) == 0
    result = json.loads(out.getvalue())
    return result, render_text(result)


def one_epoch_keys(config: Path) -> Counter:
    """The sample keys one epoch of the real loader yields (padding rows left out)."""
    from energon_nemotron.loading import build_train_loader

    keys: Counter = Counter()
    for batch in build_train_loader(str(config), repeat=False):
        for row, pad in zip(batch.sample_keys, batch.is_padding):
            if not pad:
                keys.update(row)
    return keys


def test_epoch_of_a_blend_epochized_is_one_epoch_of_the_loader(corpus):
    result, text = stats(corpus["epochized"])
    epoch = result["epoch"]
    assert result["total"]["read"] == A + B                # each leaf read once
    keys = one_epoch_keys(corpus["epochized"])
    # the loader: every good sample of a twice, of b.jsonl once; the bad one skipped both times
    good_a = [k for i, k in enumerate(corpus["keys_a"]) if i != BAD]
    assert sorted(k for k in keys if k.startswith("a/")) == sorted(good_a) and {keys[k] for k in good_a} == {2}
    assert sum(keys.values()) == 2 * (A - 1) + B
    assert (epoch["mode"], epoch["samples"], epoch["ok"], epoch["exact"]) == ("blend_epochized", 2 * A + B,
                                                                              sum(keys.values()), True)
    assert [(d["repetitions"], d["samples"]) for d in epoch["datasets"]] == [(2, 2 * A), (1, B)]
    assert epoch["extrapolated"] is False and epoch["batch_size"] == 2
    assert epoch["batches"] == math.ceil(epoch["packs"] / 2)
    want = sum(2 * d["packing"]["packs"] if Path(d["path"]).name == "a" else d["packing"]["packs"]
               for d in result["datasets"])
    assert epoch["packs"] == want
    # the text (total: each leaf read once) and the epoch line
    assert f"samples     {A + B} read" in text
    assert (f"epoch       one epoch of the blend (blend_epochized, repetitions applied) yields {2 * A + B} samples"
            f" = 2 × {A} (a) + 1 × {B} (b.jsonl)") in text
    assert f"read fine   {2 * (A - 1) + B} of them\n" in text
    assert f"steps       ≈ {want} packs at each dataset's samples per pack: ≈ {math.ceil(want / 2)} batches" in text


def test_limit_keeps_the_epoch_from_the_sizes_and_extrapolates_the_rest(corpus):
    result, text = stats(corpus["epochized"], "--limit", "4")
    epoch = result["epoch"]
    assert [d["read"] for d in result["datasets"]] == [4, 4]
    assert epoch["samples"] == 2 * A + B and epoch["extrapolated"] is True
    assert epoch["ok"] == round(2 * A * 3 / 4 + B)          # 3 of a's first 4 are fine
    assert f"yields {2 * A + B} samples" in text and f"≈ {epoch['ok']} of them (extrapolated" in text


def test_a_weighted_blend_has_no_epoch(corpus):
    result, text = stats(corpus["weighted"])
    epoch = result["epoch"]
    assert (epoch["mode"], epoch["samples"], epoch["held"]) == ("blend", None, A + B)
    assert (f"epoch       none: a weighted blend has no epoch: Energon draws from its datasets by weight, "
            f"without end (a blend_epochized with repetitions has one); its datasets hold {A + B} samples together"
            ) in text


def test_the_epoch_of_a_single_dataset_and_of_fractional_repetitions():
    from energon_nemotron.stats.epoch import epoch_rows, epoch_summary

    def dataset(n, read, ok, packs, repetitions=None, weight=None):
        return {"path": f"/d/{n}", "unit": "samples", "samples_in_split": n, "read": read, "ok": ok,
                "repetitions": repetitions, "weight": weight, "packing": {"packs": packs}}

    one = epoch_summary({"datasets": [dataset(10, 10, 9, 3)]}, split="train", batch_size=2, dp_size=2)
    assert (one["mode"], one["samples"], one["ok"], one["packs"], one["batches"]) == ("dataset", 10, 9, 3, 1)
    assert epoch_rows(one)[0] == ("epoch", "one epoch of the dataset yields 10 samples")
    half = epoch_summary({"datasets": [dataset(10, 10, 10, 4, 0.5), dataset(6, 6, 6, 2, 1)]}, split="train")
    assert (half["samples"], half["exact"], half["ok"], half["packs"]) == (11, False, 11, 4)
    assert epoch_rows(half)[0][1].startswith("one epoch of the blend (blend_epochized, repetitions applied) yields "
                                             "at most 11 samples = 0.5 × 10 (10) + 1 × 6 (6)")
    val = epoch_summary({"datasets": [dataset(10, 10, 9, 3, 2)]}, split="validation", validation_limit=5)
    assert val["samples"] == 10 and any("caps a pass at 5 batches" in n for n in val["notes"])
    rows = epoch_summary({"datasets": [{"path": "/r.jsonl.packed", "unit": "rows", "rows_in_file": 8, "read": 4,
                                        "ok": 3}]}, split="train", batch_size=4)
    assert (rows["unit"], rows["samples"], rows["ok"], rows["packs"], rows["batches"]) == ("rows", 8, 6, 6, 2)
    assert "rows are packs already: ≈ 2 batches per rank" in epoch_rows(rows)[2][1]


def test_html_rounds_as_the_text(corpus, tmp_path):
    """Every mean (lengths, media tokens) and the packing line of the page read as in the text."""
    from energon_nemotron.stats.epoch import epoch_rows
    from energon_nemotron.stats.html import render_html
    from energon_nemotron.stats.report import mean_text, packing_text

    result, text = stats(corpus["epochized"])
    page = render_html(result)
    blocks = result["datasets"] + [result["total"]]
    unrounded = 0
    for block in blocks:
        mean = block["length"]["mean"]
        unrounded += str(mean) != mean_text(mean)
        assert f"mean {mean_text(mean)} " in text
        assert f'<td class="l">mean</td><td class="">{mean_text(mean)}</td>' in page
        assert f'<td class="">{mean}</td>' not in page or str(mean) == mean_text(mean)
        assert packing_text(block["packing"]) in text and packing_text(block["packing"]) in page
    assert unrounded                           # the means are not whole to one decimal: the test tells
    assert re.search(r"\d\.\d\d samples/pack", page)
    for label, line in epoch_rows(result["epoch"]):           # the epoch: the same lines
        assert f"  {label:<11} {line}" in text and html.escape(line) in page


@pytest.mark.slow
def test_ray_on_a_small_input_says_the_single_engine_is_faster(corpus):
    import logging

    import ray

    from energon_nemotron.megatron_packed.ray_engine import SmallInputWarning
    from energon_nemotron.stats.run import StatsOptions

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    try:
        out = io.StringIO()
        with pytest.warns(SmallInputWarning) as caught:
            assert run_stats(str(corpus["epochized"]), StatsOptions(engine="ray", num_cpus=1), as_json=True,
                             progress=False, out=out) == 0
    finally:
        ray.shutdown()
    (warning,) = [w for w in caught if w.category is SmallInputWarning]
    assert str(warning.message) == (f"the input is small ({A + B} samples to read, under 5000): --engine single is "
                                    "usually faster here; Ray pays for starting its actors")
    assert json.loads(out.getvalue())["epoch"]["samples"] == 2 * A + B


def test_small_input_rule():
    from energon_nemotron.stats.ray_engine import SMALL_INPUT_SAMPLES, small_input
    from energon_nemotron.stats.records import DatasetPart

    parts = [DatasetPart({"samples_in_split": 3000}), DatasetPart({"samples_in_split": 1999})]
    assert small_input(parts, None) == ("the input is small (4999 samples to read, under 5000): --engine single is "
                                        "usually faster here; Ray pays for starting its actors")
    assert small_input(parts + [DatasetPart({"samples_in_split": 1})], None) is None
    assert small_input([DatasetPart({"samples_in_split": 10 ** 6})], 100) is not None      # --limit reads 100
    assert "4 rows" in small_input([DatasetPart({"rows_in_file": 4})], None) and SMALL_INPUT_SAMPLES == 5000
