"""Messages → token ids and trained-token flags (Energon path), in one tokenizer call per sample.

The prompt format renders the text (each media reference as ``MEDIA_MARKER``) and the trained
character spans. The text between markers is tokenized piece by piece in one call of the Rust
tokenizer (with offsets), so nothing merges across a media reference, and each marker is replaced
by its media item's placeholder ids (never trained). The spans become per-token flags through the
offsets; where a format is strict, a span boundary inside a token is an error, not a guess.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from energon_nemotron.errors import ConfigError, DataError
from energon_nemotron.tokenization.formats import Rendered, get_prompt_format, render_preformatted
from energon_nemotron.tokenization.loading import load_tokenizer
from energon_nemotron.tokenization.spans import misaligned, token_mask_from_spans
from energon_nemotron.types import MEDIA_MARKER, Message

#: strings that would forge a media placeholder (or the marker) if they appeared in text
RESERVED = (MEDIA_MARKER, "<img>", "</img>", "<image>", "<so_start>", "<so_embedding>", "<so_end>")


class NoTrainableTokensError(DataError):
    """A sample whose loss mask would be all zero (nothing to learn from it)."""

    default_code = "no_trainable_tokens"


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
        vocab = self.tokenizer.get_vocab()
        # a reserved string only forges a placeholder where the tokenizer makes it a single token
        self.reserved = [t for t in RESERVED if t == MEDIA_MARKER or t in vocab]

    def check_text(self, messages: list[Message], key: str) -> None:
        """No text part may contain the media marker or a placeholder token such as ``<image>``."""
        for i, m in enumerate(messages):
            for part in m.content:
                if isinstance(part, str):
                    for tag in self.reserved:
                        if tag in part:
                            shown = "U+E000 (the media marker)" if tag == MEDIA_MARKER else tag
                            raise DataError(key, f"message {i} ({m.role}) contains the reserved media tag "
                                                 f"{shown} in its text; media must be referenced as media items", "reserved_tag")

    def render(self, messages: list[Message], key: str, preformatted: bool = False,
               last_only: bool = False) -> Rendered:
        """Text (with markers) and trained spans of one conversation (``last_only``: only the last
        trained turn)."""
        self.check_text(messages, key)
        rendered = render_preformatted(messages) if preformatted else self.format.render(messages, key)
        if last_only:
            rendered.spans = rendered.spans[-1:]
        return rendered

    def encode(self, segments: list[list[Message]], key: str, preformatted: bool = False,
               last_only: bool = False, media: Sequence[Any] = ()) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per segment: (tokens int64 [n], trained bool [n]).

        ``media``: the planned media items (``PlannedMedia``) in reference order; their
        ``placeholder`` ids replace the markers and their ``source``/``token_start`` are set here.
        Raises ``DataError`` (naming ``key``) for a strict span boundary inside a token, a media
        reference the prompt format dropped or duplicated, and ``NoTrainableTokensError`` for a
        segment with no trained token.
        """
        rendered = [self.render(m, key, preformatted, last_only) for m in segments]
        pieces_per_segment = [r.text.split(MEDIA_MARKER) for r in rendered]
        markers = sum(len(p) - 1 for p in pieces_per_segment)
        if markers != len(media):
            raise DataError(key, f"the rendered conversation references {markers} media items, but the sample "
                                 f"has {len(media)}: the prompt format dropped or repeated a media reference", "media_reference")
        flat = [piece for pieces in pieces_per_segment for piece in pieces]
        encodings = self.backend.encode_batch(flat, add_special_tokens=False)
        out, at, next_media = [], 0, 0
        for si, (r, pieces) in enumerate(zip(rendered, pieces_per_segment)):
            encs = encodings[at:at + len(pieces)]
            at += len(pieces)
            # offsets of every text token in the coordinates of the rendered text
            offsets, start = [], 0
            for piece, enc in zip(pieces, encs):
                offsets.extend((a + start, b + start) for a, b in enc.offsets)
                start += len(piece) + 1
            if r.strict:
                bad = misaligned(offsets, [b for span in r.spans for b in span])
                if bad:
                    c = bad[0]
                    raise DataError(key, f"a trained span boundary at character {c} falls inside a token "
                                         f"({r.text[max(0, c - 12):c]!r}|{r.text[c:c + 12]!r}): the tokenizer "
                                         "merges across the turn boundary, so the loss mask would be ambiguous", "tokenization")
            text_trained = token_mask_from_spans(offsets, r.spans)
            tokens: list[int] = []
            trained: list[np.ndarray] = []
            used = 0
            for k, enc in enumerate(encs):
                n = len(enc.ids)
                tokens.extend(enc.ids)
                trained.append(text_trained[used:used + n])
                used += n
                if k < len(encs) - 1:
                    item = media[next_media]
                    next_media += 1
                    item.source, item.token_start = si, len(tokens)
                    tokens.extend(item.placeholder)
                    trained.append(np.zeros(len(item.placeholder), dtype=bool))
            flags = np.concatenate(trained) if trained else np.zeros(0, dtype=bool)
            if not flags[1:].any():          # token 0 is never a label
                where = f" (segment {si})" if len(segments) > 1 else ""
                raise NoTrainableTokensError(key, f"no trainable tokens{where}: no assistant turn survives "
                                                  f"rendering in prompt format {self.prompt_format!r}")
            out.append((np.asarray(tokens, dtype=np.int64), flags))
        return out
