"""Property-based fuzzing (hypothesis) of tokenization and packing with random conversations.

Invariants: the tokens decode back to the rendered text; the trained tokens cover exactly the
trained character spans (assistant content) and nothing else; every sample is placed in exactly
one pack and no pack exceeds its capacity. Errors are allowed only as ``DataError``s."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import DEMO_TOKENIZER
from energon_nemotron.errors import DataError
from energon_nemotron.tokenization.conversation import RESERVED, ConversationTokenizer
from energon_nemotron.types import Message

_TOK: dict = {}


def tok(fmt):
    if fmt not in _TOK:
        _TOK[fmt] = ConversationTokenizer(DEMO_TOKENIZER, fmt)
    return _TOK[fmt]


UNICODE = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\ue000"), max_size=60)
PIECES = st.sampled_from(["", " ", "\n", "\n\n", "  ", "Hello", "The end.", "日本語", "émoji 🙂", "<think>", "</think>",
                          "/think", "tab\there", "12345", "<|im_end|>", "<SPECIAL_11>"])
TEXT = st.one_of(UNICODE, st.lists(PIECES, max_size=8).map("".join),
                 st.integers(200, 1500).map(lambda n: "long text " * (n // 10)))


@st.composite
def conversations(draw):
    msgs = []
    if draw(st.booleans()):
        msgs.append(Message("system", [draw(TEXT)]))
    for _ in range(draw(st.integers(1, 4))):
        msgs.append(Message(draw(st.sampled_from(["user", "user", "tool"])), [draw(TEXT)]))
        msgs.append(Message("assistant", [draw(TEXT)]))
    return [m for m in msgs if not any(r in m.text for r in RESERVED)] or [Message("user", ["q"]),
                                                                           Message("assistant", ["a"])]


MODES = [("nemotron6", False), ("nemotron-h", False), ("tokenizer", False), ("tokenizer", True)]


@pytest.mark.parametrize("fmt, preformatted", MODES)
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv=conversations(), last_only=st.booleans())
def test_tokenization_invariants(fmt, preformatted, conv, last_only):
    t = tok(fmt)
    try:
        rendered = t.render(conv, "fuzz", preformatted, last_only)
        [(tokens, trained)] = t.encode([conv], "fuzz", preformatted=preformatted, last_only=last_only)
    except DataError as e:
        assert e.code in ("tokenization", "no_trainable_tokens", "invalid_thinking"), e
        return
    assert tokens.dtype == np.int64 and trained.dtype == bool and tokens.shape == trained.shape
    text = t.tokenizer.decode(tokens.tolist(), skip_special_tokens=False, clean_up_tokenization_spaces=False)
    assert text == rendered.text
    enc = t.backend.encode(rendered.text, add_special_tokens=False)
    assert enc.ids == tokens.tolist()
    in_span = np.zeros(len(rendered.text), dtype=bool)
    for a, b in rendered.spans:
        in_span[a:b] = True
    covered = np.zeros(len(rendered.text), dtype=bool)
    for (a, b), on in zip(enc.offsets, trained.tolist()):
        if on:
            covered[a:b] = True
            if rendered.strict:                # trained tokens lie inside assistant content
                assert in_span[a:b].all()
        elif rendered.strict and b > a:
            assert not in_span[a:b].any()        # and nothing of it is left untrained
    assert covered[in_span].all()
    # every assistant turn has a span (preformatted: unless its text is empty; cookers reject those)
    n_assistant = sum(1 for m in conv if m.role == "assistant" and (m.text or not preformatted))
    assert len(rendered.spans) == (min(1, n_assistant) if last_only else n_assistant)


@pytest.mark.parametrize("algorithm", ["best_fit_decreasing", "first_fit_decreasing", "first_fit_shuffle",
                                       "balanced_greedy_knapsack"])
@settings(max_examples=60, deadline=None)
@given(costs=st.lists(st.integers(1, 512), min_size=1, max_size=80), limit=st.one_of(st.none(), st.integers(1, 6)))
def test_encoder_packs_every_sample_once_within_capacity(algorithm, costs, limit):
    from energon_nemotron.config import PackingConfig
    from energon_nemotron.encoders import NemotronMultimodalTaskEncoder
    from energon_nemotron.types import EncodedSample

    enc = _encoder(algorithm, limit)
    samples = [EncodedSample(__key__=f"s{i}", __restore_key__=(), sources=[], cost=c) for i, c in enumerate(costs)]
    packs = enc.select_samples_to_pack(samples)
    keys = sorted(s.__key__ for p in packs for s in p)
    assert keys == sorted(s.__key__ for s in samples)
    assert all(sum(s.cost for s in p) <= 512 for p in packs)
    assert all(len(p) <= limit for p in packs) if limit else True
    assert packs == enc.select_samples_to_pack(samples)          # deterministic


_ENC: dict = {}


def _encoder(algorithm, limit):
    from energon_nemotron.config import PackingConfig
    from energon_nemotron.encoders import NemotronMultimodalTaskEncoder

    if (algorithm, limit) not in _ENC:
        _ENC[algorithm, limit] = NemotronMultimodalTaskEncoder(
            DEMO_TOKENIZER, {"seq_length": 512},
            packing=PackingConfig(algorithm=algorithm, buffer_size=80, max_sequences_per_bin=limit))
    return _ENC[algorithm, limit]
