"""Conversation → (tokens, targets), exactly as Megatron-LM's ``SFTTokenizer.tokenize_conversation``.

Masked formats: the conversation's text is tokenized whole; each turn is also tokenized on its own
and the turns' tokens must concatenate to the whole tokenization (else ``DataError``, where
Megatron-LM raises an ``AssertionError``). Targets equal tokens except -100 on system/user/tool
turns and on the first ``assistant_prefix_len`` tokens of each assistant turn. ``default`` (and
unmasked ``identity``) trains every token. All texts of a row go to the Rust tokenizer in at most
two native calls: the turns, then the whole conversations, except those whose whole tokenization
is provably the turns' concatenation (``tokenization.boundaries``: e.g. a Qwen2/Llama-3 style
tokenizer where every turn ends with a line break), which are not tokenized twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Any, Optional, Sequence

import numpy as np

from energon_nemotron.errors import ConfigError, DataError
from energon_nemotron.megatron_packed.conversation import check_turn_order
from energon_nemotron.megatron_packed.prompt_formats import (
    IDENTITY_UNMASKED,
    PROMPT_ROLES,
    MegatronPromptFormat,
    get_prompt_format,
)
from energon_nemotron.tokenization.boundaries import TurnBoundaries
from energon_nemotron.tokenization.loading import TextEncoder, load_tokenizer
from energon_nemotron.batch import IGNORE_INDEX


@dataclass
class TokenizedConversation:
    """One conversation's ``tokens`` and ``targets`` (int64 [n]), or the error that prevents them.

    ``error`` is raised only when the conversation is used (Megatron-LM never tokenizes the
    conversations a truncation drops, so their problems must not fail the row either).
    """

    tokens: Optional[np.ndarray]
    targets: Optional[np.ndarray]
    error: Optional[DataError] = None

    def get(self) -> tuple[np.ndarray, np.ndarray]:
        if self.error is not None:
            raise self.error
        return self.tokens, self.targets


def resolve_pad_id(tokenizer: Any, fmt: MegatronPromptFormat, pad_token: Optional[str],
                   allow_eos_pad: bool) -> int:
    """The pad id for ``fmt``: ``pad_token`` if given, else the format's (``default``: the
    tokenizer's pad token, else EOS). Missing from the vocabulary, or equal to EOS without
    ``allow_eos_pad``, is a ``ConfigError``."""
    name = pad_token if pad_token is not None else fmt.pad_token
    eos = tokenizer.eos_token_id
    if name is None:
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
        origin = "the tokenizer's pad token" if tokenizer.pad_token_id is not None else "EOS (the tokenizer has no pad token)"
        if pad_id is None:
            raise ConfigError("no pad token: the tokenizer has neither a pad nor an EOS token; pass pad_token=")
    else:
        pad_id = tokenizer.get_vocab().get(name)
        origin = repr(name)
        if pad_id is None:
            raise ConfigError(f"pad token {name!r} (prompt format {fmt.name!r}) is not a token of this "
                              "tokenizer's vocabulary; pass pad_token= with one that is")
    if pad_id == eos and not allow_eos_pad:
        raise ConfigError(f"pad id {pad_id} ({origin}) equals the EOS id: every EOS label would be masked "
                          "out of the loss. Pass a distinct pad_token=, or allow_eos_pad=True to accept "
                          "Megatron-LM's behaviour")
    return int(pad_id)


class SFTConversationTokenizer:
    """Tokenizes conversations in one Megatron-LM prompt format.

    Args:
        tokenizer: a Hugging Face tokenizer or a local directory.
        prompt_format: ``identity`` | ``nemotron-h-aligned`` | ``nemotron-nano-v2`` | ``default``.
        identity_masks_prompt: False gives Megatron-LM v0.18–v0.19 ``identity`` (all trained).
        pad_token: overrides the format's pad token.
        allow_eos_pad: accept a pad id equal to EOS (Megatron-LM ``default`` without a pad token).
    """

    def __init__(self, tokenizer: Any, prompt_format: str = "identity", identity_masks_prompt: bool = True,
                 pad_token: Optional[str] = None, allow_eos_pad: bool = False) -> None:
        self.tokenizer = load_tokenizer(tokenizer)
        self.text = TextEncoder(self.tokenizer)
        try:
            fmt = get_prompt_format(prompt_format)
        except KeyError as e:
            raise ConfigError(str(e.args[0])) from None
        if fmt.name == "identity" and not identity_masks_prompt:
            fmt = IDENTITY_UNMASKED
        if fmt.render is None and not getattr(self.tokenizer, "chat_template", None):
            raise ConfigError(f"prompt format {fmt.name!r} needs a tokenizer with a chat template")
        self.format = fmt
        self.pad_id = resolve_pad_id(self.tokenizer, fmt, pad_token, allow_eos_pad)
        self.eos_id = self.tokenizer.eos_token_id
        self.boundaries = TurnBoundaries(self.text.backend)

    # -- rendering -------------------------------------------------------------------------------
    def render(self, conversation: list[dict]) -> list[str]:
        """Per-message texts (``default``: one text for the whole conversation)."""
        if self.format.render is None:
            return [self.tokenizer.apply_chat_template(conversation, tokenize=False,
                                                       add_generation_prompt=False)]
        return self.format.render_conversation(conversation)

    # -- tokenization ----------------------------------------------------------------------------
    def tokenize(self, conversations: list[list[dict]], wheres: Sequence[Optional[str]]
                 ) -> list[TokenizedConversation]:
        """Tokens and targets of every conversation (errors deferred, see above); ``wheres[i]``
        names conversation i in errors (e.g. ``"train.jsonl.packed:12#1"``)."""
        rendered = [self.render(c) for c in conversations]
        if not self.format.masked:
            whole = self.text.encode_many(["".join(r) for r in rendered])
            return [TokenizedConversation(a, a.copy()) for a in (np.asarray(ids, dtype=np.int64) for ids in whole)]
        turns = self.text.encode_many(list(chain.from_iterable(rendered)))
        # the whole conversation's tokens: the turns' where the tokenizer provably splits at every
        # turn boundary (tokenization.boundaries), else one more tokenizer call for those only
        derived = [self.boundaries.concatenates(r) for r in rendered]
        again = iter(self.text.encode_many(["".join(r) for r, d in zip(rendered, derived) if not d]))
        out, t = [], 0
        for conv, derive, where in zip(conversations, derived, wheres):
            turn_ids = turns[t:t + len(conv)]
            t += len(conv)
            ids = list(chain.from_iterable(turn_ids)) if derive else next(again)
            try:
                check_turn_order(conv, where)
                out.append(self._targets(conv, ids, turn_ids, where))
            except DataError as e:
                out.append(TokenizedConversation(None, None, e))
        return out

    def _targets(self, conv: list[dict], ids: list[int], turn_ids: list[list[int]],
                 where: Optional[str]) -> TokenizedConversation:
        if list(chain.from_iterable(turn_ids)) != ids:
            raise self._mismatch(conv, ids, turn_ids, where)
        tokens = np.asarray(ids, dtype=np.int64)
        targets = tokens.copy()
        prefix = self.format.assistant_prefix_len
        idx = 0
        for m, piece in zip(conv, turn_ids):
            n = len(piece)
            if m["role"] in PROMPT_ROLES:
                targets[idx:idx + n] = IGNORE_INDEX
            elif prefix:
                targets[idx:idx + min(prefix, n)] = IGNORE_INDEX
            idx += n
        return TokenizedConversation(tokens, targets)

    def _mismatch(self, conv, ids, turn_ids, where) -> DataError:
        idx = 0
        for ti, piece in enumerate(turn_ids):
            got = ids[idx:idx + len(piece)]
            if got != piece:
                show = self.tokenizer.convert_ids_to_tokens
                return DataError(where, (
                    f"turn {ti} ({conv[ti]['role']}): tokenized alone it gives "
                    f"{show(piece[:8])}{'...' if len(piece) > 8 else ''} but inside the conversation "
                    f"{show(got[:8])}{'...' if len(got) > 8 else ''}; the tokenizer merges across a turn "
                    "boundary (per-turn tokenization must concatenate to the whole conversation's, as "
                    "Megatron-LM's SFTTokenizer requires). End turns at a token boundary, e.g. with a newline"), "tokenization")
            idx += len(piece)
        return DataError(where, f"turn tokens cover {idx} of {len(ids)} tokens", "tokenization")

    def count_tokens(self, conversation: list[dict], where: Optional[str] = None) -> int:
        """Tokens of one conversation (raises its ``DataError`` if it cannot be tokenized)."""
        tokens, _ = self.tokenize([conversation], [where])[0].get()
        return int(tokens.shape[0])
