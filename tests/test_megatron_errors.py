"""Fail closed: every bad row or option is an error that names the row (file:line) and the reason."""

from __future__ import annotations

import json
import warnings

import pytest

from conftest import DEMO_TOKENIZER, FIXTURE_TOKENIZER, fixture_rows, write_jsonl
from energon_nemotron.errors import ConfigError, DataError
from energon_nemotron.megatron_packed import MegatronSFTPackedDataset, MegatronSFTPackedEncoder
from energon_nemotron.megatron_packed.dataset import PadInContentWarning, TruncationWarning


@pytest.fixture(scope="module")
def enc():
    return MegatronSFTPackedEncoder(FIXTURE_TOKENIZER, 96, "nemotron-h-aligned")


def read_all(path, encoder):
    return list(MegatronSFTPackedDataset(path, encoder))


def sys_(c="S"):
    return {"role": "system", "content": c}


def user(c="Q"):
    return {"role": "user", "content": c}


def asst(c="A"):
    return {"role": "assistant", "content": c}


GOOD = {"messages": [sys_(), user(), asst()]}


@pytest.mark.parametrize("row, reason", [
    ({"conversation": []}, r"row has no 'messages' key"),
    ({"messages": "hello"}, r"'messages' must be a list of messages, got str"),
    ({"messages": []}, r"'messages' is empty"),
    ({"messages": [sys_(), {"role": "narrator", "content": "x"}]}, r"message 1 has unknown role 'narrator'"),
    ({"messages": [sys_(), user(), {"role": "assistant", "content": [{"type": "text", "text": "hi"}]}]},
     r"message 2 \(assistant\) content must be a string, got list: multimodal content is not supported"),
    ({"messages": [sys_(), user(), {"role": "assistant"}]}, r"message 2 \(assistant\) content must be a string, got missing"),
    ({"messages": [sys_(), user(), asst("")]}, r"message 2 is an empty assistant turn"),
    ({"messages": [sys_(), asst()]}, r"assistant turn 1 follows system, not a user or tool turn"),
    (["not", "an", "object"], r"row must be a JSON object, got list"),
])
def test_bad_rows_name_file_line_and_reason(tmp_path, enc, row, reason):
    path = write_jsonl(tmp_path / "bad.jsonl.packed", [GOOD, GOOD, row])
    with pytest.raises(DataError, match=rf"bad\.jsonl\.packed:3(#\d+)?: {reason}"):
        read_all(path, enc)


def test_invalid_json_and_utf8_name_the_line(tmp_path, enc):
    path = tmp_path / "broken.jsonl.packed"
    path.write_bytes(json.dumps(GOOD).encode() + b"\n\n{\"messages\": [\n")
    with pytest.raises(DataError, match=r"broken\.jsonl\.packed:3: invalid JSON"):
        read_all(path, enc)
    path.write_bytes(json.dumps(GOOD).encode() + b"\n" + b'{"messages": "\xff"}\n')
    with pytest.raises(DataError, match=r"broken\.jsonl\.packed:2: invalid UTF-8"):
        read_all(path, enc)


def test_per_turn_tokenization_mismatch_names_row_and_turn(tmp_path, demo_tokenizer):
    # identity + a real BPE: find two turn texts that merge differently when concatenated
    enc = MegatronSFTPackedEncoder(demo_tokenizer, 256, "identity")
    text = enc.sft.text
    pairs = [("The meadow", " was quiet"), ("hel", "lo"), ("12", "34"), ("wor", "ld.")]
    a, b = next((a, b) for a, b in pairs if text.encode(a + b) != text.encode(a) + text.encode(b))
    path = write_jsonl(tmp_path / "m.jsonl.packed", [{"messages": [sys_("s\n"), user(a), asst(b)]}])
    # Megatron-LM checks turns in order: the first turn whose tokens differ is reported
    with pytest.raises(DataError, match=r"m\.jsonl\.packed:1#0: turn [12] \((user|assistant)\): tokenized "
                                        r"alone it gives .* merges across a turn boundary"):
        read_all(path, enc)


def test_conversation_without_tokens_is_an_error(tmp_path):
    enc = MegatronSFTPackedEncoder(FIXTURE_TOKENIZER, 96, "identity")
    path = write_jsonl(tmp_path / "z.jsonl.packed", [{"messages": [sys_(), user(), asst(), sys_("")]}])
    with pytest.raises(DataError, match=r"z\.jsonl\.packed:1#1: the conversation renders to no tokens"):
        read_all(path, enc)


def test_option_errors():
    with pytest.raises(ConfigError, match=r"unknown Megatron-LM SFT prompt format 'chatml'; known: default, identity"):
        MegatronSFTPackedEncoder(FIXTURE_TOKENIZER, 96, "chatml")
    with pytest.raises(ConfigError, match=r"seq_length 90 is not a multiple of 2\*context_parallel_size = 8"):
        MegatronSFTPackedEncoder(FIXTURE_TOKENIZER, 90, context_parallel_size=4)
    with pytest.raises(ConfigError, match=r"pad token '<nope>' .* is not a token of this tokenizer's vocabulary"):
        MegatronSFTPackedEncoder(FIXTURE_TOKENIZER, 96, pad_token="<nope>")
    with pytest.raises(ConfigError, match=r"pad id 2 \(EOS \(the tokenizer has no pad token\)\) equals the EOS id"):
        MegatronSFTPackedEncoder(FIXTURE_TOKENIZER, 96, "default")
    with pytest.raises(ConfigError, match=r"pad id 2 \('</s>'\) equals the EOS id"):
        MegatronSFTPackedEncoder(FIXTURE_TOKENIZER, 96, pad_token="</s>")
    with pytest.raises(ConfigError, match=r"tokenizer directory .* does not exist"):
        MegatronSFTPackedEncoder("no/such/dir", 96)
    with pytest.raises(ConfigError, match=r"context_parallel_size must be >= 1"):
        MegatronSFTPackedEncoder(FIXTURE_TOKENIZER, 96, context_parallel_size=0)


def test_truncation_is_counted_and_reported_with_line_numbers(tmp_path):
    enc = MegatronSFTPackedEncoder(FIXTURE_TOKENIZER, 96, "identity")
    rows = fixture_rows()            # row 1 (line 2) overflows 96 tokens
    path = write_jsonl(tmp_path / "t.jsonl.packed", [rows[0], rows[1], rows[0], rows[1]])
    ds = MegatronSFTPackedDataset(path, enc)
    with pytest.warns(TruncationWarning, match=r"t\.jsonl\.packed: 2 of 4 rows of several conversations no "
                                               r"longer fit seq_length=96 .* \(lines 2, 4\): the tokenizer files"):
        out = list(ds)
    assert [r["truncated"] for r in out] == [False, True, False, True]
    assert ds.last_report["truncated_lines"] == [2, 4]
    assert out[1]["dropped_conversations"] == 0      # cut inside its last conversation


def test_exactly_full_row_drops_the_next_conversation_and_reports_it(tmp_path):
    enc = MegatronSFTPackedEncoder(FIXTURE_TOKENIZER, 16, "identity")
    conv = [user("abc"), asst("defgh")]                    # 8 tokens (char-level)
    row = {"messages": conv + [sys_("")] + conv + [sys_("")] + conv}
    out = enc.encode(row, "x:1")
    assert out["cu_seqlens"].tolist() == [0, 8, 16]       # Megatron-LM's [0, 8, 16, 16], stripped
    assert out["truncated"] and out["dropped_conversations"] == 1
    assert out["sample_keys"] == ["x:1#0", "x:1#1"]
    assert out["labels"][-1].item() == enc.pad_id and out["tokens"][-1].item() != enc.pad_id


def test_pad_token_inside_content_is_reported(tmp_path):
    enc = MegatronSFTPackedEncoder(FIXTURE_TOKENIZER, 96, "identity")
    path = write_jsonl(tmp_path / "p.jsonl.packed", [GOOD, {"messages": [sys_(), user(), asst("a<unk>b")]}])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        list(MegatronSFTPackedDataset(path, enc))
    msgs = [str(w.message) for w in caught if issubclass(w.category, PadInContentWarning)]
    assert len(msgs) == 1 and "1 rows contain the pad id 0" in msgs[0] and "(lines 2)" in msgs[0]


# -- hostile JSON (issue 14, item 9): each a named error with its own code, never a crash ---------

DEEP_LINE = '{"messages": ' + "[" * 1000 + "]" * 1000 + "}"          # 2 KB, 1001 levels
SURROGATE_ROW = {"messages": [sys_(), user("broken \ud800 pair"), asst()]}
NUL_ROW = {"messages": [sys_(), user(), asst("a\x00b")]}


@pytest.mark.parametrize("line, code, reason", [
    (DEEP_LINE, "json_too_deep", r"the JSON is nested 1001 levels deep, over the limit of 100 levels"),
    (json.dumps(SURROGATE_ROW), "lone_surrogate",
     r"field messages\[1\]\.content contains a lone UTF-16 surrogate U\+D800 at character 7"),
    (json.dumps(NUL_ROW), "nul_character", r"field messages\[2\]\.content contains U\+0000 \(a NUL character\)"),
])
def test_hostile_json_names_file_line_and_reason(tmp_path, enc, line, code, reason):
    path = tmp_path / "h.jsonl.packed"
    path.write_text(json.dumps(GOOD) + "\n" + line + "\n")
    with pytest.raises(DataError, match=rf"h\.jsonl\.packed:2: {reason}") as err:
        read_all(path, enc)
    assert err.value.code == code


@pytest.mark.parametrize("workers", [0, 2])
def test_hostile_json_is_skipped_and_counted(tmp_path, workers):
    from conftest import DEMO_TOKENIZER
    from energon_nemotron.loading import build_train_loader

    path = tmp_path / "h.jsonl.packed"
    lines = [json.dumps(GOOD)] * 6 + [DEEP_LINE, json.dumps(SURROGATE_ROW), json.dumps(NUL_ROW)] + [json.dumps(GOOD)] * 3
    path.write_text("\n".join(lines) + "\n")
    config = {"tokenizer": str(DEMO_TOKENIZER),
              "data": {"train": {"format": "megatron_sft_packed", "path": str(path), "seq_length": 64,
                                 "prompt_format": "nemotron-h-aligned"}},
              "loader": {"batch_size": 1, "num_workers": workers, "on_error": "skip"}}
    loader = build_train_loader(config, repeat=False)
    keys = sorted(k.split("#")[0].rsplit(":", 1)[1] for batch in loader for row in batch.sample_keys for k in row)
    assert keys == sorted(str(n) for n in (1, 2, 3, 4, 5, 6, 10, 11, 12))
    assert loader.skipped() == {"json_too_deep": 1, "lone_surrogate": 1, "nul_character": 1}


_READ_ROWS = """
import sys, warnings
from energon_nemotron import build_train_loader
warnings.simplefilter("always")
cfg = {"tokenizer": sys.argv[1], "loader": {"batch_size": 1, "num_workers": int(sys.argv[3])},
       "data": {"train": {"format": "megatron_sft_packed", "path": sys.argv[2], "seq_length": 64,
                          "prompt_format": "nemotron-h-aligned"}}}
print(sum(1 for _ in build_train_loader(cfg, repeat=False)))
"""


@pytest.mark.parametrize("workers", [0, 2])
def test_an_oversized_conversation_is_named_as_the_cause_once(tmp_path, workers):
    """A conversation longer than seq_length (which ``pack-megatron`` reported and put in a row of
    its own) is the truncation's cause, said once for the whole loader (not per worker), without
    the hint that the encoder settings must match (the manifest checked them). Without the
    manifest, the rows of one conversation are still named as such, without that hint."""
    import subprocess
    import sys

    from energon_nemotron.megatron_packed.offline_pack import pack_file

    enc = MegatronSFTPackedEncoder(DEMO_TOKENIZER, 64, "nemotron-h-aligned")
    long = [{"role": "system", "content": "s"}, {"role": "user", "content": "Count please."},
            {"role": "assistant", "content": ", ".join(str(i) for i in range(200))}]
    short = [{"role": "system", "content": "s"}, {"role": "user", "content": "Hi"},
             {"role": "assistant", "content": "Hello."}]
    raw = write_jsonl(tmp_path / "raw.jsonl", [{"messages": short}] * 6 + [{"messages": long}])
    out = tmp_path / "o.jsonl.packed"
    assert pack_file(raw, out, enc, progress=False).oversized == [f"{raw}:7#0"]

    def read():
        res = subprocess.run([sys.executable, "-c", _READ_ROWS, str(DEMO_TOKENIZER), str(out), str(workers)],
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        return [line for line in res.stderr.splitlines() if "seq_length=64" in line]

    lines = read()
    assert len(lines) == 1, lines
    assert "o.jsonl.packed.manifest.json: 1 conversations are longer than seq_length=64" in lines[0]
    assert "pack-megatron reported them" in lines[0] and "must be those" not in lines[0]
    (tmp_path / "o.jsonl.packed.manifest.json").unlink()
    lines = read()
    assert lines and all("rows hold one conversation longer than seq_length=64" in line for line in lines), lines
    assert not any("must be those" in line for line in lines)
