"""Text never forges a media placeholder (issue 14, item 8): a placeholder tag in any text that
reaches the tokenizer — reasoning traces, tool results, system prompts, preformatted turns, text a
prompt format produces — is ``reserved_tag``; no placeholder id reaches a batch without its media.
Both input paths; the corpus cases are in ``bad_inputs`` (``reserved-*``)."""

from __future__ import annotations

import json

import pytest
import yaml

from conftest import DEMO_TOKENIZER, write_jsonl
from energon_data import tar_keys
from energon_nemotron.demo.datasets import prepare, write_shards
from energon_nemotron.demo.media import make_image
from energon_nemotron.errors import DataError
from energon_nemotron.loading import build_train_loader
from energon_nemotron.tokenization.reserved import PLACEHOLDER_TOKENS
from energon_nemotron.tokenization import ConversationTokenizer
from energon_nemotron.types import Message

OPTIONS = {"prompt_format": "nemotron6", "seq_length": 1024, "image": {"min_patches": 64, "max_patches": 256}}


def messages(user: str, answer: str = "Fine.", reasoning=None) -> list[Message]:
    return [Message("user", [user]), Message("assistant", [answer], reasoning=reasoning)]


def chat(user, answer, reasoning=None, system=None):
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    return {"json": json.dumps({"messages": msgs + [
        {"role": "assistant", "content": answer, **({"reasoning_content": reasoning} if reasoning else {})}]}).encode()}


def test_reasoning_tag_names_the_message_and_field():
    tok = ConversationTokenizer(DEMO_TOKENIZER, "nemotron6")
    with pytest.raises(DataError, match=r"^s-1: message 1 \(assistant\) contains the reserved media tag <image> "
                                        r"in its reasoning_content") as err:
        tok.encode([messages("Why?", "Because.", reasoning="look at <image> here")], "s-1")
    assert err.value.code == "reserved_tag"


@pytest.mark.parametrize("fmt, user", [
    ("nemotron-h", "Describe <im/thinkage> please"),       # the format removes /think: "<image>"
    ("nemotron-h", "Say <so_/no_thinkembedding>"),
])
def test_a_placeholder_made_by_the_prompt_format_is_caught_by_the_token_check(fmt, user):
    """No text of the sample holds the tag; the rendered text does. Only the token-level check,
    on what is handed to the tokenizer, sees it."""
    tok = ConversationTokenizer(DEMO_TOKENIZER, fmt)
    with pytest.raises(DataError, match=r"^k: the rendered text forms the media placeholder token "
                                        r"<(image|so_embedding)> at character \d+ .* without a media item") as err:
        tok.encode([messages(user)], "k")
    assert err.value.code == "reserved_tag"


def config(tmp_path, mix, on_error, workers):
    cfg = {"tokenizer": str(DEMO_TOKENIZER), "task_encoder": {"name": "nemotron_multimodal", "options": OPTIONS},
           "packing": {"algorithm": "best_fit_decreasing", "buffer_size": 8},
           "data": {"train": {"path": str(mix)}},
           "loader": {"batch_size": 1, "num_workers": workers, "shuffle_buffer_size": None, "on_error": on_error}}
    path = tmp_path / f"{on_error}{workers}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def forged(tmp_path_factory):
    """Good samples (one with a real image), and forgeries in reasoning, tool, system and
    preformatted text (openai_messages, general_conversations, skip_chat_template)."""
    root = tmp_path_factory.mktemp("forged")
    chats = [(f"good-{i}", chat(f"Q{i}?", f"A{i}.", reasoning=f"think {i}")) for i in range(4)]
    chats += [("forged-reasoning", chat("2+2?", "4.", reasoning="carry the <image> one")),
              ("forged-system", chat("Hi?", "Hello.", system="Prefix <so_embedding> every answer")),
              ("forged-tool", {"json": json.dumps({"messages": [
                  {"role": "user", "content": "Weather?"}, {"role": "tool", "content": "<img> sunny"},
                  {"role": "assistant", "content": "Sunny."}]}).encode()})]
    write_shards(root / "chat", chats, 4)
    prepare(root / "chat", {"cooker": "openai_messages"})
    write_shards(root / "reasoning", [chats[0], chats[4]], 4)       # the reasoning forgery alone
    prepare(root / "reasoning", {"cooker": "openai_messages"})
    conv = lambda turns: {"json": json.dumps({"conversations": [{"from": f, "value": v} for f, v in turns]}).encode()}
    pre = [("good-image", {**conv([("human", "<image> What is it?"), ("gpt", " A square.")]), "jpg": make_image(64, 48)}),
           ("forged-preformatted", conv([("human", "Look <so_em"), ("human", "bedding> here"), ("gpt", " Ok.")]))]
    write_shards(root / "pre", pre, 4)
    prepare(root / "pre", {"cooker": "general_conversations"})
    (root / "mix.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend_epochized:\n"
        "      - {repetitions: 1, path: chat}\n"
        "      - {repetitions: 1, path: pre, subflavors: {cooker: general_conversations, skip_chat_template: true}}\n")
    return root, root / "mix.yaml"


@pytest.mark.parametrize("workers", [0, 2])
def test_forged_placeholder_ids_never_reach_a_batch(forged, workers):
    root, mix = forged
    loader = build_train_loader(config(root, mix, "skip", workers), repeat=False)
    from transformers import AutoTokenizer

    vocab = AutoTokenizer.from_pretrained(str(DEMO_TOKENIZER)).get_vocab()
    placeholder_ids = {vocab[t] for t in PLACEHOLDER_TOKENS}
    keys, images = [], 0
    for batch in loader:
        keys += [k for row in batch.sample_keys for k in row]
        for r in range(batch.batch_size):
            tokens = batch.tokens[r].tolist()
            at = {i for i, t in enumerate(tokens) if t in placeholder_ids}
            spans = {i for s in batch.media_spans[r] for i in range(s.token_start, s.token_start + s.placeholder_len)}
            assert at == spans                     # placeholder ids only where a media item put them
            images += len(batch.media_spans[r])
    assert sorted(tar_keys(keys)) == ["good-0", "good-1", "good-2", "good-3", "good-image"] and images == 1
    assert loader.skipped() == {"reserved_tag": 4}


def test_forged_placeholder_under_raise_names_the_sample(forged):
    root, _ = forged
    with pytest.raises(DataError, match=r"^reasoning/parts/data-0\.tar:forged-reasoning: message 1 \(assistant\) contains the reserved media "
                                        r"tag <image> in its reasoning_content") as err:
        list(build_train_loader(config(root, root / "reasoning", "raise", 0), repeat=False))
    assert err.value.code == "reserved_tag"


# -- Megatron-LM path: text only, so a placeholder id has no media to fill it --------------------

ROW = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
                    {"role": "assistant", "content": "A"}]}


def row_with(user: str) -> dict:
    return {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": user},
                         {"role": "assistant", "content": "A"}]}


@pytest.mark.parametrize("fmt, user, reason", [
    ("nemotron-h-aligned", "what is <image>?", r"message 1 \(user\) contains the reserved media tag <image>"),
    ("nemotron-nano-v2", "what is <im/thinkage>?", r"token \d+ of the rendered conversation is the media placeholder <image>"),
])
def test_megatron_row_with_a_placeholder_tag_is_rejected(tmp_path, fmt, user, reason):
    """With a tokenizer that has the placeholder tokens (a Nemotron Omni tokenizer; the demo one).
    For a tokenizer without them the tag is plain text and the row is read."""
    from conftest import FIXTURE_TOKENIZER
    from energon_nemotron.megatron_packed import MegatronSFTPackedDataset, MegatronSFTPackedEncoder

    path = write_jsonl(tmp_path / "r.jsonl.packed", [ROW, row_with(user)])
    with pytest.raises(DataError, match=rf"r\.jsonl\.packed:2#0: {reason}") as err:
        list(MegatronSFTPackedDataset(path, MegatronSFTPackedEncoder(DEMO_TOKENIZER, 128, fmt)))
    assert err.value.code == "reserved_tag"
    assert len(list(MegatronSFTPackedDataset(path, MegatronSFTPackedEncoder(FIXTURE_TOKENIZER, 96, fmt)))) == 2
