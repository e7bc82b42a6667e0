"""Messages → token ids and trained-token flags (Energon path), in one tokenizer call per sample
or per buffer of samples.

The prompt format renders the text (each media reference as ``MEDIA_MARKER``) and the trained
character spans. The text between markers is tokenized piece by piece in one call of the Rust
tokenizer (with offsets), so nothing merges across a media reference, and each marker is replaced
by its media item's placeholder ids (never trained). The spans become per-token flags through the
offsets; where a format is strict, a span boundary inside a token is an error, not a guess.
Text never yields a placeholder id: the messages' texts are checked before rendering and the ids of
every piece after tokenization (``tokenization.reserved``; ``reserved_tag``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from energon_nemotron.errors import ConfigError, DataError
from energon_nemotron.tokenization.formats import Rendered, get_prompt_format
from energon_nemotron.tokenization.loading import load_tokenizer
from energon_nemotron.tokenization.reserved import PLACEHOLDER_TOKENS, ReservedTokens
from energon_nemotron.tokenization.tool_rendering import strings_in, tool_texts
from energon_nemotron.types import MEDIA_MARKER, Message

#: strings that would forge a media placeholder (or the marker) if they appeared in text
RESERVED = (MEDIA_MARKER, *PLACEHOLDER_TOKENS)


class NoTrainableTokensError(DataError):
    """A sample whose loss mask would be all zero (nothing to learn from it)."""

    default_code = "no_trainable_tokens"


def piece_flags(enc: Any, spans: Sequence[tuple[int, int]], length: int, strict: bool):
    """Trained flags (bool [n]) of one tokenized piece of ``length`` characters from its character
    ``spans``, and the first strict span boundary that falls inside a token (None if none).

    A token is trained when it overlaps a span (Hugging Face's rule for assistant masks). Only the
    span ends are looked up in the encoding (``char_to_token``, ``token_to_chars``), so the cost
    does not grow with the number of tokens.
    """
    n = len(enc.ids)
    flags = np.zeros(n, dtype=bool)
    for a, b in spans:
        if a >= b:
            continue
        first = next((t for t in (enc.char_to_token(c) for c in range(a, b)) if t is not None), None)
        if first is None:
            continue                  # the span's characters produced no token
        last = next(t for t in (enc.char_to_token(c) for c in range(b - 1, a - 1, -1)) if t is not None)
        while last + 1 < n and enc.token_to_chars(last + 1)[0] < b:
            last += 1                 # a character split over several byte-level tokens
        flags[first:last + 1] = True
        if strict:
            for c in (a, b):
                if 0 < c < length:
                    left, right = enc.char_to_token(c - 1), enc.char_to_token(c)
                    if left is not None and left == right:
                        return flags, c
    return flags, None


@dataclass
class Prepared:
    """One sample ready for the tokenizer call: its segments rendered (``rendered``) and split at the
    media markers (``pieces``, per segment), and its planned ``media`` items in reference order."""

    key: str
    rendered: list[Rendered]
    pieces: list[list[str]]
    media: Sequence[Any]


class ConversationTokenizer:
    """Tokenizes conversations in a named prompt format.

    Args:
        tokenizer: a Hugging Face fast tokenizer or a local directory.
        prompt_format: a registered format name (``tokenizer``, ``nemotron6``, ``nemotron-h``,
            ``nemotron6-moe``, ``nemotron-h-5p5-reasoning``).
        format_options: the format's options (``thinking_trace_format``,
            ``relax_thinking_trace_check``; see ``get_prompt_format``); None or False values are
            not given.
    """

    def __init__(self, tokenizer: Any, prompt_format: str, format_options: Optional[dict] = None) -> None:
        self.tokenizer = load_tokenizer(tokenizer)
        self.backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if self.backend is None:
            raise ConfigError("the Energon path needs a fast (Rust-backed) Hugging Face tokenizer for offsets")
        if self.backend.padding is not None or self.backend.truncation is not None:
            # a copy without them: pieces are encoded one by one, never padded to a batch or cut
            from tokenizers import Tokenizer

            self.backend = Tokenizer.from_str(self.backend.to_str())
            self.backend.no_padding()
            self.backend.no_truncation()
        self.format = get_prompt_format(prompt_format, self.tokenizer, **(format_options or {}))
        self.prompt_format = prompt_format
        # a reserved string only forges a placeholder where the tokenizer makes it a single token
        self.reserved_tokens = ReservedTokens(self.tokenizer)
        self.reserved = [MEDIA_MARKER, *self.reserved_tokens.strings]

    def check_text(self, messages: list[Message], key: str, tools: Sequence[dict] = ()) -> None:
        """No text a cooker hands on may contain the media marker or a placeholder token such as
        ``<image>`` (``reserved_tag``, naming the message and field): content parts, reasoning, tool
        calls (name, id, every string of the arguments), the id a tool result answers, and every
        string of the tool definitions."""
        for i, m in enumerate(messages):
            texts = [("text", p) for p in m.content if isinstance(p, str)]
            if m.reasoning is not None:
                texts.append(("reasoning_content", m.reasoning))
            if m.tool_calls:
                texts.extend(tool_texts(m.tool_calls))
            if m.tool_call_id is not None:
                texts.append(("tool_call_id", m.tool_call_id))
            self._check_fields(texts, key, f"message {i} ({m.role})")
        for k, tool in enumerate(tools):
            self._check_fields(strings_in(tool), key, f"tools[{k}]")

    def _check_fields(self, texts: Sequence[tuple[str, str]], key: str, what: str) -> None:
        for field_name, text in texts:
            tag = self.reserved_tokens.find_in_text(text, (MEDIA_MARKER,))
            if tag is not None:
                shown = "U+E000 (the media marker)" if tag == MEDIA_MARKER else tag
                raise DataError(key, f"{what} contains the reserved media tag {shown} in its {field_name}; "
                                     "media must be referenced as media items", "reserved_tag")

    def check_ids(self, enc: Any, offset: int, text: str, key: str) -> None:
        """The final word: no token of a text piece (its encoding ``enc``, starting at character
        ``offset`` of the rendered ``text``) may be a media placeholder, whatever produced it (a
        prompt format, a chat template, preformatted text)."""
        j = self.reserved_tokens.find_in_ids(enc.ids)
        if j is None:
            return
        c = offset + enc.offsets[j][0]
        token = self.reserved_tokens.ids[enc.ids[j]]
        raise DataError(key, f"the rendered text forms the media placeholder token {token} at character {c} "
                             f"({text[max(0, c - 20):c + len(token) + 20]!r}) without a media item (prompt format "
                             f"{self.prompt_format!r}); media must be referenced as media items", "reserved_tag")

    def render(self, messages: list[Message], key: str, preformatted: bool = False,
               last_only: bool = False, tools: Sequence[dict] = (), tool_boundary: bool = False) -> Rendered:
        """Text (with markers) and trained spans of one conversation (``last_only``: only the last
        trained turn, as the prompt format defines it; ``tool_boundary``: the subflavor
        ``tool_response_as_turn_boundary``, passed on only when set). Tool calls and tool definitions
        need a prompt format: preformatted text with them is an error."""
        self.check_text(messages, key, tools)
        extra = {"tool_boundary": True} if tool_boundary else {}
        return self.format.render_sample(messages, key, preformatted, last_only, tools, **extra)

    def prepare(self, segments: list[list[Message]], key: str, preformatted: bool = False,
                last_only: bool = False, media: Sequence[Any] = (), tools: Sequence[dict] = (),
                tool_boundary: bool = False) -> Prepared:
        """Everything before the tokenizer call (see :meth:`encode`): each segment rendered and split
        at its media markers, the marker count checked against ``media``."""
        rendered = [self.render(m, key, preformatted, last_only, tools, tool_boundary) for m in segments]
        pieces = [r.text.split(MEDIA_MARKER) for r in rendered]
        markers = sum(len(p) - 1 for p in pieces)
        if markers != len(media):
            raise DataError(key, f"the rendered conversation references {markers} media items, but the sample "
                                 f"has {len(media)}: the prompt format dropped or repeated a media reference", "media_reference")
        return Prepared(key, rendered, pieces, media)

    def tokenize(self, prepared: Sequence[Prepared]) -> list[list[Any]]:
        """The text pieces of several prepared samples in one call of the Rust tokenizer (its cache
        and tables stay warm over the call): per sample, its pieces' encodings in order. Each piece
        is encoded on its own (no padding or truncation is set on the backend), so the result is the
        same as one call per sample."""
        flat = [piece for p in prepared for pieces in p.pieces for piece in pieces]
        encodings = self.backend.encode_batch(flat, add_special_tokens=False) if flat else []
        out, at = [], 0
        for p in prepared:
            n = sum(len(pieces) for pieces in p.pieces)
            out.append(encodings[at:at + n])
            at += n
        return out

    def finish(self, prepared: Prepared, encodings: Sequence[Any]) -> list[tuple[np.ndarray, np.ndarray]]:
        """The result of :meth:`encode` from a prepared sample and its pieces' ``encodings``
        (:meth:`tokenize`)."""
        key, media = prepared.key, prepared.media
        out, at, next_media = [], 0, 0
        for si, (r, pieces) in enumerate(zip(prepared.rendered, prepared.pieces)):
            encs = encodings[at:at + len(pieces)]
            at += len(pieces)
            tokens: list[int] = []
            trained: list[np.ndarray] = []
            start = 0
            for k, (piece, enc) in enumerate(zip(pieces, encs)):
                local = [(max(a, start) - start, min(b, start + len(piece)) - start) for a, b in r.spans
                         if a < start + len(piece) and b > start]
                self.check_ids(enc, start, r.text, key)
                flags, bad = piece_flags(enc, local, len(piece), r.strict)
                if bad is not None:
                    c = start + bad
                    raise DataError(key, f"a trained span boundary at character {c} falls inside a token "
                                         f"({r.text[max(0, c - 12):c]!r}|{r.text[c:c + 12]!r}): the tokenizer "
                                         "merges across the turn boundary, so the loss mask would be ambiguous",
                                    "tokenization")
                tokens.extend(enc.ids)
                trained.append(flags)
                start += len(piece) + 1
                if k < len(encs) - 1:
                    item = media[next_media]
                    next_media += 1
                    item.source, item.token_start = si, len(tokens)
                    tokens.extend(item.placeholder)
                    trained.append(np.zeros(len(item.placeholder), dtype=bool))
            flags = np.concatenate(trained) if trained else np.zeros(0, dtype=bool)
            if not flags[1:].any():          # token 0 is never a label
                where = f" (segment {si})" if len(prepared.pieces) > 1 else ""
                raise NoTrainableTokensError(key, f"no trainable tokens{where}: no assistant turn survives "
                                                  f"rendering in prompt format {self.prompt_format!r}")
            out.append((np.asarray(tokens, dtype=np.int64), flags))
        return out

    def encode(self, segments: list[list[Message]], key: str, preformatted: bool = False,
               last_only: bool = False, media: Sequence[Any] = (),
               tools: Sequence[dict] = ()) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per segment: (tokens int64 [n], trained bool [n]).

        ``media``: the planned media items (``PlannedMedia``) in reference order; their
        ``placeholder`` ids replace the markers and their ``source``/``token_start`` are set here.
        ``tools``: the conversation's tool definitions (rendered in every segment).
        Raises ``DataError`` (naming ``key``) for a strict span boundary inside a token, a media
        reference the prompt format dropped or duplicated, and ``NoTrainableTokensError`` for a
        segment with no trained token. The same as :meth:`prepare`, :meth:`tokenize` and
        :meth:`finish` in turn (the packing path runs the middle step over a whole buffer).
        """
        prepared = self.prepare(segments, key, preformatted, last_only, media, tools)
        return self.finish(prepared, self.tokenize([prepared])[0])
