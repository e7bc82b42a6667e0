"""Errors raised for bad input data and configurations, the reason codes that skip counters use,
and how errors name a sample (:func:`sample_where`) and classify an exception (:func:`error_code`).
Every message says where (sample key or file:line) and why. What happens to a failing sample
(``loader.on_error``) is the error policy's (``guards.policy``)."""

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
    """An invalid option or combination of options (not tied to one sample). The message names the
    field (or file) and the fix. It is never a skip: ``ErrorPolicy`` re-raises it under every
    ``on_error``.

    Raised in a ``DataLoader`` worker, PyTorch re-raises it in the parent with the worker's
    traceback as the only argument; the original message is taken back from its last line (the
    traceback is kept in ``worker_traceback``).
    """

    def __init__(self, message: str = "") -> None:
        self.worker_traceback = None
        marker = f"\n{type(self).__module__}.{type(self).__qualname__}: "
        if isinstance(message, str) and message.startswith(f"Caught {type(self).__name__} ") and marker in message:
            self.worker_traceback = message
            message = message.rsplit(marker, 1)[1].rstrip("\n")
        super().__init__(message)


class DatasetError(ConfigError):
    """A prepared dataset whose files are missing, damaged or disagree with each other (a shard, its
    ``.tar.idx``, the ``.info.json`` counts): not a bad sample, so it stops the run under every
    ``on_error`` (skipping would silently drop the rest of a shard). The message names the file, the
    sample when known, what is wrong, and the fix (mostly: re-run ``energon prepare``). Raised in a
    worker, it reaches the parent intact (see ``ConfigError``).
    """


class SkipLimitError(ConfigError):
    """``on_error: skip`` gave up: too many samples were skipped (``loader.max_consecutive_skips``
    or ``loader.max_skip_fraction``; see ``energon_nemotron.guards.skip_limits``). The message names the
    limit, the window and the skip counts by reason. A ``ConfigError``, so never skipped itself:
    the data (or the limit) has to change."""


class LoaderError(RuntimeError):
    """A loader process ended without an error of its own: a worker that made no progress for
    ``loader.watchdog_timeout_seconds`` (its message and thread stacks are printed before it ends),
    or one that crashed (``guards.stalls``)."""


class MediaError(ValueError):
    """A media item that cannot be planned or decoded (bad header, unsupported format, over a size
    limit, metadata that disagrees with the content). The task encoder re-raises it as a
    ``DataError`` naming the sample key, with ``code`` (``corrupt_media``, ``media_too_large`` or
    ``audio_too_short``)."""

    def __init__(self, message: str, code: str = "corrupt_media") -> None:
        super().__init__(message)
        self.code = code


#: every reason code the library reports (``other`` counts anything else)
CODES = ("invalid_sample", "invalid_json", "invalid_utf8", "json_too_deep", "lone_surrogate", "nul_character",
         "unknown_role", "empty_assistant", "no_assistant",
         "empty_conversation", "media_reference", "missing_media", "path_escape", "path_too_long", "reserved_tag",
         "tokenization", "template_drops",
         "invalid_thinking", "no_trainable_tokens", "over_length", "corrupt_media", "media_too_large", "audio_too_short",
         "unsupported_media", "other")


def error_code(exc: BaseException) -> str:
    """The skip-counter class of any exception raised while reading a sample."""
    import errno
    import json

    if isinstance(exc, (DataError, MediaError)):
        return exc.code
    if isinstance(exc, UnicodeDecodeError):
        return "invalid_utf8"
    if isinstance(exc, json.JSONDecodeError):
        return "invalid_json"
    # the checks of ``guards.json_safety`` and ``cookers.media`` catch these first; a library that meets
    # them anyway (a tokenizer given a surrogate, a path with NUL or over the OS limit) is counted
    # by the same codes, not as ``other``
    if isinstance(exc, UnicodeEncodeError) and "surrogate" in str(exc):
        return "lone_surrogate"
    if isinstance(exc, ValueError) and "embedded null" in str(exc):
        return "nul_character"
    if isinstance(exc, OSError) and exc.errno == errno.ENAMETOOLONG:
        return "path_too_long"
    return f"error:{type(exc).__name__}"


def shown_key(key: object, shard: object = None, dataset: object = None) -> str:
    """How the library shows a sample's key, naming where the sample is: a JSONL line's (Energon's
    key is the 0-based line number, ``shard`` the file's name) as ``FILE.jsonl:N`` with N 1-based,
    as the Megatron-LM path names its lines; a tar sample's as ``DATASET/SHARD:KEY`` (``dataset``
    the prepared folder's name, ``shard`` the tar's path in it, ``KEY`` the tar's own key), so that
    two datasets' equal tar keys differ; any other key, or one shown already, as it is. Energon's
    states store restore keys, not these."""
    key = str(key)
    if not isinstance(shard, str) or not shard:
        return key
    if shard.endswith(".jsonl"):
        return f"{shard}:{int(key) + 1}" if key.isdigit() else key
    where = f"{_folder_name(dataset)}/{shard}:" if _folder_name(dataset) else f"{shard}:"
    return key if key.startswith(where) else where + key


def _folder_name(path: object) -> str:
    """The last part of a dataset's path (an ``EPath``, a ``Path`` or a string); "" for none."""
    return str(path).rstrip("/").rsplit("/", 1)[-1] if path is not None and str(path).strip("/") else ""


def sample_origin(sample: object, sources: object = None) -> tuple[object, object]:
    """``(shard, dataset)`` of a crude sample dict or a ``Sample``: its ``__shard__``, else the shard
    of its first Energon ``SourceInfo`` (``sources`` when given); the dataset is that source's
    path where the source is of that shard, else None."""
    shard = sample.get("__shard__") if isinstance(sample, dict) else None
    if not sources:
        sources = sample.get("__sources__") if isinstance(sample, dict) else getattr(sample, "__sources__", None)
    first = list(sources)[0] if sources else None
    if shard is None:
        shard = getattr(first, "shard_name", None)
    return shard, (getattr(first, "dataset_path", None) if getattr(first, "shard_name", None) == shard else None)


def sample_where(sample: object, sources: object = None) -> str:
    """How errors name a sample (a crude sample dict or a ``Sample``): its ``__key__`` as the
    library shows it (:func:`shown_key`: ``FILE.jsonl:N`` for a JSONL line, ``DATASET/SHARD:KEY``
    for a tar sample); ``"?"`` when it has no key."""
    key = sample.get("__key__") if isinstance(sample, dict) else getattr(sample, "__key__", None)
    if key is None:
        return "?"
    return shown_key(key, *sample_origin(sample, sources))


#: how PyTorch re-raises an exception from a ``DataLoader`` worker: its message, then this line
WORKER_TRACEBACK = "\nOriginal Traceback (most recent call last):\n"
_LIBRARY_ERRORS = ("DataError", "ConfigError", "DatasetError", "SkipLimitError", "MediaError", "LoaderError")


def original_message(error: BaseException) -> str | None:
    """The library error's own message inside an exception PyTorch re-raised from a ``DataLoader``
    worker (``Caught DataError in DataLoader worker process 0. Original Traceback ...``: the
    worker's whole traceback, the useful line last), or ``str(error)`` for a library error raised
    in this process; None for any other exception."""
    text = str(error)
    if WORKER_TRACEBACK not in text:
        return text if type(error).__name__ in _LIBRARY_ERRORS else None
    lines = text.split(WORKER_TRACEBACK, 1)[1].splitlines()
    for i in range(len(lines) - 1, -1, -1):
        head, sep, rest = lines[i].partition(": ")
        if sep and not lines[i].startswith(" ") and head.rsplit(".", 1)[-1] in _LIBRARY_ERRORS:
            return "\n".join([rest, *lines[i + 1:]])
    return None
