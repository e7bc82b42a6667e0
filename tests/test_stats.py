"""``energon-nemotron stats``: every number against a direct count of the data the test wrote.

A metadataset blends a text dataset (with an invalid JSON member, an over-length sample and one
without an assistant turn), a multimodal one (images, a video and audio clips as members) and a
JSONL one (with a line that is no JSON). The expected numbers come from reading the shards back
with ``tarfile`` (members and their bytes), cooking each sample with its registered cooker and
running the loader's own task encoder on it directly (no Energon reading), and from running the
packer directly on the resulting costs.
"""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import math
import re
import tarfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import DEMO_TOKENIZER
from energon_data import energon, prepare, write_shards
from energon_nemotron.cli import main
from energon_nemotron.demo.conversations import make_conversations
from energon_nemotron.demo.datasets import multimodal_dataset, with_system

SEQ = 1024
PACKING = {"algorithm": "minimum_bin_slack", "buffer_size": 4, "pad_multiple": 8, "max_sequences_per_bin": 3,
           "carry": None}         # the packer alone, buffer by buffer (carried tails: test_stats_carry_*)
SEED = 7
KIND = {"jpg": "image", "png": "image", "mp4": "video", "wav": "audio"}
BAD = {"text-00003": "invalid_json", "text-00005": "over_length", "text-00008": "no_assistant", "3": "invalid_json"}


def messages(conv: list[dict]) -> bytes:
    return json.dumps({"messages": conv}).encode()


def build_text(folder: Path) -> None:
    convs = make_conversations(12, seed=5)
    samples = []
    for i in range(11):
        key = f"text-{i:05d}"
        if key == "text-00003":
            members = {"json": b'{"messages": [oops'}
        elif key == "text-00005":
            members = {"json": messages([{"role": "user", "content": "Repeat."},
                                         {"role": "assistant", "content": "word " * 1500}])}
        elif key == "text-00008":
            members = {"json": messages([{"role": "user", "content": "Anyone there?"}])}
        else:
            members = {"json": messages(with_system(convs[i]))}
        samples.append((key, members))
    write_shards(folder, samples, per_shard=4)
    prepare(folder, {"cooker": "openai_messages"})


def build_jsonl(path: Path) -> None:
    lines = [json.dumps({"messages": with_system(c)}) for c in make_conversations(6, seed=9)]
    lines.insert(3, '{"messages": }')
    path.write_text("\n".join(lines) + "\n")
    energon("prepare", str(path))


def loader_config(path: Path, train: Path, **options) -> Path:
    cfg = {"tokenizer": str(DEMO_TOKENIZER),
           "task_encoder": {"name": "nemotron_multimodal",
                            "options": {"prompt_format": "nemotron6", "seq_length": SEQ, "over_length": "skip",
                                        **options}},
           "packing": PACKING, "data": {"train": {"path": str(train)}, "validation": None},
           "loader": {"num_workers": 0, "seed": SEED, "on_error": "raise"}}
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("stats")
    build_text(root / "text")
    multimodal_dataset(root / "mm", 10, per_shard=4)
    build_jsonl(root / "chat.jsonl")
    (root / "mix.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
        "      - {weight: 2, path: text}\n      - {weight: 1, path: mm}\n"
        "      - {weight: 1, path: chat.jsonl, subflavors: {cooker: openai_messages}}\n")
    return root, loader_config(root / "loader.yaml", root / "mix.yaml")


def run_json(*args: str, capsys) -> dict:
    assert main(["stats", *args, "--json", "--no-progress"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def single(corpus):
    """The single-process result (CLI JSON), with phase 2 made impossible: nothing may be decoded."""
    from energon_nemotron.media import MediaHandlers
    from energon_nemotron.stats import run_stats

    def no_decode(*args, **kwargs):
        raise AssertionError("stats decoded a media item (phase 2)")

    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(MediaHandlers, "process", no_decode)
        assert run_stats(str(corpus[1]), as_json=True, progress=False, out=out) == 0
    return json.loads(out.getvalue())


# -- the direct count ------------------------------------------------------------------------------

def crude_samples(root: Path, name: str) -> list[dict]:
    """The crude samples of a dataset in dataset order: shard members grouped by key (part name ->
    bytes) or the JSONL lines (raw text)."""
    if name.endswith(".jsonl"):
        return [{"__key__": str(i), "json": line} for i, line in enumerate((root / name).read_text().splitlines())]
    samples: dict = {}
    shards = sorted((root / name / "parts").glob("data-*.tar"), key=lambda p: int(p.stem.split("-")[1]))
    for shard in shards:
        with tarfile.open(shard) as tar:
            for m in tar.getmembers():
                key, part = m.name.split(".", 1)
                samples.setdefault(key, {"__key__": key})[part] = tar.extractfile(m).read()
    return list(samples.values())


def encoders(config: Path):
    from energon_nemotron.config import load_config
    from energon_nemotron.loading import build_task_encoder

    cfg = load_config(config)
    wide = cfg.model_copy(deep=True)
    wide.task_encoder.options["seq_length"] = 1 << 20          # never over-length: the length before the policy
    return build_task_encoder(cfg), build_task_encoder(wide)


def expected(root: Path, config: Path, name: str, cooker: str) -> list[dict]:
    """Per sample in dataset order: key, code, length, tokens, cost, media [(kind, bytes, tokens)]."""
    from megatron.energon import SkipSample

    from energon_nemotron.errors import DataError
    from energon_nemotron.registry import COOKERS

    enc, wide = encoders(config)
    out = []
    for crude in crude_samples(root, name):
        key = crude["__key__"]
        row = {"key": key, "code": None, "length": None, "tokens": None, "cost": None, "media": []}
        if BAD.get(key) == "invalid_json":
            out.append({**row, "code": "invalid_json"})
            continue
        payload = {k: (json.loads(v) if name.endswith(".jsonl") else v) for k, v in crude.items() if k != "__key__"}
        sample = {"__key__": key, "__restore_key__": (), "__subflavors__": {"cooker": cooker}, **payload}
        try:
            conv = COOKERS.get(cooker)(sample)
        except Exception as e:
            assert BAD.get(key) == getattr(e, "code", None), (key, e)
            out.append({**row, "code": e.code})
            continue
        measured = wide.preencode_sample(conv)
        row["length"] = sum(math.ceil(len(s.tokens) / 8) * 8 for s in measured.sources)
        row["tokens"] = sum(len(s.tokens) for s in measured.sources)
        row["media"] = [(p.modality, len(ref.payload), p.num_tokens)
                        for ref, p in zip(measured.media, measured.media_plans)]
        try:
            row["cost"] = enc.preencode_sample(conv).cost
        except (SkipSample, DataError) as e:   # the written one, and the longest videos of the multimodal set
            row["code"] = getattr(e, "code", "over_length")
            assert row["code"] == "over_length"
        assert row["code"] == BAD.get(key, row["code"]), key
        out.append(row)
    return out


def check_block(block: dict, rows: list[dict]) -> None:
    """Every number of a dataset's (or the total's) block against the direct count ``rows``."""
    assert block["unit"] == "samples" and block["read"] == len(rows)
    assert block["ok"] == sum(1 for r in rows if r["code"] is None)
    codes: dict = {}
    for r in rows:
        if r["code"]:
            codes[r["code"]] = codes.get(r["code"], 0) + 1
    assert block["skipped"] == codes and set(block["skip_examples"]) == set(codes)
    lengths = [r["length"] for r in rows if r["length"] is not None]
    length = block["length"]
    assert length["count"] == len(lengths) and length["total"] == sum(lengths)
    assert (length["min"], length["max"]) == (min(lengths), max(lengths))
    assert length["mean"] == pytest.approx(np.mean(lengths))
    for p in (50, 90, 99):
        assert length[f"p{p}"] == int(np.percentile(lengths, p, method="inverted_cdf"))
    over = sum(1 for v in lengths if v > SEQ)
    assert length["over_seq_length"] == {"count": over, "share": pytest.approx(over / len(lengths))}
    width = math.ceil(max(SEQ, max(lengths)) / 20)
    edges = [width * i for i in range(21)]
    assert length["histogram"] == {"edges": edges, "counts": np.histogram(lengths, bins=edges)[0].tolist()}
    assert block["tokens"] == sum(r["tokens"] for r in rows if r["tokens"] is not None)
    media: dict = {}
    for r in rows:
        if r["length"] is not None:
            for kind, nbytes, ntokens in r["media"]:
                media.setdefault(kind, []).append((nbytes, ntokens))
    assert set(block["media"]) == set(media)
    for kind, items in media.items():
        m, sizes, toks = block["media"][kind], [b for b, _ in items], [t for _, t in items]
        assert m["count"] == len(items)
        assert m["bytes"] == {"total": sum(sizes), "mean": pytest.approx(np.mean(sizes)), "max": max(sizes)}
        assert m["planned_tokens"] == {"total": sum(toks), "mean": pytest.approx(np.mean(toks)), "max": max(toks)}


def direct_packing(rows: list[dict]) -> tuple[int, float]:
    """(packs, fill) of the packer run directly over consecutive buffers of the costs."""
    from energon_nemotron.packing import fill_ratio
    from energon_nemotron.registry import PACKERS

    packer = PACKERS.get(PACKING["algorithm"])
    ok = [r for r in rows if r["cost"] is not None]
    packs, filled = 0, 0.0
    for start in range(0, len(ok), PACKING["buffer_size"]):
        buf = ok[start:start + PACKING["buffer_size"]]
        costs = [r["cost"] for r in buf]
        bins = packer(costs, SEQ, max_sequences_per_bin=PACKING["max_sequences_per_bin"],
                      seed=zlib.crc32("\0".join(r["key"] for r in buf).encode()) ^ SEED)
        assert sorted(i for b in bins for i in b) == list(range(len(buf)))
        assert all(len(b) <= PACKING["max_sequences_per_bin"] for b in bins)
        packs += len(bins)
        filled += fill_ratio(costs, bins, SEQ) * len(bins)
    return packs, filled / packs


DATASETS = [("text", "openai_messages", 0.5), ("mm", "general_conversations", 0.25),
            ("chat.jsonl", "openai_messages", 0.25)]


def test_every_number_matches_a_direct_count(corpus, single):
    root, config = corpus
    assert [Path(d["path"]).name for d in single["datasets"]] == [n for n, _, _ in DATASETS]
    assert single["seq_length"] == SEQ and single["split"] == "train" and single["engine"] == "single"
    everything = []
    packs_total = tokens_total = 0
    for d, (name, cooker, weight) in zip(single["datasets"], DATASETS):
        rows = expected(root, config, name, cooker)
        assert d["weight"] == pytest.approx(weight) and d["cooker"] == cooker
        assert d["subflavors"] == {"cooker": cooker} and d["samples_in_split"] == len(rows)
        check_block(d, rows)
        packs, fill = direct_packing(rows)
        p = d["packing"]
        assert (p["algorithm"], p["buffer_size"], p["pad_multiple"]) == ("minimum_bin_slack", 4, 8)
        assert p["packs"] == packs and p["fill_ratio"] == pytest.approx(fill, abs=1e-6)
        assert p["samples"] == sum(1 for r in rows if r["cost"] is not None)
        everything += rows
        packs_total += packs
        tokens_total += p["tokens"]
    check_block(single["total"], everything)
    assert single["total"]["packing"]["packs"] == packs_total
    assert single["total"]["packing"]["fill_ratio"] == pytest.approx(tokens_total / (packs_total * SEQ), abs=1e-6)
    # the multimodal dataset holds every kind; its member bytes are the WebDataset members'
    mm = single["datasets"][1]["media"]
    assert set(mm) == {"image", "video", "audio"}
    members = [(KIND[part.rsplit(".", 1)[-1]], len(data)) for s in crude_samples(root, "mm")
               for part, data in s.items() if part.rsplit(".", 1)[-1] in KIND]
    for kind in mm:
        assert mm[kind]["bytes"]["total"] == sum(n for k, n in members if k == kind)
    # the over-length sample is measured (its length is in the histogram), then dropped
    text = single["datasets"][0]
    assert text["length"]["over_seq_length"]["count"] == 1 and "text-00005" in text["skip_examples"]["over_length"][0]


def test_every_sample_is_read_once_over_the_ranks(corpus, rows_config):
    """Energon's own sharding (WorkerConfig(rank=r, world_size=N)) and the rows of a Megatron-LM
    file, as the Ray actors read them: the ranks' parts, merged, are the single reader's records,
    also under a limit."""
    from energon_nemotron.config import load_config
    from energon_nemotron.stats.collect import collect_part
    from energon_nemotron.stats.records import merge_parts

    cfg = load_config(corpus[1])
    whole = collect_part(cfg, "train", 0, 1)
    ranks = [collect_part(cfg, "train", r, 3) for r in range(3)]
    for i, part in enumerate(whole):
        keys = sorted(rec.key for rank in ranks for rec in rank[i].records)
        assert keys == sorted(rec.key for rec in part.records)
        assert all(rank[i].records for rank in ranks)            # every rank got a part of every dataset
    assert [r.index for r in whole[0].records] == list(range(11))   # read in dataset order
    assert [p.records for p in merge_parts(ranks)] == [p.records for p in whole]
    first = [collect_part(cfg, "train", r, 3, limit=4) for r in range(3)]
    assert [p.records for p in merge_parts(first, 4)] == [p.records[:4] for p in whole]
    rows = load_config(rows_config[0])
    whole = collect_part(rows, "train", 0, 1)
    for world in (2, 4):
        parts = [collect_part(rows, "train", r, world) for r in range(world)]
        assert [p.records for p in merge_parts(parts)] == [p.records for p in whole]
    assert [r.code for r in whole[0].records] == [None, None, None, "invalid_json", None, None]


def test_limit_reads_the_first_samples_of_each_dataset(corpus, single, capsys):
    limited = run_json(str(corpus[1]), "--limit", "4", capsys=capsys)
    assert limited["limit"] == 4
    root, config = corpus
    for d, (name, cooker, _) in zip(limited["datasets"], DATASETS):
        assert d["read"] == 4
        check_block(d, expected(root, config, name, cooker)[:4])
    assert limited["datasets"][0]["skipped"] == {"invalid_json": 1}


def test_text_and_html_outputs(corpus, single, tmp_path, capsys):
    page = tmp_path / "stats.html"
    assert main(["stats", str(corpus[1]), "--html", str(page), "--no-progress"]) == 0
    text = capsys.readouterr().out
    for d in single["datasets"]:
        assert f"] {d['path']}" in text
    assert "samples     11 read, 8 ok, 3 skipped: invalid_json 1, no_assistant 1, over_length 1" in text
    assert "over 1024" in text and "minimum_bin_slack (buffer 4, pad_multiple 8, max 3 per pack)" in text
    assert re.search(r"image +6 ", text) and "[total] 3 datasets" in text
    from PIL import Image

    doc = page.read_text()
    images = re.findall(r'<img alt="[^"]*" src="data:image/png;base64,([^"]+)">', doc)
    assert len(images) == len(single["datasets"]) + 1 == doc.count("<img")
    for data in images:
        img = Image.open(io.BytesIO(base64.b64decode(data)))
        img.load()
        assert img.format == "PNG" and img.size[0] > 100
    assert "<script" not in doc and "http" not in doc


def test_over_length_error_and_no_packing(corpus, capsys, tmp_path):
    """over_length: error under on_error: raise still never stops: counted, with its length; without
    packing the report says so and the fill is one sample per row."""
    root, _ = corpus
    config = loader_config(tmp_path / "text.yaml", root / "text", over_length="error")
    data = yaml.safe_load(config.read_text())
    data["packing"] = None
    config.write_text(yaml.safe_dump(data))
    result = run_json(str(config), capsys=capsys)
    (d,) = result["datasets"]
    assert d["weight"] is None and d["skipped"] == {"invalid_json": 1, "no_assistant": 1, "over_length": 1}
    assert d["length"]["over_seq_length"]["count"] == 1 and d["length"]["max"] > SEQ
    p = d["packing"]
    costs = [r["cost"] for r in expected(root, config, "text", "openai_messages") if r["cost"] is not None]
    assert p["algorithm"] is None and "no packing configured" in p["note"] and p["packs"] == len(costs)
    assert p["fill_ratio"] == pytest.approx(sum(costs) / (len(costs) * SEQ), abs=1e-6)


def test_missing_validation_split_exits_2(corpus, capsys):
    assert main(["stats", str(corpus[1]), "--split", "validation", "--no-progress"]) == 2
    assert "data.validation is not set" in capsys.readouterr().err


@pytest.fixture(scope="module")
def rows_config(tmp_path_factory):
    """A Megatron-LM offline-packed file: rows of 1-3 conversations, a truncated row, a blank line
    and a row that is no JSON."""
    root = tmp_path_factory.mktemp("rows")
    convs = make_conversations(12, seed=3)
    convs = [c if c[0]["role"] == "system" else [{"role": "system", "content": ""}] + c for c in convs]
    rows = [json.dumps({"messages": [m for c in convs[a:b] for m in c]}) for a, b in ((0, 1), (1, 3), (3, 6), (6, 8))]
    long = [{"role": "system", "content": ""}, {"role": "user", "content": "Go on.\n"},
            {"role": "assistant", "content": "word " * 1100 + "\n"}]
    rows.insert(2, json.dumps({"messages": convs[8] + long + convs[9]}))
    rows.insert(3, "")
    rows.insert(4, '{"messages": [oops')
    (root / "train.jsonl.packed").write_text("\n".join(rows) + "\n")
    cfg = {"tokenizer": str(DEMO_TOKENIZER), "loader": {"num_workers": 0},
           "data": {"train": {"format": "megatron_sft_packed", "path": str(root / "train.jsonl.packed"),
                              "seq_length": 1024, "prompt_format": "identity"}}}
    (root / "loader.yaml").write_text(yaml.safe_dump(cfg))
    return root / "loader.yaml", [json.loads(r) if r.startswith('{"messages": [{') else r for r in rows if r]


def test_megatron_rows(rows_config, capsys):
    from energon_nemotron.megatron_packed import MegatronSFTPackedEncoder

    config, rows = rows_config
    result = run_json(str(config), capsys=capsys)
    enc = MegatronSFTPackedEncoder(str(DEMO_TOKENIZER), 1024, prompt_format="identity")
    good = [r for r in rows if isinstance(r, dict)]
    lengths, convs, truncated, dropped = [], [], 0, 0
    for row in good:
        cs = enc.conversations(row)
        lengths.append(sum(enc.conversation_costs(cs, [None] * len(cs))))
        convs.append(len(cs))
        out = enc.encode(row)
        truncated += out["truncated"]
        dropped += out["dropped_conversations"]
    (d,) = result["datasets"]
    assert d["format"] == "megatron_sft_packed" and d["rows_in_file"] == len(rows) == 6
    assert (d["unit"], d["read"], d["ok"], d["skipped"]) == ("rows", 6, 5, {"invalid_json": 1})
    assert ":5:" in d["skip_examples"]["invalid_json"][0]          # the file's line 5 (after the blank line)
    assert d["conversations"]["total"] == sum(convs) and d["conversations"]["per_row_max"] == max(convs)
    assert d["conversations"]["rows_by_count"] == {str(k): convs.count(k) for k in sorted(set(convs))}
    assert d["length"]["count"] == 5 and d["length"]["total"] == sum(lengths) and d["length"]["max"] == max(lengths)
    assert d["length"]["p50"] == int(np.percentile(lengths, 50, method="inverted_cdf"))
    assert truncated == 1 and d["truncated"] == {"count": 1, "share": pytest.approx(1 / 5)}
    assert d["length"]["over_seq_length"]["count"] == 1 and d["dropped_conversations"] == dropped >= 1
    assert result["total"]["read"] == 6
    limited = run_json(str(config), "--limit", "3", capsys=capsys)
    assert limited["datasets"][0]["read"] == 3 and limited["datasets"][0]["truncated"]["count"] == 1


def test_ray_engine_gives_the_same_numbers(corpus, single, capsys):
    if importlib.util.find_spec("ray") is None:
        pytest.fail("Ray Data is not installed: pip install 'energon-nemotron[ray]' (make test does)", pytrace=False)
    import ray
    import logging

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    try:
        on_ray = run_json(str(corpus[1]), "--engine", "ray", "--num-cpus", "2", capsys=capsys)
        assert (on_ray.pop("engine"), on_ray.pop("readers")) == ("ray", 2)
        assert on_ray == {k: v for k, v in single.items() if k not in ("engine", "readers")}
        assert ray.is_initialized()                 # a session the command did not start stays up
    finally:
        ray.shutdown()


def test_pack_fill_packs_as_the_encoder_does_with_the_delta():
    """``stats`` hands the packer what the encoder hands it (``packing.spec.packer_options``):
    balanced_greedy_knapsack's extra bins (``balanced_knapsack_delta``) count in its pack total."""
    from energon_nemotron.config import PackingConfig
    from energon_nemotron.packing.spec import packer_options
    from energon_nemotron.registry import PACKERS
    from energon_nemotron.stats.aggregate import pack_fill
    from energon_nemotron.stats.records import SampleRecord

    costs = [30, 50, 20, 70, 10, 40, 60, 25]
    records = [SampleRecord(i, f"k{i}", length=c, tokens=c, cost=c) for i, c in enumerate(costs)]
    for delta in (None, 0, 5):
        packing = PackingConfig(algorithm="balanced_greedy_knapsack", buffer_size=8, balanced_knapsack_delta=delta)
        want = PACKERS.get("balanced_greedy_knapsack")(costs, 100, seed=zlib.crc32("\0".join(
            r.key for r in records).encode()) ^ 3, **packer_options(packing, [0] * 8))
        got = pack_fill(records, 100, packing, seed=3)
        assert got["packs"] == len(want) and got["balanced_knapsack_delta"] == delta
    assert pack_fill(records, 100, PackingConfig(algorithm="balanced_greedy_knapsack", buffer_size=8,
                                                 balanced_knapsack_delta=5), 3)["packs"] > \
        pack_fill(records, 100, PackingConfig(algorithm="balanced_greedy_knapsack", buffer_size=8), 3)["packs"]


def test_stats_carry_packs_as_many_packs_as_the_loader(tmp_path):
    """With carried tails (the default ``packing.carry``), ``stats`` counts the packs the loader
    makes: one pass over a text dataset read in order (no shuffle buffer, one rank, no workers),
    the stats' pack count and fill against the loader's own telemetry; and fewer packs than the
    packer alone, buffer by buffer."""
    from energon_data import text_config
    from energon_nemotron.demo.datasets import text_dataset
    from energon_nemotron.loading import build_train_loader
    from energon_nemotron.stats import collect_stats

    text_dataset(tmp_path / "t", "general_conversations", 60, seed=8, per_shard=12)
    packing = {"algorithm": "minimum_bin_slack", "buffer_size": 8}
    config = text_config(tmp_path / "t", workers=0, packing=packing, seq_length=1024, shuffle_buffer_size=None)
    loader = build_train_loader(config, repeat=False)
    for _ in loader:
        pass
    t = loader.telemetry()
    got = collect_stats(config)["datasets"][0]["packing"]
    assert t["carried"] > 0 and got["carry"] == {"min_fill": 0.99, "max_times": 4}
    assert got["packs"] == t["packs"] and got["fill_ratio"] == pytest.approx(t["fill_ratio"], abs=1e-6)
    alone = collect_stats({**config, "packing": {**packing, "carry": None}})["datasets"][0]["packing"]
    assert alone["packs"] > got["packs"]
