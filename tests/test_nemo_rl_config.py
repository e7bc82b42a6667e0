"""A NeMo-RL SFT v2 master config, as NeMo-RL's users write it, builds the library's loader: both
shapes, every key honoured or refused by name, interpolations resolved, NeMo-RL's batches and its
checkpoint envelope, end to end on a generated blend with 0 and 2 workers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from conftest import DEMO_TOKENIZER
from energon_data import energon, write_shards, prepare
from energon_nemotron.demo.media import make_image
from energon_nemotron.errors import ConfigError
from energon_nemotron.integrations.nemo_rl.config import from_nemo_rl
from energon_nemotron.integrations.nemo_rl.interpolation import resolve
from energon_nemotron.integrations.nemo_rl.walk import leaves

DOCS = Path(__file__).resolve().parents[1] / "docs"
#: the shape-B config of the docs page ("Coming from NeMo-RL"), as NeMo-RL's sft_v2_tests write it
SHAPE_B = DOCS / "nemo_rl" / "shape_b.yaml"
SHAPE_A = DOCS / "nemo_rl" / "shape_a.yaml"


def master(path: Path, **paths) -> dict:
    cfg = yaml.safe_load(path.read_text())
    for dotted, value in paths.items():
        node = cfg
        *head, last = dotted.split("__")
        for part in head:
            node = node[part]
        node[last] = value
    return cfg


# -- data: a blend as NeMo-RL's production configs point at ------------------------------------------
def conversation(i: int, image: bool) -> dict:
    user = ["Describe this: ", {"t": "image", "value": f"pics/p{i}.png"}] if image else [f"Question {i}: why?"]
    return {"conversation": [{"sender": "user", "fragments": user},
                             {"sender": "assistant", "fragments": [f"Because {i} " + "word " * (i % 7)]}]}


@pytest.fixture(scope="module")
def blend(tmp_path_factory):
    """``blend.yaml`` (MetadatasetV2, blend_epochized): a JSONL leaf of image conversations whose
    media come from an aux source named ``media_source`` (NeMo-RL's fragments schema, ``cook:
    conversation``), a tar leaf of its general-conversations schema with image members (``cook:
    general_conversations_webdataset``) and a tar leaf of text conversations (``cook:
    conversation``), beside free-form subflavors."""
    root = tmp_path_factory.mktemp("nemo_rl_blend")
    (root / "media" / "pics").mkdir(parents=True)
    for i in range(8):
        (root / "media" / "pics" / f"p{i}.png").write_bytes(make_image(64 + 16 * (i % 3), 48, seed=i))
    jsonl = root / "vqa.jsonl"
    jsonl.write_text("".join(json.dumps(conversation(i, True)) + "\n" for i in range(8)))
    energon("prepare", str(jsonl))
    write_shards(root / "general", [(f"g{i:03d}", {"json": json.dumps({"conversations": [     # NeMo-RL's schema
        {"from": "human", "value": f"<image>\nWhat is in picture {i}?"}, {"from": "gpt", "value": f"Shape {i}."}],
        "image": f"g{i:03d}.png"}).encode(), "png": make_image(48, 64, seed=20 + i)}) for i in range(6)], per_shard=3)
    prepare(root / "general", {"cook": "general_conversations_webdataset"})
    write_shards(root / "text", [(f"t{i:03d}", {"json": json.dumps(conversation(i, False)).encode()})
                                 for i in range(12)], per_shard=4)
    prepare(root / "text", {"cook": "conversation"})
    (root / "blend.yaml").write_text(yaml.safe_dump({
        "__module__": "megatron.energon", "__class__": "MetadatasetV2",
        "splits": {"train": {"blend_epochized": [
            {"path": "vqa.jsonl", "repetitions": 1, "aux": {"media_source": "filesystem://media"},
             "subflavors": {"cook": "conversation", "name": "vqa", "length": 8, "orig_length": 9,
                            "category": "image", "data_augment": False}},
            {"path": "general", "repetitions": 1, "subflavors": {"name": "general", "category": "image"}},
            {"path": "text", "repetitions": 2, "subflavors": {"name": "text", "category": "chat"}}]}}}))
    return root


def shape_b(blend: Path, workers: int = 0, **extra) -> dict:
    """The docs' shape-B config over ``blend``; without the cache pool (Energon's pool makes a folder
    in the system's temporary folder per loader and leaves it: ``test_cooker_rules`` covers it)."""
    cfg = master(SHAPE_B, data__train__path=str(blend / "blend.yaml"))
    for key in ("cache_pool_max_gbytes", "cache_pool_num_workers"):
        cfg["data"]["energon"].pop(key)
    cfg["data"]["energon"].update({"num_workers": workers, "nvdataset_cache_dir": None, **extra})
    return cfg


# -- the walk: every key has a status ----------------------------------------------------------------
def test_every_key_of_both_shapes_is_honoured_or_the_trainers(blend):
    for path in (SHAPE_A, SHAPE_B):
        raw = master(path, data__train__path=str(blend / "blend.yaml"))
        raw["data"]["energon"]["nvdataset_cache_dir"] = None
        made = from_nemo_rl(raw, tokenizer=DEMO_TOKENIZER, dp_size=2)
        keys = [k for block in ("data", "policy", "sft") for k in leaves(raw[block], block)]
        assert set(keys) <= set(made.report), sorted(set(keys) - set(made.report))
        assert all(made.report[k].startswith(("honoured:", "trainer:")) for k in keys)
        assert made.loader.loader.batch_size == raw["policy"]["train_global_batch_size"] // 2
    assert from_nemo_rl(master(SHAPE_A), tokenizer=DEMO_TOKENIZER).shape == "A"


def test_shape_a_packing_comes_from_the_policy():
    made = from_nemo_rl(master(SHAPE_A), tokenizer=DEMO_TOKENIZER)
    p = made.loader.packing
    assert (p.algorithm, p.buffer_size, p.max_sequences_per_bin, p.pad_multiple) == \
        ("balanced_greedy_knapsack", 64, 16, 64)


def test_shape_b_packing_and_options(blend):
    made = from_nemo_rl(shape_b(blend), tokenizer=DEMO_TOKENIZER)
    p, o = made.loader.packing, made.loader.task_encoder.options
    assert made.shape == "B"
    assert (p.algorithm, p.buffer_size, p.pad_multiple, p.balanced_knapsack_delta) == \
        ("balanced_greedy_knapsack", 16, 64, 5)
    assert o["seq_length"] == 4096 and o["prompt_format"] == "nemotron6-moe"
    assert o["thinking_trace_format"] == "ultra" and o["video"]["max_frames"] == 64
    # production's augmentation, as written: NeMo-RL's frame selection, a scale up to 4 on the resolution
    assert {k: o["video"][k] for k in ("sampling", "augment_frames_up", "augment_resolution_up",
                                       "augment_resolution_only", "temporal_jitter")} == \
        {"sampling": "nemo_rl", "augment_frames_up": 4, "augment_resolution_up": None,
         "augment_resolution_only": True, "temporal_jitter": False}
    assert o["image"]["tiling_augment_prob"] == 0.4
    assert [c.name for c in made.loader.data.cookers][:2] == ["nemotron_conversation",
                                                            "nemotron_general_conversations_jsonl"]


@pytest.mark.parametrize("key, value, message", [
    ("video_aug_scale_frames_up", 0, r"task_encoder.options.video.augment_frames_up: must be > 0, got 0"),
    ("video_max_num_frames", 63, r"sampling nemo_rl needs min_frames >= temporal_patch and max_frames a multiple"),
])
def test_the_augmentation_is_checked_as_nemo_rl_checks_it(blend, key, value, message):
    """NeMo-RL's own checks of its video options (a scale of at least 1, a frame cap that is a multiple
    of the temporal patch) hold when the encoder is built from the mapped config."""
    from energon_nemotron.loading import build_task_encoder

    cfg = shape_b(blend)
    cfg["data"]["energon"]["task_encoder"]["options"][key] = value
    with pytest.raises(ConfigError, match=message):
        build_task_encoder(from_nemo_rl(cfg, tokenizer=DEMO_TOKENIZER).loader)


# -- refusals name the key and the reason -------------------------------------------------------------
REFUSED = [
    ("data__backend", "hf", r"data.backend: 'hf': SFT v2's Energon loader needs energon"),
    ("data__energon__model_family", "qwen", r"data.energon.model_family: qwen: this library's encoder is Nemotron's"),
    ("data__add_bos", True, r"data.add_bos: must be false"),
    ("data__shuffle", False, r"data.shuffle: NeMo-RL's Energon training requires shuffle: true"),
    ("data__energon__packing_buffer_size", 8, r"packing_buffer_size: set together with task_encoder.packing"),
    ("data__energon__task_encoder__packing__name", "first_fit_decreasing",
     r"balanced_knapsack_delta: applies to balanced_greedy_knapsack only"),
    ("data__energon__task_encoder__packing__options__max_sequence_length", 2048,
     r"max_sequence_length: 2048 differs from data.max_input_seq_length 4096"),
    ("policy__train_global_batch_size", 3, r"3 does not divide by the DP size 2"),
    ("policy__sequence_packing__enabled", False, r"policy.sequence_packing.enabled: must be true"),
    ("policy__dynamic_batching__enabled", True, r"dynamic_batching.enabled: must be false"),
    ("data__train__path", "s3://bucket/blend.yaml", r"scheme s3:// is not read here"),
    ("data__train__path", "dss://corpus@v0/blend.yaml", r"is a dss:// path; .*nvdataset_cache_dir, which is not set"),
    ("data__energon__task_encoder__name", "generic_sft", r"task_encoder.name: 'generic_sft': this library serves"),
    ("data__energon__task_encoder__options__patch_size", 16, r"options.patch_size: not an option of NeMo-RL's"),
    ("data__energon__shufle_buffer_size", 10, r"key\(s\) of NeMo-RL's Energon data block this adapter does not "
                                              r"know: data.energon.shufle_buffer_size"),
    ("data__train__limit", 3, r"data.train.limit: limit caps a validation pass"),
    ("policy__megatron_cfg__env_vars", {"NRL_MEDIA_PREPROCESSING_MODE": "raw"}, r"'raw': the nemo_rl_packed output"),
    ("policy__max_total_sequence_length", 8192, r"policy.max_total_sequence_length: 8192 differs"),
]


@pytest.mark.parametrize("key, value, message", REFUSED, ids=[r[0] + "=" + str(r[1]) for r in REFUSED])
def test_refusals_name_the_key_and_why(blend, key, value, message):
    cfg = shape_b(blend)
    node = cfg
    *head, last = key.split("__")
    for part in head:
        node = node[part]
    node[last] = value
    if key == "policy__max_total_sequence_length":          # the config's interpolations follow it
        cfg["data"]["max_input_seq_length"] = 4096
        cfg["data"]["energon"]["task_encoder"]["packing"]["options"]["max_sequence_length"] = 4096
    with pytest.raises(ConfigError, match=message):
        from_nemo_rl(cfg, tokenizer=DEMO_TOKENIZER, dp_size=2)


def test_file_backed_components_are_refused(blend):
    cfg = shape_b(blend)
    cfg["data"]["energon"]["cookers"][0] = {"python_file": "/x/cook.py", "object_name": "cook"}
    with pytest.raises(ConfigError, match=r"cookers\[0\].python_file: file-backed cookers are not loaded"):
        from_nemo_rl(cfg, tokenizer=DEMO_TOKENIZER)


@pytest.mark.parametrize("rule, message", [
    ({"name": "no_such_cooker"}, r"data\.energon\.cookers\[0\]\.name: unknown cooker 'no_such_cooker'; known: "),
    ({"name": "nemotron_conversation", "options": {"no_such_option": 1}},
     r"data\.energon\.cookers\[0\]\.options: cooker 'nemotron_conversation' takes .*; got 'no_such_option'"),
], ids=["unknown name", "unknown option"])
def test_cooker_list_refusals_name_the_users_key_and_file(blend, tmp_path, rule, message):
    """Issue 46 item 5: a cooker the list cannot select is refused by from_nemo_rl itself, naming the
    key as the user wrote it (``data.energon.cookers``, not the translated ``data.cookers``) and the
    config file, as every other NeMo-RL message does."""
    cfg = shape_b(blend)
    cfg["data"]["energon"]["cookers"][0] = {**cfg["data"]["energon"]["cookers"][0], **rule}
    path = tmp_path / "sft_v2.yaml"
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError, match=re.escape(str(path)) + ": " + message) as caught:
        from_nemo_rl(path, tokenizer=DEMO_TOKENIZER)
    assert "data.cookers" not in str(caught.value) and "\n" not in str(caught.value)


def test_an_option_the_user_did_not_write_is_not_refused(blend, tmp_path):
    """Issue 46 item 6: ``prompt_format: nemotron6`` (a format without thinking-trace options) and
    no ``thinking_trace_format``, written to a file as a user writes it, builds the loader's encoder;
    the adapter fills in no option the user did not write. One the user did write, and the format
    does not take, is refused by its key as written and the file."""
    from energon_nemotron.loading import build_task_encoder

    cfg = shape_b(blend)
    options = cfg["data"]["energon"]["task_encoder"]["options"]
    options["prompt_format"] = "nemotron6"
    written = options.pop("thinking_trace_format")
    path = tmp_path / "sft_v2.yaml"
    path.write_text(yaml.safe_dump(cfg))
    made = from_nemo_rl(path, tokenizer=DEMO_TOKENIZER)
    assert "thinking_trace_format" not in made.loader.task_encoder.options
    assert build_task_encoder(made.loader).options.prompt_format == "nemotron6"
    options["thinking_trace_format"] = written
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError, match=re.escape(str(path)) + r": data\.energon\.task_encoder\.options\."
                       r"thinking_trace_format: 'ultra': prompt_format 'nemotron6' does not take it \(formats that "
                       r"do: .*nemotron6-moe"):
        from_nemo_rl(path, tokenizer=DEMO_TOKENIZER)


def test_absent_add_bos_means_true_as_in_nemo_rl(blend):
    cfg = shape_b(blend)
    del cfg["data"]["add_bos"]
    with pytest.raises(ConfigError, match=r"data.add_bos: absent means true in NeMo-RL's Energon loader"):
        from_nemo_rl(cfg, tokenizer=DEMO_TOKENIZER)


# -- interpolations and paths -------------------------------------------------------------------------
def test_interpolations_resolve_like_omegaconf():
    cfg = {"a": {"n": 4, "m": "${a.n}", "s": "len-${a.n}", "p": "${mul:${a.n},${b.0}}"}, "b": [3], "c": "${a.p}"}
    assert resolve(cfg) == {"a": {"n": 4, "m": 4, "s": "len-4", "p": 12}, "b": [3], "c": 12}
    with pytest.raises(ConfigError, match=r"c: \$\{nope.x\} refers to a key the config does not have"):
        resolve({"c": "${nope.x}"})
    with pytest.raises(ConfigError, match=r"refers to itself \(b -> a -> b\)"):
        resolve({"a": "${b}", "b": "${a}"})
    with pytest.raises(ConfigError, match=r"unknown resolver \$\{oc.env:...\}"):
        resolve({"a": "${oc.env:HOME}"})


def test_dss_paths_map_under_the_cache_dir(blend, tmp_path, monkeypatch):
    import os

    from megatron.energon.epathlib import epath as energon_epath

    monkeypatch.setattr(energon_epath, "NVDATASET_CACHE_DIR", energon_epath.NVDATASET_CACHE_DIR)
    monkeypatch.setenv("NVDATASET_CACHE_DIR", os.environ.get("NVDATASET_CACHE_DIR", ""))
    cfg = shape_b(blend, nvdataset_cache_dir=str(tmp_path))
    cfg["data"]["train"]["path"] = "dss://corpus@v0/mix/blend.yaml"
    made = from_nemo_rl(cfg, tokenizer=DEMO_TOKENIZER)
    assert Path(made.loader.data.train.path) == tmp_path / "corpus" / "v0" / "mix" / "blend.yaml"
    assert os.environ["NVDATASET_CACHE_DIR"] == str(tmp_path)


def test_an_msc_source_is_kept_as_written(blend):
    """A top-level ``msc://`` source (object storage) passes to the library's config unchanged: the
    loader reads and checks it through Energon's path layer (tests/test_object_storage.py)."""
    cfg = shape_b(blend)
    cfg["data"]["train"]["path"] = "msc://lake/mix/blend.yaml"
    made = from_nemo_rl(cfg, tokenizer=DEMO_TOKENIZER)
    assert made.loader.data.train.path == "msc://lake/mix/blend.yaml"
    assert made.report["data.train.path"].startswith("honoured:")


def test_the_packed_batch_loader_points_to_the_nemo_rl_loader(blend):
    """``output: nemo_rl_packed`` is NeMo-RL's own batch: the Nemotron Omni preset serves it, and the
    library's ``PackedBatch`` loader refuses it naming where NeMo-RL's batches come from."""
    from energon_data import text_config
    from energon_nemotron.loading import build_task_encoder, build_train_loader

    cfg = text_config(blend / "text", workers=0)
    cfg["data"]["default_cooker"] = "nemotron_conversation"
    cfg["task_encoder"]["options"].update(preset="nemotron_omni", output="nemo_rl_packed")
    assert build_task_encoder(cfg).options.output == "nemo_rl_packed"
    with pytest.raises(ConfigError, match=r"output 'nemo_rl_packed' makes the encoder yield NeMo-RL's packed "
                                          r"batch dicts.*NeMo-RL: energon_nemotron\.integrations\.nemo_rl\.build_nemo_rl_loader"):
        build_train_loader(cfg, repeat=False)
