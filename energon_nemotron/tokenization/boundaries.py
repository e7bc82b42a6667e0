"""When the tokens of a concatenation are the concatenation of the parts' tokens, provably.

Megatron-LM's ``SFTTokenizer`` tokenizes a conversation whole and each turn alone, and requires the
turns' tokens to concatenate to the whole's. Where the tokenizer's pipeline is known to split at a
turn boundary, the whole tokenization *is* that concatenation and need not be computed. This module
decides, from the tokenizer's own JSON and the texts at each boundary, where that is proven; every
other conversation is tokenized whole as before.

The proof for a boundary between a left text ``L`` and a right text ``R``:

- normalizer none or NFC: a line break (``\\r``, ``\\n``) is a starter with no compositions, so
  NFC(L + R) = NFC(L) + NFC(R) when ``L`` ends with one.
- added tokens: none strips whitespace on its left (``lstrip``), none holds a line break before its
  last character, so no added token spans or absorbs a line-break boundary; for the one-character
  pattern below, none strips whitespace or needs a word boundary (``lstrip``, ``rstrip``,
  ``single_word``), and no added token's text spans the boundary (checked per boundary).
- pre-tokenizer: ``Split`` (behaviour ``Isolated``) with one of the known patterns, alone or followed by
  ``ByteLevel(use_regex=False)`` (a per-piece byte mapping):

  - the Qwen2 / Llama-3 pattern (``(?i:'s|...)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}(\\{1,3\\})?| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|
    \\s*[\\r\\n]+|\\s+(?!\\S)|\\s+``): with ``L`` ending in a line break and ``R`` starting with a
    character that is not whitespace, no alternative can match across the boundary (a line break
    is only ever matched by whitespace runs or a trailing ``[\\r\\n]*``, none of which takes a
    non-whitespace character after it), a match inside ``L`` sees the same characters as in ``L``
    alone (the only look-ahead, ``(?!\\S)``, is tried after ``\\s*[\\r\\n]+``, which takes every
    whitespace run ending in a line break), and the pattern has no look-behind, so ``R``'s matches
    are those of ``R`` alone;
  - one character per piece (``[\\s\\S]``, normalizer none): every boundary is a split.

- model: BPE (without dropout) or WordLevel, applied per piece, so equal pieces give equal ids.
  Post-processing is not applied (``add_special_tokens=False``).
"""

from __future__ import annotations

import json
from typing import Any, Optional, Sequence

#: the Qwen2 pattern and the Llama-3 one (``\p{N}{1,3}``), as tokenizer.json spells them
_LINE_BREAK_PATTERNS = frozenset(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|" + digits + r"| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+"
    for digits in (r"\p{N}", r"\p{N}{1,3}"))
_EVERY_CHARACTER_PATTERNS = frozenset({r"[\s\S]"})
_MODELS = frozenset({"BPE", "WordLevel"})
#: Unicode White_Space (what ``\s`` matches), besides what ``str.isspace`` already says
_WHITE_SPACE = frozenset("\t\n\x0b\x0c\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000"
                         + "".join(chr(c) for c in range(0x2000, 0x200B)))


def _split_pattern(pre: Optional[dict]) -> Optional[str]:
    """The regex of a ``Split`` (Isolated, not inverted) pre-tokenizer, alone or followed by a
    ``ByteLevel`` without its own regex; None for any other pre-tokenizer."""
    if pre is None:
        return None
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else [pre]
    if not steps or steps[0].get("type") != "Split":
        return None
    split = steps[0]
    if split.get("behavior") != "Isolated" or split.get("invert") or "Regex" not in (split.get("pattern") or {}):
        return None
    for step in steps[1:]:
        if step.get("type") != "ByteLevel" or step.get("use_regex", True):
            return None
    return split["pattern"]["Regex"]


class TurnBoundaries:
    """Whether a tokenizer's tokens of concatenated texts are the concatenation of each text's
    tokens, decided per boundary (see the module docstring). ``kind`` is ``"line_break"`` (proven
    where the left text ends with a line break and the right one starts with a non-whitespace
    character), ``"every_character"`` (proven at every boundary) or None (never proven here)."""

    def __init__(self, backend: Any) -> None:
        self.added: tuple[str, ...] = ()
        self.kind = self._kind(json.loads(backend.to_str())) if backend is not None else None

    def _kind(self, spec: dict) -> Optional[str]:
        normalizer = spec.get("normalizer")
        if normalizer is not None and normalizer.get("type") != "NFC":
            return None
        model = spec.get("model") or {}
        if model.get("type") not in _MODELS or model.get("dropout"):
            return None
        added = spec.get("added_tokens") or ()
        if any(a.get("lstrip") or any(c in a.get("content", "")[:-1] for c in "\r\n") for a in added):
            return None
        pattern = _split_pattern(spec.get("pre_tokenizer"))
        if pattern in _LINE_BREAK_PATTERNS:
            return "line_break"
        if pattern in _EVERY_CHARACTER_PATTERNS and normalizer is None and \
                not any(a.get("rstrip") or a.get("single_word") for a in added):
            self.added = tuple(a["content"] for a in added if len(a.get("content", "")) > 1)
            return "every_character"
        return None

    def concatenates(self, parts: Sequence[str]) -> bool:
        """True where the tokens of ``"".join(parts)`` are proven to be the parts' tokens in order
        (every part non-empty)."""
        if self.kind is None or not all(parts):
            return False
        for left, right in zip(parts, parts[1:]):
            if self.kind == "line_break":
                if left[-1] not in "\r\n" or right[0].isspace() or right[0] in _WHITE_SPACE:
                    return False
            elif self._added_across(left, right):
                return False
        return True

    def _added_across(self, left: str, right: str) -> bool:
        """Whether an added token's text starts in ``left`` and ends in ``right``."""
        for t in self.added:
            window = left[-(len(t) - 1):] + right[:len(t) - 1]
            start = window.find(t)
            while start != -1:
                if start < min(len(t) - 1, len(left)) < start + len(t):
                    return True
                start = window.find(t, start + 1)
        return False
