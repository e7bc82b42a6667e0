"""The nesting limit for the lines of JSONL datasets, which Energon parses before any cooker runs.

Energon's ``DefaultCrudeJsonlDatasetFactory._load_sample`` calls ``json.loads`` on every line. A line
nested about 1000 levels deep makes that a ``RecursionError``, which Energon treats as a system
exception: the whole run stops, whatever ``on_error`` says. :func:`install` wraps that method so a
line is first checked by ``json_safety.check_json_text``: a line over ``MAX_JSON_DEPTH`` (or with a
raw NUL byte) becomes a ``DataError`` (``json_too_deep``, ``nul_character``) naming the line, which
Energon hands to the error policy like any bad sample. Lines within the limit are parsed by Energon exactly as before (the strings of the result
are checked by ``cookers.base.payload``).

Installed when ``energon_nemotron.cookers`` is imported (the task encoder imports it), so DataLoader
workers, forked or spawned, have it too.
"""

from __future__ import annotations

from typing import Any

from energon_nemotron.errors import sample_where
from energon_nemotron.guards.json_safety import check_json_text

_MARK = "_energon_nemotron_depth_guard"


def _guarded(load_sample: Any) -> Any:
    def _load_sample(self, sample):
        raw = sample.get("json") if isinstance(sample, dict) else None
        if isinstance(raw, (bytes, bytearray, str)):
            check_json_text(raw, sample_where(sample), "the line")
        return load_sample(self, sample)

    setattr(_load_sample, _MARK, True)
    _load_sample.__doc__ = load_sample.__doc__
    return _load_sample


def install() -> None:
    """Wrap Energon's JSONL line loader with the nesting check (once; later calls do nothing)."""
    from megatron.energon.flavors.jsonl.crude_jsonl_dataset import DefaultCrudeJsonlDatasetFactory

    current = DefaultCrudeJsonlDatasetFactory._load_sample
    if not getattr(current, _MARK, False):
        DefaultCrudeJsonlDatasetFactory._load_sample = _guarded(current)
