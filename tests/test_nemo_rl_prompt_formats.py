"""NeMo-RL's prompt formats ``nemotron6-moe`` and ``nemotron-h-5p5-reasoning``, token for token
against NeMo-RL's own tokenization.

``tests/fixtures/nemo_rl/prompt_formats.json`` holds what NeMo-RL's code produced
(``make_prompt_formats.py`` ran its ``_render_compact_messages``, ``_tokenize_nemotron_sample`` and
``tokenize_nemotron_conversation``) for 320 seeded, fuzzed conversations, each under both formats,
every ``thinking_trace_format`` and ``relax_thinking_trace_check`` off and on, with the two test
tokenizers of ``tests/fixtures/nemo_rl/tokenizer/`` (the ids NeMo-RL checks at the ids it expects).

The input correspondence (the generator's ``to_nemo_rl``): a ``Message``'s text is NeMo-RL's content,
with ``<think>{reasoning}</think>`` in front when ``reasoning`` is set; tool calls and tool results as
OpenAI dicts; a ``train`` flag on an assistant turn is NeMo-RL's explicit per-turn loss
(``loss_mask_mode: explicit_assistant_turns``); ``preformatted`` is ``skip_chat_template``,
``last_only`` is ``train_only_on_last_assistant_turn``; ``tool_response_as_turn_boundary`` is the
format option of that name.

The mask mapping: NeMo-RL's ``token_loss_mask`` is token-aligned, 1 at token ``i`` when token ``i``
is a target (predicted from the tokens before it; NeMo-RL's packing zeroes position 0 of each
source). ``ConversationTokenizer.encode`` returns ``(tokens int64 [n], trained bool [n])`` aligned
the same way: ``trained[i]`` when token ``i`` is a label (labels are shifted within each source, so
token 0 is never one). So ``trained == (token_loss_mask == 1)`` position for position, token 0
included.

Per run: NeMo-RL raised → the library raises too (``DataError`` naming the key, or ``ConfigError``);
the case lists divergences (NeMo-RL accepts, but would drop or mis-train part of the conversation)
→ the library refuses with a ``DataError``, and :func:`test_divergences_show_in_nemo_rl_output`
checks that NeMo-RL's output shows each reason; otherwise token ids and mask are equal.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

from energon_nemotron.errors import ConfigError, DataError
from energon_nemotron.tokenization import ConversationTokenizer, get_prompt_format, load_tokenizer
from energon_nemotron.types import Message, ToolCall

FIXTURES = Path(__file__).parent / "fixtures" / "nemo_rl"
FIXTURE = json.loads((FIXTURES / "prompt_formats.json").read_text(encoding="utf-8"))
CASES = FIXTURE["conversations"]
FORMATS = ("nemotron6-moe", "nemotron-h-5p5-reasoning")
RUNS = [(f, t, r) for f in FORMATS for t in ("default", "normalized", "ultra") for r in ("checked", "relaxed")]


@lru_cache(maxsize=None)
def hf_tokenizer(fmt: str):
    return load_tokenizer(FIXTURES / FIXTURE["meta"]["tokenizers"][fmt])


@lru_cache(maxsize=None)
def tokenizer(fmt: str, thinking: str, relax: bool, boundary: bool) -> ConversationTokenizer:
    return ConversationTokenizer(hf_tokenizer(fmt), fmt, {"thinking_trace_format": thinking,
                                                          "relax_thinking_trace_check": relax,
                                                          "tool_response_as_turn_boundary": boundary})


def messages(lib: dict) -> list[Message]:
    return [Message(d["role"], list(d["content"]), reasoning=d["reasoning"], train=d["train"],
                    tool_calls=[ToolCall(c["name"], c["arguments"], c["id"]) for c in d["tool_calls"]],
                    tool_call_id=d["tool_call_id"]) for d in lib["messages"]]


def library(case: dict, fmt: str, thinking: str, relax: bool, **change) -> dict:
    """The library's outcome as the fixture writes NeMo-RL's: ``{"tokens", "mask"}`` or ``{"error"}``."""
    lib = {**case["library"], **change}
    try:
        t = tokenizer(fmt, thinking, relax, lib["tool_response_as_turn_boundary"])
        [(tokens, trained)] = t.encode([messages(lib)], case["key"], preformatted=lib["preformatted"],
                                       last_only=lib["last_only"], tools=lib["tools"])
    except ConfigError as e:
        return {"error": {"type": "ConfigError", "message": str(e)}}
    except DataError as e:
        assert e.where == case["key"], e
        return {"error": {"type": "DataError", "message": str(e), "code": e.code}}
    assert tokens.dtype == np.int64 and trained.dtype == bool and tokens.shape == trained.shape
    return {"tokens": tokens.tolist(), "mask": "".join("1" if v else "0" for v in trained)}


@pytest.mark.parametrize("fmt,thinking,relax", RUNS)
def test_library_equals_nemo_rl(fmt, thinking, relax):
    """Every conversation of the fixture: NeMo-RL's tokens and mask exactly, its rejections rejected,
    its divergences refused."""
    counts = {"equal": 0, "both_rejected": 0, "refused_divergence": 0}
    wrong = []
    for case in CASES:
        result = case["results"][fmt]
        want = result["outcomes"][result["runs"][f"{thinking}|{relax}"]]
        got = library(case, fmt, thinking, relax == "relaxed")
        if "error" in want or want.get("placeholders"):   # (placeholders: NeMo-RL's preencode raises)
            kind = "both_rejected"
            ok = "error" in got
        elif result["divergences"]:
            kind = "refused_divergence"
            ok = got.get("error", {}).get("type") == "DataError"
        else:
            kind = "equal"
            ok = got == want
        counts[kind] += ok
        if not ok:
            wrong.append((case["key"], kind, want, got))
    assert not wrong, f"{len(wrong)} differ, first: {wrong[0]}"
    assert min(counts.values()) > 0, counts           # every outcome kind is exercised under every option set


def test_corpus_covers_the_options():
    """The fixture holds what the brief asks for: reasoning present, empty and absent, tools,
    multi-turn, with and without a system turn, last-turn-only, tool-response boundaries,
    preformatted samples, explicit per-turn loss; and equal (accepted) runs of each."""
    accepted = {f: [c for c in CASES if any("tokens" in o and not o.get("placeholders")
                                            for o in c["results"][f]["outcomes"])
                    and not c["results"][f]["divergences"]] for f in FORMATS}

    def has(pred, fmt="nemotron6-moe"):
        return sum(1 for c in accepted[fmt] if pred(c["library"]))

    def assistants(lib):
        return [m for m in lib["messages"] if m["role"] == "assistant"]

    assert has(lambda lib: any(m["reasoning"] or "<think>" in m["content"][0] for m in assistants(lib))) > 20
    assert has(lambda lib: any(m["reasoning"] == "" for m in assistants(lib))) > 5
    assert has(lambda lib: any(m["reasoning"] is None and "<think>" not in m["content"][0]
                               for m in assistants(lib))) > 20
    assert has(lambda lib: any(m["tool_calls"] for m in lib["messages"])) > 10
    assert has(lambda lib: len(assistants(lib)) > 2) > 20
    assert has(lambda lib: lib["messages"][0]["role"] == "system") > 20
    assert has(lambda lib: lib["messages"][0]["role"] != "system") > 20
    assert has(lambda lib: lib["last_only"] and not lib["preformatted"]) > 20
    assert has(lambda lib: lib["tool_response_as_turn_boundary"]) > 3
    assert has(lambda lib: lib["preformatted"]) > 10
    assert has(lambda lib: any(m["train"] is not None for m in lib["messages"])) > 3
    assert has(lambda lib: lib["preformatted"], "nemotron-h-5p5-reasoning") > 10
    assert has(lambda lib: len(assistants(lib)) > 2, "nemotron-h-5p5-reasoning") > 10


def _assistant_regions(tokens: list[int], assistant_id: int) -> str:
    """The nemotron-h assistant turns found in ``tokens``: after ``<SPECIAL_11>Assistant\\n`` up to
    the next ``<SPECIAL_10>``/``<SPECIAL_11>`` (ids 10, 11) or the end, as a mask string."""
    mask = ["0"] * len(tokens)
    for p, t in enumerate(tokens):
        if t == 11 and p + 1 < len(tokens) and tokens[p + 1] == assistant_id:
            q = p + 3
            while q < len(tokens) and tokens[q] not in (10, 11):
                mask[q] = "1"
                q += 1
    return "".join(mask)


def test_divergences_show_in_nemo_rl_output():
    """Where the library refuses what NeMo-RL accepted, NeMo-RL's own output shows why."""
    h_tok, moe_tok = hf_tokenizer("nemotron-h-5p5-reasoning"), hf_tokenizer("nemotron6-moe")
    assistant_id = h_tok.convert_tokens_to_ids("Assistant")
    seen: dict[str, int] = {}
    for case in CASES:
        lib = case["library"]
        for fmt in FORMATS:
            result = case["results"][fmt]
            for run, i in result["runs"].items():
                want = result["outcomes"][i]
                if "error" in want or want.get("placeholders"):
                    continue
                thinking, relax = run.split("|")
                for reason in result["divergences"]:
                    seen[reason] = seen.get(reason, 0) + 1
                    if reason == "h5p5_drops_tools":          # one <SPECIAL_11> per user and assistant turn only
                        turns = sum(m["role"] in ("user", "assistant") for m in lib["messages"])
                        assert want["tokens"].count(11) == turns, case["key"]
                    elif reason == "h5p5_positional_mask":    # the mask is not the assistant turns
                        assert want["mask"] != _assistant_regions(want["tokens"], assistant_id), case["key"]
                    elif reason == "placeholder_in_tool_call":  # an image / audio placeholder id without media
                        assert {18, 27} & set(want["tokens"]), case["key"]
                    elif reason == "last_only_ignored_preformatted":  # every assistant turn trained
                        alone = library(case, fmt, thinking, relax == "relaxed", last_only=False)
                        assert alone == want or len(result["divergences"]) > 1, case["key"]
                    elif reason == "preformatted_drops_tool_calls":   # the calls change nothing
                        calls_dropped = [{**m, "tool_calls": []} for m in lib["messages"]]
                        same = library(case, fmt, thinking, relax == "relaxed", messages=calls_dropped,
                                       last_only=False)
                        assert "error" in same or same == want, case["key"]
                    elif reason == "preformatted_boundary_inside_token":  # a token spans an assistant edge
                        tok = moe_tok if fmt == "nemotron6-moe" else h_tok
                        texts = ["".join(m["content"]) for m in lib["messages"]]
                        offsets = tok("".join(texts), add_special_tokens=False,
                                      return_offsets_mapping=True)["offset_mapping"]
                        ends = np.cumsum([len(t) for t in texts]).tolist()
                        edges = {e for m, a, e in zip(lib["messages"], [0] + ends, ends) if m["role"] == "assistant"}
                        edges |= {a for m, a in zip(lib["messages"], [0] + ends) if m["role"] == "assistant"}
                        assert any(a < e < b for a, b in offsets for e in edges), case["key"]
                    else:
                        raise AssertionError(reason)
    assert set(seen) == {"h5p5_drops_tools", "h5p5_positional_mask", "placeholder_in_tool_call",
                         "last_only_ignored_preformatted", "preformatted_drops_tool_calls",
                         "preformatted_boundary_inside_token"}, seen


# -- options and errors ------------------------------------------------------------------------------
def test_format_options_are_refused_where_not_taken():
    tok = hf_tokenizer("nemotron6-moe")
    with pytest.raises(ConfigError, match=r"'nemotron6' does not take the option 'thinking_trace_format'.*"
                                          r"nemotron-h-5p5-reasoning, nemotron6-moe"):
        get_prompt_format("nemotron6", tok, thinking_trace_format="ultra")
    with pytest.raises(ConfigError, match="'nemotron-h-5p5-reasoning' does not take the option "
                                          "'tool_response_as_turn_boundary'"):
        get_prompt_format("nemotron-h-5p5-reasoning", hf_tokenizer("nemotron-h-5p5-reasoning"),
                          tool_response_as_turn_boundary=True)
    with pytest.raises(ConfigError, match="thinking_trace_format 'fancy'"):
        get_prompt_format("nemotron6-moe", tok, thinking_trace_format="fancy")
    # None / False are not given: every format takes them
    assert get_prompt_format("nemotron6", tok, thinking_trace_format=None, relax_thinking_trace_check=False)
    with pytest.raises(ConfigError, match=r"needs a Nemotron 3 tokenizer: ids \[10\]"):
        get_prompt_format("nemotron6-moe", hf_tokenizer("nemotron-h-5p5-reasoning"))


def test_thinking_errors_name_the_sample():
    t = tokenizer("nemotron6-moe", "normalized", False, False)
    bad = [Message("user", ["q"]), Message("assistant", ["<think>a</think><think>b</think>c"])]
    with pytest.raises(DataError, match=r"^k7: message 1: an assistant turn needs exactly one") as e:
        t.encode([bad], "k7")
    assert e.value.code == "invalid_thinking"
    ok = tokenizer("nemotron6-moe", "normalized", True, False).encode([bad], "k7")    # relaxed: as it is
    assert ok[0][0].size


def test_encoder_options_reach_the_format():
    from energon_nemotron.encoders.options import NemotronMultimodalOptions

    o = NemotronMultimodalOptions(prompt_format="nemotron6-moe", seq_length=64, thinking_trace_format="ultra",
                                  relax_thinking_trace_check=True)
    assert (o.thinking_trace_format, o.relax_thinking_trace_check) == ("ultra", True)
    with pytest.raises(ValueError, match="thinking_trace_format"):
        NemotronMultimodalOptions(prompt_format="nemotron6-moe", seq_length=64, thinking_trace_format="fancy")
    t = ConversationTokenizer(hf_tokenizer("nemotron6-moe"), "nemotron6-moe",
                              o.model_dump(include={"thinking_trace_format", "relax_thinking_trace_check"}))
    assert t.format.ultra and t.format.relax
