"""Text never produces a media placeholder token (``reserved_tag``), on both input paths.

Media placeholders (``<img>``, ``<image>``, ``</img>``, ``<so_start>``, ``<so_embedding>``,
``<so_end>``) are spliced in by media items only; the model replaces their ids with embeddings. The
same string in a sample's text would become the same id where the tokenizer makes it one token: a
forged placeholder in a batch without media, or one media item too many. Two checks:

- the texts of a sample (message contents, reasoning), before rendering, so the error names the
  message and the field (:meth:`ReservedTokens.find_in_text`);
- the token ids of all text handed to the tokenizer, after templating (:meth:`ReservedTokens.find_in_ids`).
  This is the final word: it covers whatever a prompt format, chat template or preformatted text
  adds, and strings that only become a placeholder once rendered.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

import numpy as np

#: placeholder token strings that must be single tokens of the tokenizer (and never appear in text)
PLACEHOLDER_TOKENS = ("<img>", "</img>", "<image>", "<so_start>", "<so_embedding>", "<so_end>")

__all__ = ["PLACEHOLDER_TOKENS", "ReservedTokens"]


class ReservedTokens:
    """The placeholder tokens that text could forge with ``tokenizer`` (those that are single tokens
    of its vocabulary: the others never tokenize to a placeholder id)."""

    def __init__(self, tokenizer: Any) -> None:
        vocab = tokenizer.get_vocab()
        #: id -> placeholder token string
        self.ids: dict[int, str] = {vocab[t]: t for t in PLACEHOLDER_TOKENS if t in vocab}
        #: the placeholder strings that are single tokens
        self.strings: tuple[str, ...] = tuple(t for t in PLACEHOLDER_TOKENS if t in vocab)

    def find_in_text(self, text: str, extra: Iterable[str] = ()) -> Optional[str]:
        """The first reserved string (``self.strings`` and ``extra``) that ``text`` contains, or None."""
        return next((t for t in (*extra, *self.strings) if t in text), None)

    def find_in_ids(self, ids: Any) -> Optional[int]:
        """Index of the first placeholder id in ``ids`` (a list of ints or an int array [n]), or None."""
        if not self.ids:
            return None
        if isinstance(ids, np.ndarray):
            hits = np.flatnonzero(np.isin(ids, np.fromiter(self.ids, dtype=np.int64)))
            return int(hits[0]) if hits.size else None
        if self.ids.keys().isdisjoint(ids):
            return None
        return next(i for i, t in enumerate(ids) if t in self.ids)
