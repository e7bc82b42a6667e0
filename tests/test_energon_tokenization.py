"""Energon-path tokenization: assistant masks against Hugging Face, and the Nemotron formats."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import DEMO_TOKENIZER
from energon_nemotron.errors import ConfigError, DataError
from energon_nemotron.tokenization import ConversationTokenizer, NoTrainableTokensError
from energon_nemotron.types import Message

PIECES = list("abc XYZ .,!?\n\t") + ["é", "日本", "The", " the", "12", "  ", "\n\n", "<think>", "</think>"]
TEXT = st.lists(st.sampled_from(PIECES), max_size=10).map("".join)
_TOK: dict = {}


def tok(fmt: str, tokenizer=None) -> ConversationTokenizer:
    if tokenizer is not None:
        return ConversationTokenizer(tokenizer, fmt)
    if fmt not in _TOK:
        _TOK[fmt] = ConversationTokenizer(DEMO_TOKENIZER, fmt)
    return _TOK[fmt]


@st.composite
def conversations(draw, min_turns=1, max_turns=4):
    msgs = []
    if draw(st.booleans()):
        msgs.append({"role": "system", "content": draw(TEXT)})
    for _ in range(draw(st.integers(min_turns, max_turns))):
        msgs.append({"role": "user", "content": draw(TEXT)})
        msgs.append({"role": "assistant", "content": draw(TEXT.filter(lambda t: t.strip()))})
    return msgs


def as_messages(dicts):
    return [Message(d["role"], [d["content"]]) for d in dicts]


def trained_text(t: ConversationTokenizer, tokens, trained) -> list[str]:
    """Decoded runs of trained tokens."""
    runs, cur = [], []
    for tid, on in zip(tokens.tolist(), trained.tolist()):
        if on:
            cur.append(tid)
        elif cur:
            runs.append(t.tokenizer.decode(cur))
            cur = []
    if cur:
        runs.append(t.tokenizer.decode(cur))
    return runs


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv=conversations())
def test_tokenizer_format_equals_hugging_face_assistant_mask(conv, demo_tokenizer):
    """The demo tokenizer's ChatML template has {% generation %} markers: masks must be HF's."""
    want = demo_tokenizer.apply_chat_template(conv, tokenize=True, return_assistant_tokens_mask=True,
                                              return_dict=True)
    [(tokens, trained)] = tok("tokenizer").encode([as_messages(conv)], "k")
    assert tokens.tolist() == list(want["input_ids"])
    assert trained.astype(int).tolist() == list(want["assistant_masks"])


MARKED = ("{%- for m in messages -%}{{ '<|im_start|>' + m['role'] + '\\n' }}"
          "{%- if m['role'] == 'assistant' -%}{% generation %}{{ m['content'] + '<|im_end|>\\n' }}{% endgeneration %}"
          "{%- else -%}{{ m['content'] + '<|im_end|>\\n' }}{%- endif -%}{%- endfor -%}"
          "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}")
UNMARKED = MARKED.replace("{% generation %}", "").replace("{% endgeneration %}", "")


@pytest.fixture(scope="module")
def unmarked_tokenizer():
    from transformers import AutoTokenizer

    t = AutoTokenizer.from_pretrained(str(DEMO_TOKENIZER))
    t.chat_template = UNMARKED
    return t


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(conv=conversations())
def test_template_without_markers_derives_the_marked_spans(conv, demo_tokenizer, unmarked_tokenizer):
    """Prefix rendering recovers exactly the span a marked version of the template declares,
    wherever the derived boundaries fall between tokens (else the sample is rejected)."""
    want = demo_tokenizer.apply_chat_template(conv, tokenize=True, return_assistant_tokens_mask=True,
                                              return_dict=True, chat_template=MARKED)
    t = tok("tokenizer", unmarked_tokenizer)
    assert not t.format.has_markers
    try:
        [(tokens, trained)] = t.encode([as_messages(conv)], "k")
    except DataError as e:
        assert "falls inside a token" in str(e)
        return
    assert tokens.tolist() == list(want["input_ids"])
    assert trained.astype(int).tolist() == list(want["assistant_masks"])


def test_inconsistent_template_fails_loudly(unmarked_tokenizer):
    from transformers import AutoTokenizer

    t = AutoTokenizer.from_pretrained(str(DEMO_TOKENIZER))
    # renders earlier assistant turns differently once a later turn exists (like thinking truncation)
    t.chat_template = ("{%- for m in messages -%}{{ '<|im_start|>' + m['role'] + '\\n' }}"
                       "{%- if m['role'] == 'assistant' and not loop.last -%}{{ 'old<|im_end|>\\n' }}"
                       "{%- else -%}{{ m['content'] + '<|im_end|>\\n' }}{%- endif -%}{%- endfor -%}"
                       "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}")
    conv = as_messages([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                        {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}])
    with pytest.raises(DataError, match=r"^s1: the chat template is not prefix-consistent at message 1"):
        tok("tokenizer", t).encode([conv], "s1")


def test_nemotron6_rendering_and_trained_spans():
    t = tok("nemotron6")
    msgs = [Message("user", ["What is 2+2?"]), Message("assistant", ["4"]),
            Message("user", ["And 3+3?"]), Message("assistant", ["<think>add three</think>6"]),
            Message("tool", ["{\"ok\": true}"]), Message("assistant", ["done"], reasoning="checked")]
    r = t.render(msgs, "k")
    assert r.text == (
        "<|im_start|>system\n<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n<think></think>4<|im_end|>\n"
        "<|im_start|>user\nAnd 3+3?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nadd three\n</think>6<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n{\"ok\": true}\n</tool_response>\n<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nchecked\n</think>done<|im_end|>\n")
    assert [r.text[a:b] for a, b in r.spans] == ["4<|im_end|>", "add three\n</think>6<|im_end|>",
                                                  "checked\n</think>done<|im_end|>"]
    [(tokens, trained)] = t.encode([msgs], "k")
    assert trained_text(t, tokens, trained) == ["4<|im_end|>", "add three\n</think>6<|im_end|>",
                                                "checked\n</think>done<|im_end|>"]


@pytest.mark.parametrize("content, reason", [
    ("<think>a</think><think>b</think>x", "at most one <think>"),
    ("x<think>a</think>", "at most one <think>"),
    ("<think>a", "unmatched"),
])
def test_nemotron6_bad_thinking_is_an_error(content, reason):
    with pytest.raises(DataError, match=rf"^key7: .*{reason}"):
        tok("nemotron6").render([Message("user", ["q"]), Message("assistant", [content])], "key7")


def test_nemotron_h_matches_megatron_nano_v2_layout():
    t = tok("nemotron-h")
    msgs = [Message("system", ["Be brief. /think"]), Message("user", ["  Hi /no_think "]),
            Message("assistant", [" Hello! "])]
    r = t.render(msgs, "k")
    assert r.text == ("<SPECIAL_10>System\nBe brief.\n<SPECIAL_11>User\nHi\n"
                      "<SPECIAL_11>Assistant\nHello!\n<SPECIAL_12>\n")
    [(tokens, trained)] = t.encode([msgs], "k")
    assert trained_text(t, tokens, trained) == ["Hello!\n<SPECIAL_12>\n"]
    # the same text as Megatron-LM's nemotron-nano-v2 rendering of these messages
    from energon_nemotron.megatron_packed.prompt_formats import get_prompt_format

    mlm = get_prompt_format("nemotron-nano-v2").render_conversation(
        [{"role": m.role, "content": m.text} for m in msgs])
    assert "".join(mlm) == r.text


def test_preformatted_and_last_turn_only():
    t = tok("tokenizer")
    msgs = [Message("system", ["<|im_start|>system\n<|im_end|>\n"]),
            Message("user", ["<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"]),
            Message("assistant", ["<think></think>Hello<|im_end|>\n"]),
            Message("user", ["<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"]),
            Message("assistant", ["<think></think>Bye!<|im_end|>\n"])]
    [(tokens, trained)] = t.encode([msgs], "k", preformatted=True)
    assert t.tokenizer.decode(tokens.tolist()) == "".join(m.text for m in msgs)
    assert trained_text(t, tokens, trained) == ["<think></think>Hello<|im_end|>\n", "<think></think>Bye!<|im_end|>\n"]
    [(_, last)] = t.encode([msgs], "k", preformatted=True, last_only=True)
    assert trained_text(t, tokens, last) == ["<think></think>Bye!<|im_end|>\n"]


def test_preformatted_boundary_inside_a_token_is_rejected():
    t = tok("tokenizer")
    text = t.tokenizer.tokenize("The meadow")
    assert len(text) >= 2
    msgs = [Message("user", ["The mea"]), Message("assistant", ["dow"])]
    with pytest.raises(DataError, match=r"^s9: a trained span boundary at character 7 falls inside a token"):
        t.encode([msgs], "s9", preformatted=True)


def test_no_trainable_tokens_and_media_and_unknown_format():
    t = tok("tokenizer")
    with pytest.raises(NoTrainableTokensError, match=r"^s3: no trainable tokens"):
        t.encode([[Message("user", ["only a question"])]], "s3")
    from energon_nemotron.types import MediaPart

    with pytest.raises(DataError, match=r"^s4: the rendered conversation references 1 media items, but the sample has 0"):
        t.encode([[Message("user", ["look", MediaPart("image", 0)]), Message("assistant", ["ok"])]], "s4")
    with pytest.raises(ConfigError, match=r"unknown prompt format 'chatml'; known: nemotron-h, nemotron-h-5p5-reasoning, nemotron6, "
                                          r"nemotron6-moe, tokenizer"):
        ConversationTokenizer(DEMO_TOKENIZER, "chatml")


def test_segments_are_tokenized_separately():
    t = tok("nemotron6")
    a = [Message("user", ["a"]), Message("assistant", ["b"])]
    b = [Message("system", ["s"]), Message("user", ["c"]), Message("assistant", ["d"])]
    out = t.encode([a, b], "k")
    assert [t.tokenizer.decode(x.tolist()) for x, _ in out] == ["".join([t.render(a, "k").text]),
                                                              t.render(b, "k").text]
    assert all(isinstance(m, np.ndarray) and m.dtype == bool for _, m in out)
