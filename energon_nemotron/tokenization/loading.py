"""Loading Hugging Face tokenizers (offline only) and a thin, fast text → ids encoder."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from energon_nemotron.errors import ConfigError


def load_tokenizer(tokenizer: Any) -> Any:
    """A Hugging Face tokenizer object, or a local directory to load one from (never downloads).
    A folder that cannot be loaded is a ``ConfigError`` naming the folder, the file at fault and
    what is wrong with it."""
    if isinstance(tokenizer, (str, os.PathLike)):
        path = Path(tokenizer)
        if not path.is_dir():
            what = "is not a folder" if path.exists() else "does not exist"
            raise ConfigError(f"tokenizer directory {str(path)!r} {what}; {FAST_TOKENIZER_FOLDER}")
        from transformers import AutoTokenizer

        try:
            loaded = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except Exception as e:       # noqa: BLE001 - whatever the folder's files make transformers raise
            raise ConfigError(tokenizer_folder_problem(path, e)) from None
        if not (path / "tokenizer_config.json").is_file():
            raise ConfigError(f"tokenizer {path}: the folder has no tokenizer_config.json: transformers then loads "
                              "tokenizer.json without the special tokens it names (no pad, eos or unk token: "
                              f"padding would pick another id); {FAST_TOKENIZER_FOLDER}")
        return loaded
    if not hasattr(tokenizer, "convert_tokens_to_ids"):
        raise ConfigError(f"expected a Hugging Face tokenizer or a directory, got {type(tokenizer).__name__}")
    return tokenizer


FAST_TOKENIZER_FOLDER = ("the folder must hold a Hugging Face fast tokenizer (tokenizer.json and "
                         "tokenizer_config.json), e.g. saved with tokenizer.save_pretrained(FOLDER)")
#: the JSON files of a tokenizer folder, checked in this order when loading fails
_JSON_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")


def _short(error: BaseException) -> str:
    first = (str(error).strip().splitlines() or [""])[0].rstrip(": ")
    return f"{type(error).__name__}: {first[:200]}"


def tokenizer_folder_problem(path: Path, error: Exception) -> str:
    """Why ``AutoTokenizer`` failed (with ``error``) to load the tokenizer folder ``path``: a JSON
    file that does not parse, a missing ``tokenizer.json``, one the ``tokenizers`` library rejects,
    or else transformers' own error."""
    import json

    for name in _JSON_FILES:
        file = path / name
        if file.is_file():
            try:
                json.loads(file.read_text(encoding="utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                return (f"tokenizer {path}: {name} is not valid JSON ({_short(e)}): the file is truncated or "
                        f"damaged, replace it with a complete copy; {FAST_TOKENIZER_FOLDER}")
    file = path / "tokenizer.json"
    if not file.is_file():
        return (f"tokenizer {path}: the folder has no tokenizer.json (transformers: {_short(error)}); "
                f"{FAST_TOKENIZER_FOLDER}")
    try:
        from tokenizers import Tokenizer

        Tokenizer.from_file(str(file))
    except Exception as e:           # noqa: BLE001 - the tokenizers library's own parse error
        return (f"tokenizer {path}: tokenizer.json is not a tokenizers file ({_short(e)}); "
                f"{FAST_TOKENIZER_FOLDER}")
    return (f"tokenizer {path}: transformers cannot load the folder ({_short(error)}); check "
            f"tokenizer_config.json; {FAST_TOKENIZER_FOLDER}")


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
