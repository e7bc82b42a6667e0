"""Two behaviours of Energon adjusted from outside: its error prints, and the parsing of JSONL lines."""

from __future__ import annotations

import builtins
from typing import Any, Callable

import megatron.energon.errors as _errors
from megatron.energon.flavors.jsonl.crude_jsonl_dataset import DefaultCrudeJsonlDatasetFactory


def _filtered_print(*args: Any, **kwargs: Any) -> None:
    first = args[0] if args else None
    if isinstance(first, str) and (first.startswith("Except ") or first.startswith("ErrorContext ")):
        return
    builtins.print(*args, **kwargs)


def quiet_error_prints() -> None:
    """Drop the two lines Energon's ``ErrorContext`` prints for every exception it hands to the
    error handler (``Except <error> in <stage>`` and ``ErrorContext <stage> failed N/M times in a
    row.``), by replacing the module global ``print`` of ``megatron.energon.errors``: under
    ``on_error: skip`` with every sample failing they were megabytes per second of output, and this
    library's error policy counts and reports each skip. Other prints pass; idempotent."""
    _errors.print = _filtered_print


_GUARD_MARK = "_energon_nemotron_line_check"


def guard_jsonl_lines(check: Callable[[dict], None]) -> None:
    """Run ``check(raw sample)`` before Energon parses each line of a JSONL dataset (wrapping the
    class method ``DefaultCrudeJsonlDatasetFactory._load_sample``, the only place that sees a line
    before ``json.loads``); installed once, later calls do nothing."""
    current = DefaultCrudeJsonlDatasetFactory._load_sample
    if getattr(current, _GUARD_MARK, False):
        return

    def _load_sample(self, sample):
        check(sample)
        return current(self, sample)

    setattr(_load_sample, _GUARD_MARK, True)
    _load_sample.__doc__ = current.__doc__
    DefaultCrudeJsonlDatasetFactory._load_sample = _load_sample
