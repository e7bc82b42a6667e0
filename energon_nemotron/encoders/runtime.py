"""What the host of a task encoder (this library's loader, the ``stats`` reader, another loader)
gives it besides its configuration: :class:`Runtime` (counters, failure tolerance, per-buffer
tokenization).

``skipped``: samples skipped by reason (a ``guards.skip_limits.SkipTally`` with the skip limits:
the over-length policy's skips, and every skip of ``on_error: skip`` through the error policy);
``decodes``: media decoded by modality (``media.handlers.MEDIA_COUNTERS``); ``lookups``: media found
by basename in an aux source (``cookers.media_sources.LOOKUP_COUNTERS``); ``packing``: samples
carried into a next buffer and samples whose media were read again at pack time
(:data:`PACKING_COUNTERS`); ``held``: the media bytes each worker's packing buffer holds
(``telemetry.SharedGauge``; ``packing.max_buffer_bytes``). They are shared
across ``DataLoader`` workers (``telemetry.SharedCounter``: build them for the loader's worker
count before the workers start). :meth:`EncoderCounters.take_pending`: this process's skips not
yet reported in a batch, which the encoder's ``batch`` attaches to the batch it makes
(``PackedBatch.skipped``, or the consumer's key, e.g. Megatron-Bridge's data module; telemetry,
not stream state; ``telemetry.SharedCounter.take_unreported``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from energon_nemotron.cookers.media_sources import LOOKUP_COUNTERS
from energon_nemotron.cookers.remote_entries import EntryCache
from energon_nemotron.guards.policy import skip_counter
from energon_nemotron.guards.skip_limits import record_pass
from energon_nemotron.media.handlers import MEDIA_COUNTERS
from energon_nemotron.telemetry import SharedCounter, SharedGauge

__all__ = ["Runtime", "EncoderCounters", "NoCount", "PACKING_COUNTERS"]

#: what the packing counts: samples carried into a next buffer (``encoders.pre_pack``), samples
#: whose media bytes were left out of the buffer and read again for their pack (``encoders.held_media``)
PACKING_COUNTERS = ("carried", "reread")


class NoCount:
    """A counter that counts nothing (a reader whose own records count, e.g. ``stats``)."""

    def add(self, name: str, n: int = 1) -> None:
        pass

    def totals(self) -> dict[str, int]:
        return {}


@dataclass
class EncoderCounters:
    """The encoder's counters (see the module docstring)."""

    skipped: Any = field(default_factory=skip_counter)
    decodes: Any = field(default_factory=lambda: SharedCounter(MEDIA_COUNTERS))
    lookups: Any = field(default_factory=lambda: SharedCounter(LOOKUP_COUNTERS))
    packing: Any = field(default_factory=lambda: SharedCounter(PACKING_COUNTERS))
    held: Any = field(default_factory=SharedGauge)

    @classmethod
    def for_workers(cls, num_workers: int) -> "EncoderCounters":
        """Counters shared by ``num_workers`` ``DataLoader`` workers and the main process."""
        return cls(skip_counter(num_workers), SharedCounter(MEDIA_COUNTERS, num_workers),
                   SharedCounter(LOOKUP_COUNTERS, num_workers), SharedCounter(PACKING_COUNTERS, num_workers),
                   SharedGauge(num_workers))

    @classmethod
    def silent(cls, skipped: Optional[Any] = None) -> "EncoderCounters":
        """Counters that count no skips (``skipped``: :class:`NoCount` unless given)."""
        return cls(skipped if skipped is not None else NoCount())

    def add(self, code: str, n: int = 1) -> None:
        """``n`` samples skipped for reason ``code`` (what an ``ErrorPolicy`` counts into when the
        encoder runs under another loader than this library's)."""
        for _ in range(n):
            self.skipped.add(code)

    def read(self) -> None:
        """One sample read and encoded (the skip limits' window, ``guards.skip_limits``)."""
        record_pass(self.skipped)

    def take_pending(self) -> dict[str, int]:
        """This process's skips since the last call, by reason (none from a counter that does not
        report, e.g. :class:`NoCount`)."""
        take = getattr(self.skipped, "take_unreported", None)
        return take() if take is not None else {}


@dataclass
class Runtime:
    """How a task encoder is run: ``counters`` (:class:`EncoderCounters`, built for the loader's
    workers); ``failure_tolerance``: consecutive failures Energon allows a stage (0: never fatal;
    None: Energon's default, or 0 with ``options.on_error: skip``); ``tokenize_per_buffer``: with
    packing, tokenize once per packing buffer (``encoders.buffered``), else in ``preencode_sample``
    (a reader that stops after phase 1); ``entry_cache``: where aux entries fetched from object
    storage are kept for the next epochs (``cookers.remote_entries.EntryCache``, made by the loader
    when ``loader.cache_pool`` is set; None: each epoch fetches them again)."""

    counters: EncoderCounters = field(default_factory=EncoderCounters)
    failure_tolerance: Optional[int] = None
    tokenize_per_buffer: bool = True
    entry_cache: Optional[EntryCache] = None
