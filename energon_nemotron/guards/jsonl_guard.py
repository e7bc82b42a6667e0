"""The nesting limit for the lines of JSONL datasets, which Energon parses before any cooker runs.

Energon calls ``json.loads`` on every line. A line nested about 1000 levels deep makes that a
``RecursionError``, which Energon treats as a system exception: the whole run stops, whatever
``on_error`` says. :func:`install` has each line first checked by ``json_safety.check_json_text``
(``_energon.guard_jsonl_lines``): a line over ``MAX_JSON_DEPTH`` (or with a
raw NUL byte) becomes a ``DataError`` (``json_too_deep``, ``nul_character``) naming the line, which
Energon hands to the error policy like any bad sample. Lines within the limit are parsed by Energon exactly as before (the strings of the result
are checked by ``cookers.base.payload``).

Installed when ``energon_nemotron.cookers`` is imported (the task encoder imports it), so DataLoader
workers, forked or spawned, have it too.
"""

from __future__ import annotations

from typing import Any

from energon_nemotron._energon import guard_jsonl_lines
from energon_nemotron.errors import sample_where
from energon_nemotron.guards.json_safety import check_json_text


def check_line(sample: Any) -> None:
    """A ``DataError`` naming the line when a raw JSONL sample's text is too deep or holds a NUL."""
    raw = sample.get("json") if isinstance(sample, dict) else None
    if isinstance(raw, (bytes, bytearray, str)):
        check_json_text(raw, sample_where(sample), "the line")


def install() -> None:
    """Have Energon's JSONL line loader check every line first (once; later calls do nothing)."""
    guard_jsonl_lines(check_line)
