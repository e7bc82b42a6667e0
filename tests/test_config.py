"""The YAML loader config: strict keys with the valid ones listed, paths, per-encoder options."""

from __future__ import annotations

import pytest
import yaml

from conftest import DEMO_TOKENIZER
from energon_nemotron.config import EnergonSource, MegatronSource, load_config
from energon_nemotron.errors import ConfigError
from energon_nemotron.loading import build_task_encoder


def base(**over):
    cfg = {"tokenizer": str(DEMO_TOKENIZER),
           "task_encoder": {"name": "nemotron_multimodal", "options": {"seq_length": 512}},
           "packing": {"algorithm": "best_fit_decreasing", "buffer_size": 8},
           "data": {"train": {"path": "ds"}}}
    cfg.update(over)
    return cfg


def test_valid_config_and_relative_paths(tmp_path):
    path = tmp_path / "conf" / "loader.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(base(tokenizer="../tok")))
    cfg = load_config(path)
    assert cfg.tokenizer == tmp_path / "conf" / ".." / "tok"
    assert isinstance(cfg.data.train, EnergonSource) and cfg.data.train.path == tmp_path / "conf" / "ds"
    assert cfg.data.train.split == "train" and cfg.loader.batch_size == 1 and cfg.packing.pad_multiple == 1


@pytest.mark.parametrize("change, message", [
    ({"packign": {}}, r"\(top level\): unknown key\(s\) 'packign'; valid keys: tokenizer, task_encoder, packing, data, loader"),
    ({"packing": {"algorithm": "best_fit", "buffer_size": 8}}, r"packing\.algorithm: unknown packing algorithm 'best_fit'; known: balanced_greedy_knapsack"),
    ({"packing": {"buffer": 8}}, r"packing: unknown key\(s\) 'buffer'; valid keys: algorithm, buffer_size, pad_multiple, max_sequences_per_bin"),
    ({"data": {"train": {"path": "ds", "splt": "val"}}}, r"data\.train: unknown key\(s\) 'splt'; valid keys: format, path, split"),
    ({"data": {"train": {"format": "parquet", "path": "x"}}}, r"data\.train: unknown source format 'parquet'"),
    ({"loader": {"batch_size": 0}}, r"loader\.batch_size: Input should be greater than or equal to 1"),
    ({"data": {"train": {"format": "megatron_sft_packed", "path": "x.jsonl.packed", "seq_length": 64}}},
     r"packing: megatron_sft_packed rows are packed already; remove the packing section"),
])
def test_config_errors_name_the_key(change, message):
    with pytest.raises(ConfigError, match=message):
        load_config(base(**change))


def test_megatron_source_options():
    cfg = load_config(base(packing=None, data={"train": {"format": "megatron_sft_packed", "path": "x.jsonl.packed",
                                                          "seq_length": 64, "context_parallel_size": 2}}))
    assert isinstance(cfg.data.train, MegatronSource) and cfg.data.train.context_parallel_size == 2
    with pytest.raises(ConfigError, match=r"data\.train: unknown key\(s\) 'split'"):
        load_config(base(packing=None, data={"train": {"format": "megatron_sft_packed", "path": "x",
                                                       "seq_length": 64, "split": "train"}}))


def test_task_encoder_validates_its_own_options(tmp_path):
    with pytest.raises(ConfigError, match=r"task_encoder\.options: \(top level\): unknown key\(s\) 'seq_len'; "
                                          r"valid keys: prompt_format, seq_length"):
        build_task_encoder(base(task_encoder={"name": "nemotron_multimodal", "options": {"seq_len": 5}}))
    with pytest.raises(ConfigError, match=r"unknown prompt_format 'chatml'; known: nemotron-h, nemotron-h-5p5-reasoning, "
                                          r"nemotron6, nemotron6-moe, tokenizer"):
        build_task_encoder(base(task_encoder={"options": {"seq_length": 64, "prompt_format": "chatml"}}))
    with pytest.raises(ConfigError, match=r"task_encoder\.name: unknown task encoder 'generic'; known: nemotron_multimodal"):
        build_task_encoder(base(task_encoder={"name": "generic", "options": {}}))
    with pytest.raises(ConfigError, match=r"seq_length 510 is not a multiple of 4 \(packing\.pad_multiple combined"):
        build_task_encoder(base(task_encoder={"options": {"seq_length": 510}},
                                packing={"buffer_size": 8, "pad_multiple": 4}))
    enc = build_task_encoder(base())
    assert enc.options.seq_length == 512 and enc.packing.buffer_size == 8


def test_yaml_is_safe_loaded(tmp_path):
    path = tmp_path / "evil.yaml"
    path.write_text("tokenizer: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(path)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
