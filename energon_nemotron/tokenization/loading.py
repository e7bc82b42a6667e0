"""Loading Hugging Face tokenizers (offline only) and a thin, fast text → ids encoder."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from energon_nemotron.errors import ConfigError


def load_tokenizer(tokenizer: Any) -> Any:
    """A Hugging Face tokenizer object, or a local directory to load one from (never downloads)."""
    if isinstance(tokenizer, (str, os.PathLike)):
        path = Path(tokenizer)
        if not path.is_dir():
            raise ConfigError(f"tokenizer directory {str(path)!r} does not exist")
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if not hasattr(tokenizer, "convert_tokens_to_ids"):
        raise ConfigError(f"expected a Hugging Face tokenizer or a directory, got {type(tokenizer).__name__}")
    return tokenizer


class TextEncoder:
    """Text → token ids without special tokens, as ``tokenizer(text, add_special_tokens=False)``.

    Calls the Rust ``tokenizers`` backend directly when the tokenizer has one (one native call for
    a whole list of texts), else falls back to the tokenizer's own ``__call__``.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        #: the Rust ``tokenizers.Tokenizer`` behind a fast tokenizer, or None
        self.backend = getattr(tokenizer, "backend_tokenizer", None)

    def encode(self, text: str) -> list[int]:
        """int ids of one text."""
        return self.encode_many([text])[0]

    def encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        """int ids of every text, in order (one native call; offsets are not computed)."""
        if not texts:
            return []
        if self.backend is not None:
            return [e.ids for e in self.backend.encode_batch_fast(list(texts), add_special_tokens=False)]
        return [list(x) for x in self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]]
