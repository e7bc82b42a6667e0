"""Errors raised for bad input data. Every message says where (sample key or file:line) and why."""

from __future__ import annotations


class DataError(ValueError):
    """A sample or row that cannot become training data.

    ``where`` names the sample (an Energon ``__key__`` or ``file:line``); ``reason`` says what is
    wrong; ``code`` is the short reason class that skip counters use (``invalid_json``,
    ``unknown_role``, ``corrupt_media``, ...). ``str(err)`` is ``"{where}: {reason}"``. A single
    argument is taken as the whole message (how PyTorch re-raises an error from a ``DataLoader``
    worker).
    """

    default_code = "invalid_sample"

    def __init__(self, where: str | None, reason: str | None = None, code: str | None = None) -> None:
        if reason is None:
            where, reason = None, where or ""
        self.where = where
        self.reason = reason
        self.code = code or self.default_code
        super().__init__(f"{where}: {reason}" if where else reason)

    def located(self, where: str) -> "DataError":
        """The same error attributed to ``where`` (used when a caller knows the file and line)."""
        if self.where:
            return self
        return type(self)(where, self.reason, self.code)


class ConfigError(ValueError):
    """An invalid option or combination of options (not tied to one sample)."""


class MediaError(ValueError):
    """A media item that cannot be planned or decoded (bad header, unsupported format, over a size
    limit, metadata that disagrees with the content). The task encoder re-raises it as a
    ``DataError`` naming the sample key, with ``code`` (``corrupt_media`` or ``media_too_large``)."""

    def __init__(self, message: str, code: str = "corrupt_media") -> None:
        super().__init__(message)
        self.code = code


#: every reason code the library reports (``other`` counts anything else)
CODES = ("invalid_sample", "invalid_json", "invalid_utf8", "unknown_role", "empty_assistant", "no_assistant",
         "empty_conversation", "media_reference", "missing_media", "path_escape", "reserved_tag", "tokenization",
         "invalid_thinking", "no_trainable_tokens", "over_length", "corrupt_media", "media_too_large", "other")


def SkipCounter(num_workers: int = 0):
    """A shared counter of skipped samples by reason code (``CODES``) across worker processes."""
    from energon_nemotron.telemetry import SharedCounter

    return SharedCounter(CODES, num_workers)


def error_code(exc: BaseException) -> str:
    """The skip-counter class of any exception raised while reading a sample."""
    import json

    if isinstance(exc, (DataError, MediaError)):
        return exc.code
    if isinstance(exc, UnicodeDecodeError):
        return "invalid_utf8"
    if isinstance(exc, json.JSONDecodeError):
        return "invalid_json"
    return f"error:{type(exc).__name__}"


def sample_where(sample: object, sources: object = None) -> str:
    """How errors name a sample (a crude sample dict or a ``Sample``): its ``__key__``, and the
    shard when known; ``"?"`` when it has no key."""
    key = sample.get("__key__") if isinstance(sample, dict) else getattr(sample, "__key__", None)
    if key is None:
        return "?"
    shard = sample.get("__shard__") if isinstance(sample, dict) else None
    if shard is None and sources:
        shard = getattr(list(sources)[0], "shard_name", None)
    return f"{key} (in {shard})" if shard else str(key)


class ErrorPolicy:
    """Energon's ``global_error_handler`` for ``loader.on_error``.

    ``raise``: every error becomes a ``DataError`` naming the sample and propagates (the default:
    fail closed). ``skip``: the sample is dropped and counted by ``error_code`` in ``counts`` (a
    :class:`SkipCounter`), so nothing disappears uncounted.
    """

    def __init__(self, mode: str, counts) -> None:
        if mode not in ("raise", "skip"):
            raise ConfigError(f"on_error must be 'raise' or 'skip', got {mode!r}")
        self.mode = mode
        self.counts = counts

    def __call__(self, exc: Exception, sample: object = None, sources: object = None) -> None:
        if self.mode == "skip":
            self.counts.add(error_code(exc))
            return
        if isinstance(exc, DataError):
            raise exc.located(sample_where(sample, sources))
        raise DataError(sample_where(sample, sources), f"{type(exc).__name__}: {exc}", error_code(exc)) from exc
