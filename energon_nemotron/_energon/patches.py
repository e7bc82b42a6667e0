"""Behaviours of Energon adjusted from outside: its error prints, its per-worker shard lines and
buffer-filling bars (the quiet default), the parsing of JSONL lines, its watchdog's message and
thread, and the traceback its prepare logs per shard it cannot read."""

from __future__ import annotations

import builtins
import contextlib
import logging
from typing import Any, Callable, Iterator

import megatron.energon.errors as _errors
import megatron.energon.flavors.webdataset.base_webdataset as _base_webdataset
import megatron.energon.flavors.webdataset.prepare as _prepare
import megatron.energon.wrappers.watchdog_dataset as _watchdog_dataset
from megatron.energon.watchdog import Watchdog
from megatron.energon.wrappers.packing_dataset import PackingDataset
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


def _shard_line_print(*args: Any, **kwargs: Any) -> None:
    first = args[0] if args else None
    if isinstance(first, str) and first.startswith("rank=") and "sample_range=" in first:
        return
    builtins.print(*args, **kwargs)


_QUIET_MARK = "_energon_nemotron_quiet"


def quiet_progress(quiet: bool = True) -> None:
    """The quiet default: drop the line Energon prints per worker and dataset at start (``rank=0,
    worker=0: sample_range=[...] ...``, from ``_print_shard_slices`` of
    ``flavors.webdataset.base_webdataset``, which JSONL datasets call too) and its ``Filling
    reading buffer`` progress bar at the first pack (``PackingDataset._fill_reading_buffer``'s
    ``log_progress``). ``quiet=False`` puts both back (the command line's ``--verbose``)."""
    _base_webdataset.print = _shard_line_print if quiet else builtins.print
    current = PackingDataset._fill_reading_buffer
    original = getattr(current, "__wrapped__", current)
    if not quiet:
        PackingDataset._fill_reading_buffer = original
        return
    if getattr(current, _QUIET_MARK, False):
        return

    def _fill_reading_buffer(self, source_iter, log_progress: bool = False):
        return original(self, source_iter, log_progress=False)

    setattr(_fill_reading_buffer, _QUIET_MARK, True)
    _fill_reading_buffer.__wrapped__ = original
    _fill_reading_buffer.__doc__ = original.__doc__
    PackingDataset._fill_reading_buffer = _fill_reading_buffer


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


def name_watchdog_timeouts(describe: Callable[[float], str]) -> None:
    """Energon's watchdog (``WatchdogDataset``) says ``describe(timeout_seconds)`` when it fires,
    instead of its generic "Sample processing took longer" line: with ``fail_on_timeout`` a
    ``TimeoutError`` of that message, which Energon's watchdog thread prints after the stacks of
    the process's threads before it ends the process (a DataLoader worker: the loader then fails);
    without, a ``RuntimeWarning``. Idempotent."""
    import warnings

    def trigger(self: Any) -> None:
        message = describe(self.timeout_seconds)
        if self.fail_on_timeout:
            raise TimeoutError(message)
        warnings.warn(message, RuntimeWarning)

    _watchdog_dataset.WatchdogDataset._watchdog_trigger = trigger


_STOP_MARK = "_energon_nemotron_stops"


def stop_watchdog_threads() -> None:
    """Energon's ``WatchdogDataset`` starts a ``Watchdog`` (a daemon thread that wakes every
    second) for each iteration and never stops it: a process that iterates loaders without workers
    keeps one more thread per pass, and every worker it forks later is forked beside them. Its
    ``watch_iter`` (used only there) now stops its watchdog's thread when the iteration ends
    (exhausted, closed or failed), as ``Watchdog.finish`` does but without joining it (a close at
    interpreter exit must not wait on a daemon thread). Idempotent."""
    current = Watchdog.watch_iter
    if getattr(current, _STOP_MARK, False):
        return

    def watch_iter(self, iterable):
        try:
            yield from current(self, iterable)
        finally:
            with self._cv:
                self._stop = True
                self._cv.notify_all()

    setattr(watch_iter, _STOP_MARK, True)
    watch_iter.__doc__ = current.__doc__
    Watchdog.watch_iter = watch_iter


class _OneLineShardFailure(logging.Filter):
    """Energon's ``Shard failed to load: PATH. Skipping it.`` record made one line: the exception's
    type and message replace its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and str(record.msg).startswith("Shard failed to load"):
            error = record.exc_info[1]
            cause = " ".join(f"{type(error).__name__}: {error}".split())[:300]
            record.msg = f"{str(record.msg).removesuffix(' Skipping it.').rstrip('.')} ({cause})"
            record.args, record.exc_info, record.exc_text = None, None, None
        return True


@contextlib.contextmanager
def one_line_shard_failures() -> Iterator[None]:
    """While the block runs, the record the logger of ``megatron.energon.flavors.webdataset.prepare``
    writes for each shard its prepare cannot read (``logger.exception``: a traceback per shard, from
    each indexing process) is one line naming the shard and the cause. The indexing processes are
    forked during the block, so they carry the filter."""
    logger, one_line = _prepare.logger, _OneLineShardFailure()
    logger.addFilter(one_line)
    try:
        yield
    finally:
        logger.removeFilter(one_line)
