"""Hostile JSON (issue 14, item 9): nesting over the limit, lone surrogates, NUL characters and
over-long media paths are each a ``DataError`` with its own reason code, never a crash or ``other``.
The corpus in ``bad_inputs`` covers both Energon sources (WebDataset members and JSONL lines) through
the loader; this file covers the checks themselves and what a user of a JSONL dataset meets."""

from __future__ import annotations

import errno
import json
import time

import pytest
import yaml

from bad_inputs import DEEP_JSON, RAW_NUL_LINE
from conftest import DEMO_TOKENIZER
from energon_data import energon
from energon_nemotron.errors import CODES, DataError, error_code
from energon_nemotron.guards.json_safety import MAX_JSON_DEPTH, check_strings, json_depth, parse_json


def nested(depth: int) -> str:
    return "[" * (depth - 1) + "{}" + "]" * (depth - 1)


@pytest.mark.parametrize("text, depth", [
    (nested(150), 150), ('["' + "[" * 300 + '"]', 1), ('["\\"' + "[" * 300 + '"]', 1),
    ("[" + '"{", ' * 200 + "[]]", 2), ('{"a": [' + '{"b": "]]]]"}, ' * 150 + "{}]}", 3),
])
def test_depth_counts_brackets_outside_strings(text, depth):
    assert json.loads(text) is not None
    assert json_depth(text) == depth and json_depth(text.encode()) == depth


def test_depth_limit_is_exact_and_never_recurses():
    assert parse_json(nested(MAX_JSON_DEPTH), "k") is not None
    with pytest.raises(DataError, match=rf"^k: the JSON is nested {MAX_JSON_DEPTH + 1} levels deep, over the "
                                        rf"limit of {MAX_JSON_DEPTH} levels") as err:
        parse_json(nested(MAX_JSON_DEPTH + 1), "k")
    assert err.value.code == "json_too_deep"
    with pytest.raises(DataError) as err:           # far beyond the interpreter's recursion limit
        parse_json(b"[" * 200_000 + b"]" * 200_000, "k")
    assert err.value.code == "json_too_deep"


def test_depth_scan_is_linear_on_adversarial_text():
    # an unterminated string full of escaped quotes and brackets: one linear pass, and the brackets
    # inside the string do not count. A bound, not a speed goal: the linear scan takes ~0.04 s here,
    # a backtracking (quadratic) one ~10^12 steps on these 1.5 MB, hours; 60 s tells them apart on
    # any machine however loaded, and a correct program never comes near it.
    text = "[" * 50 + '"' + '\\"[' * 500_000
    start = time.perf_counter()
    with pytest.raises(DataError) as err:
        parse_json(text, "k")
    assert time.perf_counter() - start < 60.0
    assert err.value.code == "invalid_json"


@pytest.mark.parametrize("text, code, reason", [
    ('{"messages": [{"role": "user", "content": "a\\ud800b"}]}', "lone_surrogate",
     r"field messages\[0\]\.content contains a lone UTF-16 surrogate U\+D800 at character 1"),
    ('{"messages": [{"content": "ok"}, {"reasoning_content": "x\\u0000"}]}', "nul_character",
     r"field messages\[1\]\.reasoning_content contains U\+0000 \(a NUL character\) at character 1"),
    ('{"bad\\udfffkey": 1}', "lone_surrogate", r"key 'bad\\udfffkey' contains a lone UTF-16 surrogate U\+DFFF"),
    ('{"a": [{"b": "\\u0000"}], "c": "\\ud800"}', "nul_character", r"field a\[0\]\.b"),   # first in order
])
def test_bad_strings_name_the_field(text, code, reason):
    with pytest.raises(DataError, match=rf"^row 7: {reason}") as err:
        parse_json(text, "row 7")
    assert err.value.code == code
    str(err.value).encode("utf-8")             # the message itself can always be printed


def test_a_raw_nul_byte_is_a_nul_character_not_invalid_json():
    with pytest.raises(DataError, match=r"^k: json contains a NUL byte at offset 48") as err:
        parse_json(RAW_NUL_LINE.encode(), "k", "json")
    assert err.value.code == "nul_character"


def test_valid_pairs_and_escapes_pass():
    value = parse_json('{"a": "\\ud83d\\ude00 \\u00e9 \\\\u0000 \\\\ud800"}', "k")
    assert value == {"a": "\U0001F600 é \\u0000 \\ud800"}
    check_strings(value, "k")


def test_codes_are_known_and_foreign_errors_map_to_them():
    assert {"json_too_deep", "lone_surrogate", "nul_character", "path_too_long"} <= set(CODES)
    try:
        "\ud800".encode("utf-8")
    except UnicodeEncodeError as e:
        assert error_code(e) == "lone_surrogate"
    assert error_code(ValueError("embedded null byte")) == "nul_character"
    assert error_code(OSError(errno.ENAMETOOLONG, "File name too long")) == "path_too_long"


def jsonl_loader(tmp_path, lines, on_error, workers=0):
    (tmp_path / "c.jsonl").write_text("\n".join(lines) + "\n")
    energon("prepare", str(tmp_path / "c.jsonl"))      # prepare does not parse lines: it succeeds
    (tmp_path / "mix.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend_epochized:\n"
        "      - {repetitions: 1, path: c.jsonl, subflavors: {cooker: general_conversations}}\n")
    cfg = {"tokenizer": str(DEMO_TOKENIZER),
           "task_encoder": {"name": "nemotron_multimodal", "options": {"prompt_format": "nemotron6", "seq_length": 512}},
           "data": {"train": {"path": str(tmp_path / "mix.yaml")}},
           "loader": {"batch_size": 1, "num_workers": workers, "shuffle_buffer_size": None, "on_error": on_error}}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    from energon_nemotron.loading import build_train_loader

    return build_train_loader(tmp_path / "cfg.yaml", repeat=False)


GOOD_LINE = json.dumps({"conversations": [{"from": "human", "value": "fine?"}, {"from": "gpt", "value": "yes"}]})


def test_deep_jsonl_line_is_a_named_error_not_a_fatal_one(tmp_path):
    """Energon parses JSONL lines itself, before any cooker: a deep line used to end the run with a
    RecursionError (a 'system exception' to Energon) whatever on_error said."""
    loader = jsonl_loader(tmp_path, [GOOD_LINE, DEEP_JSON.decode(), GOOD_LINE], "raise")
    with pytest.raises(DataError, match=r"^c\.jsonl:2: the line is nested 1001 levels deep, over the "
                                        r"limit of 100 levels") as err:
        list(loader)
    assert err.value.code == "json_too_deep"


@pytest.mark.parametrize("workers", [0, 2])
def test_hostile_jsonl_lines_are_skipped_and_counted(tmp_path, workers):
    surrogate = json.dumps({"conversations": [{"from": "human", "value": "\ud800"}, {"from": "gpt", "value": "x"}]})
    nul = json.dumps({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a\x00"}]})
    lines = [GOOD_LINE, DEEP_JSON.decode(), surrogate, nul, RAW_NUL_LINE, GOOD_LINE]
    loader = jsonl_loader(tmp_path, lines, "skip", workers)
    keys = sorted(k for batch in loader for row in batch.sample_keys for k in row)
    assert keys == ["c.jsonl:1", "c.jsonl:6"]
    assert loader.skipped() == {"json_too_deep": 1, "lone_surrogate": 1, "nul_character": 2}
