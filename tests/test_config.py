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


@pytest.mark.parametrize("text, why", [
    ("-1", r"got -1 \(an integer\), which is negative"),
    ("1.5", r"got 1\.5 \(a number\), which is not a whole number of bytes \(1\.5\)"),
    ('"1.5"', r"got '1\.5' \(a string\), which is not a whole number of bytes \(1\.5\)"),
    ('"0.3KiB"', r"got '0\.3KiB' \(a string\), which is not a whole number of bytes \(307\.2\)"),
    ("true", r"got True \(a boolean\)"),
    ("5 parsecs", r"got '5 parsecs' \(a string\)"),
])
def test_max_buffer_bytes_refuses_what_is_not_a_whole_count_of_bytes(tmp_path, text, why):
    """Written as YAML, as a user writes it: a negative or fractional count is refused with the key and
    the reason (it was "could not parse value and unit", and the string "1.5" was taken as 1 byte)."""
    path = tmp_path / "loader.yaml"
    path.write_text(yaml.safe_dump(base()).replace("buffer_size: 8", f"buffer_size: 8\n  max_buffer_bytes: {text}"))
    with pytest.raises(ConfigError, match=r"packing\.max_buffer_bytes: (must be|expected) a whole number of bytes "
                                          r">= 0, or a size such as \"2GiB\" or \"500MB\"; " f"{why}") as err:
        load_config(path)
    assert len(str(err.value).splitlines()) == 1


@pytest.mark.parametrize("text, count", [("0", 0), ("1048576", 1048576), ("1.0e+9", 10**9), ("2.0", 2), ('"4096"', 4096),
                                         ('"1GiB"', 2**30), ('"1.5 MiB"', 1572864), ('"500MB"', 500 * 10**6),
                                         ("null", None)])
def test_max_buffer_bytes_takes_whole_counts_and_sizes(tmp_path, text, count):
    path = tmp_path / "loader.yaml"
    path.write_text(yaml.safe_dump(base()).replace("buffer_size: 8", f"buffer_size: 8\n  max_buffer_bytes: {text}"))
    got = load_config(path).packing.max_buffer_bytes
    assert got == count and (got is None or type(got) is int)
