"""Errors raised for bad input data. Every message says where (sample key or file:line) and why."""

from __future__ import annotations


class DataError(ValueError):
    """A sample or row that cannot become training data.

    ``where`` names the sample (an Energon ``__key__`` or ``file:line``); ``reason`` says what is
    wrong. ``str(err)`` is ``"{where}: {reason}"``. A single argument is taken as the whole message
    (how PyTorch re-raises an error from a ``DataLoader`` worker).
    """

    def __init__(self, where: str | None, reason: str | None = None) -> None:
        if reason is None:
            where, reason = None, where or ""
        self.where = where
        self.reason = reason
        super().__init__(f"{where}: {reason}" if where else reason)

    def located(self, where: str) -> "DataError":
        """The same error attributed to ``where`` (used when a caller knows the file and line)."""
        if self.where:
            return self
        return type(self)(where, self.reason)


class ConfigError(ValueError):
    """An invalid option or combination of options (not tied to one sample)."""


class MediaError(ValueError):
    """A media item that cannot be planned or decoded (bad header, unsupported format, over a size
    limit, metadata that disagrees with the content). The task encoder re-raises it as a
    ``DataError`` naming the sample key."""
