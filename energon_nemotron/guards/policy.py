"""The bad-sample policy (``loader.on_error``): Energon's error handler, and the skip counter it
counts into.

``ErrorPolicy`` is installed as Energon's ``global_error_handler``: under ``raise`` every error
becomes a ``DataError`` naming the sample; under ``skip`` the sample is dropped and counted by its
reason code (``errors.error_code``) in a :func:`skip_counter`, whose limits may stop the run
(``guards.skip_limits``). A ``ConfigError`` is never skipped.
"""

from __future__ import annotations

from energon_nemotron._energon import quiet_error_prints
from energon_nemotron.errors import CODES, ConfigError, DataError, error_code, sample_where
from energon_nemotron.guards.skip_limits import SkipTally, record_skip
from energon_nemotron.types import EncodedSample, PackedRow

#: the longest ``where: why`` text a skip message quotes
MESSAGE_CHARS = 300

__all__ = ["ErrorPolicy", "SampleErrorHandler", "skip_counter", "failure_text", "MESSAGE_CHARS"]


def skip_counter(num_workers: int = 0) -> SkipTally:
    """A shared counter of skipped samples by reason code (``CODES``) across worker processes,
    with the skip limits (a :class:`~energon_nemotron.guards.skip_limits.SkipTally`; default limits until
    ``skip_limits.apply_limits``)."""
    return SkipTally(CODES, num_workers)


class SampleErrorHandler:
    """An Energon ``global_error_handler`` of this library (:class:`ErrorPolicy`, or a reader's own:
    ``stats``): while one exists, Energon's own per-error prints are silenced
    (``_energon.quiet_error_prints``), in every worker it is copied into. A task
    encoder that runs under another loader installs its :class:`ErrorPolicy` where the worker
    config holds none of these."""

    def __init__(self) -> None:
        quiet_error_prints()

    def __setstate__(self, state: dict) -> None:          # unpickled in a spawned worker
        self.__dict__.update(state)
        quiet_error_prints()

    def __call__(self, exc: Exception, sample: object = None, sources: object = None) -> None:
        raise NotImplementedError


class ErrorPolicy(SampleErrorHandler):
    """Energon's ``global_error_handler`` for ``loader.on_error``.

    ``raise``: every error becomes a ``DataError`` naming the sample and propagates (the default:
    fail closed). ``skip``: the sample is dropped and counted by ``error_code`` in ``counts`` (a
    :func:`skip_counter`), so nothing disappears uncounted; the counter's skip limits may stop
    the run (``SkipLimitError``). The policy is copied into every worker.
    """

    def __init__(self, mode: str, counts) -> None:
        if mode not in ("raise", "skip"):
            raise ConfigError(f"on_error must be 'raise' or 'skip', got {mode!r}")
        super().__init__()
        self.mode = mode
        self.counts = counts

    def __call__(self, exc: Exception, sample: object = None, sources: object = None) -> None:
        if isinstance(exc, ConfigError):
            raise exc                   # the configuration's fault, not the sample's: never skipped
        if self.mode == "skip":
            record_skip(self.counts, error_code(exc), failure_text(exc, sample_where(sample, sources)),
                        _after_read(sample))
            return
        if isinstance(exc, DataError):
            raise exc.located(sample_where(sample, sources))
        raise DataError(sample_where(sample, sources), f"{type(exc).__name__}: {exc}", error_code(exc)) from exc


def failure_text(exc: BaseException, where: str, limit: int = MESSAGE_CHARS) -> str:
    """``where: why`` of a failing sample, at most ``limit`` characters (the skip limits' and the
    statistics' messages)."""
    text = str(exc.located(where)) if isinstance(exc, DataError) else f"{where}: {type(exc).__name__}: {exc}"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _after_read(sample: object) -> bool:
    """Whether a failing ``sample`` had already been read (encoded by phase 1): a sample failing at
    decode time, or a pack or batch of such samples."""
    return isinstance(sample, (EncodedSample, PackedRow, list, tuple))
