"""Messages → token ids and trained-token flags (Energon path), in one tokenizer pass per segment.

The prompt format renders the text and the trained character spans; one call of the Rust
tokenizer (with offsets) tokenizes every segment of a sample; the spans become per-token flags.
Where a format is strict, a span boundary inside a token is an error rather than a guess.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from energon_nemotron.errors import ConfigError, DataError
from energon_nemotron.tokenization.formats import Rendered, get_prompt_format, render_preformatted
from energon_nemotron.tokenization.loading import load_tokenizer
from energon_nemotron.tokenization.spans import misaligned, token_mask_from_spans
from energon_nemotron.types import Message


class NoTrainableTokensError(DataError):
    """A sample whose loss mask would be all zero (nothing to learn from it)."""


class ConversationTokenizer:
    """Tokenizes conversations in a named prompt format.

    Args:
        tokenizer: a Hugging Face fast tokenizer or a local directory.
        prompt_format: a registered format name (``tokenizer``, ``nemotron6``, ``nemotron-h``).
    """

    def __init__(self, tokenizer: Any, prompt_format: str) -> None:
        self.tokenizer = load_tokenizer(tokenizer)
        self.backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if self.backend is None:
            raise ConfigError("the Energon path needs a fast (Rust-backed) Hugging Face tokenizer for offsets")
        self.format = get_prompt_format(prompt_format, self.tokenizer)
        self.prompt_format = prompt_format

    def render(self, messages: list[Message], key: str, preformatted: bool = False,
               last_only: bool = False) -> Rendered:
        """Text and trained spans of one conversation (``last_only``: only the last trained turn)."""
        for i, m in enumerate(messages):
            if m.media_parts:
                raise DataError(key, f"message {i} references media; this encoder handles text only")
        rendered = render_preformatted(messages) if preformatted else self.format.render(messages, key)
        if last_only:
            rendered.spans = rendered.spans[-1:]
        return rendered

    def encode(self, segments: list[list[Message]], key: str, preformatted: bool = False,
               last_only: bool = False) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per segment: (tokens int64 [n], trained bool [n]).

        Raises ``DataError`` (naming ``key``) for a strict span boundary inside a token and
        ``NoTrainableTokensError`` for a segment with no trained token.
        """
        rendered = [self.render(m, key, preformatted, last_only) for m in segments]
        encodings = self.backend.encode_batch([r.text for r in rendered], add_special_tokens=False)
        out = []
        for si, (r, enc) in enumerate(zip(rendered, encodings)):
            offsets = enc.offsets
            if r.strict:
                bad = misaligned(offsets, [b for span in r.spans for b in span])
                if bad:
                    c = bad[0]
                    raise DataError(key, f"a trained span boundary at character {c} falls inside a token "
                                         f"({r.text[max(0, c - 12):c]!r}|{r.text[c:c + 12]!r}): the tokenizer "
                                         "merges across the turn boundary, so the loss mask would be ambiguous")
            trained = token_mask_from_spans(offsets, r.spans)
            if not trained[1:].any():       # token 0 is never a label
                where = f" (segment {si})" if len(segments) > 1 else ""
                raise NoTrainableTokensError(key, f"no trainable tokens{where}: no assistant turn survives "
                                                  f"rendering in prompt format {self.prompt_format!r}")
            out.append((np.asarray(enc.ids, dtype=np.int64), trained))
        return out
