"""Untrusted JSON, read safely on both input paths: a nesting limit checked before parsing, and the
strings a tokenizer cannot take.

- Nesting deeper than ``MAX_JSON_DEPTH`` levels is ``json_too_deep``. ``json.loads`` recurses once
  per level and ends in a ``RecursionError`` near 1000 levels (a 2 KB sample), which Energon treats
  as fatal; so the depth is bounded first, without recursion and without parsing
  (:func:`json_depth`), and the limit is far below the interpreter's.
- A lone UTF-16 surrogate (``"\\ud800"`` in JSON decodes to a code point UTF-8 cannot encode) in any
  string or key is ``lone_surrogate``; U+0000 (escaped, or a raw NUL byte) is ``nul_character``
  (:func:`check_strings`, :func:`check_json_text`).

Errors are ``DataError``s naming the sample (``where``) and, for strings, the field by its JSON path
(``messages[2].reasoning_content``).
"""

from __future__ import annotations

import json
import re
from typing import Any, Optional

import numpy as np

from energon_nemotron.errors import DataError

#: deepest nesting of arrays and objects a sample may have (a conversation needs about 5)
MAX_JSON_DEPTH = 100

# A JSON string, or an unterminated one running to the end of the text: this never fails once it
# starts at a quote, so removing strings is one linear pass whatever the input.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
#: a NUL character or a surrogate code point in a string
_BAD_CHAR = re.compile("[\x00\ud800-\udfff]")
#: what a JSON text needs to decode to NUL or a surrogate: the escape, or the raw character
_MAYBE_BAD = re.compile(r"\\u(?:0000|[dD][89a-fA-F])|[\x00\ud800-\udfff]")


def json_depth(text: str | bytes, limit: int = MAX_JSON_DEPTH) -> int:
    """The nesting depth of JSON ``text`` (UTF-8 bytes or str), computed from its brackets outside
    strings, without parsing; texts with at most ``limit`` opening brackets return their count
    (a bound) at once. For invalid JSON the result bounds the depth ``json.loads`` reaches before
    it fails, so ``json_depth(t) <= limit`` guarantees ``json.loads(t)`` recurses at most ``limit``
    levels."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    openers = data.count(b"[") + data.count(b"{")
    if openers <= limit:
        return openers
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKET)
    if not brackets:
        return 0
    codes = np.frombuffer(brackets, dtype=np.uint8)
    steps = np.where((codes == ord("[")) | (codes == ord("{")), 1, -1).astype(np.int32)
    return int(max(0, np.cumsum(steps).max()))


def check_depth(text: str | bytes, where: Optional[str], what: Optional[str] = None) -> None:
    """``DataError`` (``json_too_deep``) when JSON ``text`` nests deeper than ``MAX_JSON_DEPTH``
    (``what`` names the text in the reason, e.g. ``"json"``)."""
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise DataError(where, f"{what or 'the JSON'} is nested {depth} levels deep, over the limit of "
                               f"{MAX_JSON_DEPTH} levels (MAX_JSON_DEPTH); such a sample cannot be read "
                               "safely: flatten it or remove it", "json_too_deep")


def check_json_text(text: str | bytes, where: Optional[str], what: Optional[str] = None) -> None:
    """What is checked on a JSON text before it is parsed: a raw NUL byte (``nul_character``; JSON
    cannot hold one, and it is what a NUL in the text most likely is) and the nesting limit
    (:func:`check_depth`)."""
    nul = text.find(b"\x00" if isinstance(text, (bytes, bytearray)) else "\x00")
    if nul >= 0:
        raise DataError(where, f"{what or 'the JSON text'} contains a NUL byte at offset {nul}; text must not "
                               "hold NUL characters", "nul_character")
    check_depth(text, where, what)


def _invalid(what: Optional[str], kind: str, detail: str) -> str:
    return f"{what} is not valid {kind}: {detail}" if what else f"invalid {kind}: {detail}"


def parse_json(data: str | bytes, where: Optional[str], what: Optional[str] = None) -> Any:
    """One JSON document (UTF-8 bytes or str) → its value, checked: ``invalid_utf8``,
    :func:`check_json_text` (before parsing), ``invalid_json``, then :func:`check_strings`. ``what``
    (e.g. ``"json"``, a member name) is named in the reasons."""
    raw = data
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(where, _invalid(what, "UTF-8", f"byte {e.start}"), "invalid_utf8") from None
    check_json_text(raw, where, what)
    try:
        value = json.loads(data)
    except json.JSONDecodeError as e:
        raise DataError(where, _invalid(what, "JSON", f"{e.msg} (line {e.lineno} column {e.colno})"),
                        "invalid_json") from None
    if _MAYBE_BAD.search(data):             # else no string of the value can hold NUL or a surrogate
        check_strings(value, where)
    return value


def _key(k: Any) -> str:
    """A key as shown in a path: as is, or as an escaped literal if it holds NUL, a surrogate or
    punctuation (so a message can always be printed)."""
    k = str(k)
    return k if k.isascii() and (k.isidentifier() or k.isalnum()) else ascii(k)


def _path(parts: tuple) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{_key(p)}" if out else _key(p))
    return out or "(top level)"


def _check_string(s: str, parts: tuple, where: Optional[str], what: str) -> None:
    bad = _BAD_CHAR.search(s)
    if bad is None:
        return
    if bad.group() == "\x00":
        raise DataError(where, f"{what} {_path(parts)} contains U+0000 (a NUL character) at character "
                               f"{bad.start()}; text must not hold NUL characters", "nul_character")
    raise DataError(where, f"{what} {_path(parts)} contains a lone UTF-16 surrogate U+{ord(bad.group()):04X} "
                           f"at character {bad.start()} (half of a pair, not a character); fix the escape "
                           "sequence in the JSON", "lone_surrogate")


def _clean(value: Any) -> bool:
    """True when no string or key of ``value`` holds NUL or a surrogate and nothing nests deeper
    than ``MAX_JSON_DEPTH`` (the fast pass; :func:`check_strings` then locates a problem)."""
    search = _BAD_CHAR.search
    stack = [(value, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        node, depth = pop()
        if depth > MAX_JSON_DEPTH:
            return False
        if type(node) is dict:
            try:
                if search("".join(node)):
                    return False
            except TypeError:               # a key that is not a string: take the slow walk
                return False
            node = node.values()
        for v in node:
            t = type(v)
            if t is str:
                if search(v):
                    return False
            elif t is dict or t is list:
                push((v, depth + 1))
    return True


def check_strings(value: Any, where: Optional[str]) -> None:
    """Every string and key of a parsed JSON ``value``, walked without recursion: a NUL character
    (``nul_character``), a lone surrogate (``lone_surrogate``) or nesting deeper than
    ``MAX_JSON_DEPTH`` (``json_too_deep``) is a ``DataError`` naming the first such field, in
    document order, by its JSON path."""
    if isinstance(value, str):
        _check_string(value, (), where, "the value")
        return
    if not isinstance(value, (dict, list)) or _clean(value):
        return
    stack: list[tuple[Any, tuple]] = [(value, ())]
    while stack:
        node, parts = stack.pop()
        if isinstance(node, str):
            _check_string(node, parts, where, "field")
        elif isinstance(node, (dict, list)):
            if len(parts) >= MAX_JSON_DEPTH:
                raise DataError(where, f"field {_path(parts)} is nested over the limit of {MAX_JSON_DEPTH} "
                                       "levels; flatten the sample or remove it", "json_too_deep")
            if isinstance(node, dict):
                for k in node:
                    if isinstance(k, str):
                        _check_string(k, parts + (k,), where, "key")
                children = [(v, parts + (k,)) for k, v in node.items()]
            else:
                children = [(v, parts + (i,)) for i, v in enumerate(node)]
            stack.extend(reversed(children))        # popped in document order
