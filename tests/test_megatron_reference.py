"""The encoder against transformers' own chat-template rendering and tokenization.

A reference written with ``tokenizer.apply_chat_template`` (Jinja templates equivalent to
Megatron-LM's, rendered by transformers' sandbox; tokenized by transformers) follows Megatron-LM's
``tokenize_conversation`` step by step: whole conversation, then each turn alone, which must match.
Random conversations (hypothesis) through a real byte-level BPE (the demo tokenizer), where turns
often merge across boundaries: the encoder must produce identical tokens and targets, and raise
exactly when the per-turn check fails.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import DEMO_TOKENIZER
from energon_nemotron.errors import DataError
from energon_nemotron.megatron_packed.sft_tokenizer import SFTConversationTokenizer

JINJA = {
    "identity": "{% for m in messages %}{{ m['content'] }}{% endfor %}",
    "nemotron-h-aligned": (
        "{% for m in messages %}"
        "{% if m['role'] == 'system' %}{{ '<SPECIAL_10>System\\n' ~ m['content'].strip() ~ '\\n' }}"
        "{% elif m['role'] == 'user' %}{{ '<SPECIAL_11>User\\n' ~ m['content'].strip() ~ '\\n<SPECIAL_11>Assistant\\n' }}"
        "{% elif m['role'] == 'assistant' %}{{ m['content'].strip() ~ '\\n' }}{% endif %}"
        "{% endfor %}"),
    "nemotron-nano-v2": (
        "{% for m in messages %}{% set c = m['content'] %}"
        "{% if m['role'] == 'system' %}{{ '<SPECIAL_10>System\\n' ~ c.replace('/think', '').replace('/no_think', '').strip() ~ '\\n' }}"
        "{% elif m['role'] == 'user' %}{{ '<SPECIAL_11>User\\n' ~ c.replace('/think', '').replace('/no_think', '').strip() ~ '\\n' }}"
        "{% elif m['role'] == 'assistant' %}{{ '<SPECIAL_11>Assistant\\n' ~ c.strip() ~ '\\n<SPECIAL_12>\\n' }}{% endif %}"
        "{% endfor %}"),
}
PREFIX = {"identity": 0, "nemotron-h-aligned": 0, "nemotron-nano-v2": 3}
_TOKENIZERS: dict = {}


def sft(fmt: str) -> SFTConversationTokenizer:
    if fmt not in _TOKENIZERS:
        _TOKENIZERS[fmt] = SFTConversationTokenizer(DEMO_TOKENIZER, fmt)
    return _TOKENIZERS[fmt]


def hf_ids(tokenizer, conversation, template=None) -> list[int]:
    out = tokenizer.apply_chat_template(conversation, tokenize=True, chat_template=template)
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return list(ids)


def reference(tokenizer, fmt: str, conversation: list[dict]):
    """(tokens, targets) the Megatron-LM way, or None where its per-turn check fails."""
    if fmt == "default":
        ids = hf_ids(tokenizer, conversation)
        return ids, list(ids)
    tokens = hf_ids(tokenizer, conversation, JINJA[fmt])
    targets = list(tokens)
    idx = 0
    for turn in conversation:
        piece = hf_ids(tokenizer, [turn], JINJA[fmt])
        if tokens[idx:idx + len(piece)] != piece:
            return None
        if turn["role"] in ("system", "user", "tool"):
            targets[idx:idx + len(piece)] = [-100] * len(piece)
        else:
            n = min(PREFIX[fmt], len(piece))
            targets[idx:idx + n] = [-100] * n
        idx += len(piece)
    if idx != len(tokens):
        return None
    return tokens, targets


PIECES = list("abc XYZ .,!?\n\t/_é") + ["日本", "The", " the", "/think", "/no_think", "12", "  ", "<SPECIAL_11>"]
TEXT = st.lists(st.sampled_from(PIECES), max_size=12).map("".join)


@st.composite
def conversations(draw):
    conv = []
    if draw(st.booleans()):
        conv.append({"role": "system", "content": draw(TEXT)})
    for _ in range(draw(st.integers(1, 3))):
        conv.append({"role": draw(st.sampled_from(["user", "user", "tool"])), "content": draw(TEXT)})
        conv.append({"role": "assistant", "content": draw(TEXT.filter(len))})
    return conv


@pytest.mark.parametrize("fmt", ["identity", "nemotron-h-aligned", "nemotron-nano-v2", "default"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv=conversations())
def test_tokenize_matches_transformers_reference(fmt, conv, demo_tokenizer):
    want = reference(demo_tokenizer, fmt, conv)
    got = sft(fmt).tokenize([conv], ["sample.jsonl:1#0"])[0]
    if want is None:
        with pytest.raises(DataError, match=r"sample.jsonl:1#0: turn \d+ .*merges across a turn boundary"):
            got.get()
        return
    tokens, targets = got.get()
    assert tokens.dtype == np.int64 and targets.dtype == np.int64
    assert tokens.tolist() == want[0]
    assert targets.tolist() == want[1]


@pytest.mark.parametrize("fmt", ["identity", "nemotron-h-aligned", "nemotron-nano-v2"])
@settings(max_examples=100, deadline=None)
@given(conv=conversations())
def test_python_rendering_equals_jinja_rendering(fmt, conv, demo_tokenizer):
    want = demo_tokenizer.apply_chat_template(conv, tokenize=False, chat_template=JINJA[fmt])
    assert "".join(sft(fmt).render(conv)) == want


def test_a_bpe_merge_across_turns_is_reported_with_the_turn():
    # "." at the end of one identity turn and "The" at the start of the next merge in many BPEs;
    # find a pair that merges in the demo tokenizer and check the error names turn and row.
    tok = sft("identity")
    conv = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": " there"}]
    merged = tok.text.encode("Hi there") != tok.text.encode("Hi") + tok.text.encode(" there")
    got = tok.tokenize([conv], ["f.jsonl:7#0"])[0]
    if merged:
        with pytest.raises(DataError, match=r"^f\.jsonl:7#0: turn 1 \(assistant\)"):
            got.get()
    else:
        assert got.get()[0].tolist() == tok.text.encode("Hi there")
