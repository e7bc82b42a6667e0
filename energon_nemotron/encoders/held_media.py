"""Media bytes a packing buffer holds, bounded (``packing.max_buffer_bytes``; docs/packing.md).

A planned sample waits in the packing buffer until its pack is built; its media are decoded only
then, but it keeps its compressed media bytes (a tar member's payload) all that time. With
``max_buffer_bytes`` set, the packing stage (``_energon.packing_stage``) asks :class:`HeldMedia`
for each sample entering its buffer whether its bytes may stay (:meth:`HeldMedia.admits`); a
sample refused **leaves its payloads out** (:meth:`HeldMedia.leave_out`: each bytes payload is
replaced by a :class:`LeftOut` of its size) and, when its pack is built, the stage reads the
sample again by its restore key and :meth:`HeldMedia.refill` puts the bytes read back. Plans,
tokens and packs come from the sample as first read, so batches are bit for bit those of an
unbounded buffer.

Admission: a sample whose media bytes are at most the per-sample share (``max_buffer_bytes /
buffer_size``) is held while the buffer's bytes stay within the budget; a larger one only if it
also leaves the share of every sample the buffer still takes. So small media stay in memory,
large clips are read twice, and the bytes held never exceed the budget. Payloads that are paths
or lazy entries (an aux source) hold no bytes and are never left out.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from energon_nemotron.errors import DataError

__all__ = ["HeldMedia", "LeftOut"]


@dataclasses.dataclass(frozen=True)
class LeftOut:
    """A media payload left out of the packing buffer: ``size`` bytes, read again at pack time."""

    size: int


def _held(payload: Any) -> int:
    return len(payload) if isinstance(payload, (bytes, bytearray, memoryview)) else 0


def _set_media(sample: Any, media: list) -> None:
    sample.media = media
    if getattr(sample, "pending", None) is not None:
        sample.pending.origin.media = media


class HeldMedia:
    """What the packing stage asks of a sample's media bytes.

    Args:
        budget: media bytes the buffer may hold (``packing.max_buffer_bytes``; 0: none).
        buffer_size: samples a buffer holds (``packing.buffer_size``).
        counter: counts ``reread`` (samples whose media were read again at pack time), or None.
        gauge: takes the bytes the buffer holds (``telemetry.SharedGauge``), or None.
    """

    def __init__(self, budget: int, buffer_size: int, counter: Any = None, gauge: Any = None) -> None:
        self.budget, self.buffer_size = int(budget), max(int(buffer_size), 1)
        self.share = self.budget // self.buffer_size
        self.counter, self.gauge = counter, gauge

    def report(self, held: int) -> None:
        """The buffer holds ``held`` media bytes now."""
        if self.gauge is not None:
            self.gauge.set(held)

    def nbytes(self, sample: Any) -> int:
        """The media bytes ``sample`` holds (its bytes payloads; 0 when left out)."""
        return sum(_held(ref.payload) for ref in getattr(sample, "media", ()) or ())

    def admits(self, nbytes: int, held: int, count: int) -> bool:
        """Whether a sample of ``nbytes`` media bytes may keep them, the buffer holding ``held``
        bytes in ``count`` samples before it (see the module docstring)."""
        if not nbytes:
            return True
        reserve = 0 if nbytes <= self.share else max(self.buffer_size - count - 1, 0) * self.share
        return held + nbytes + reserve <= self.budget

    def leave_out(self, sample: Any) -> None:
        """Replace each bytes payload of ``sample``'s media by a :class:`LeftOut` of its size (in
        ``sample`` and in the cooked sample it still holds while only prepared)."""
        _set_media(sample, [dataclasses.replace(ref, payload=LeftOut(_held(ref.payload))) if _held(ref.payload)
                            else ref for ref in sample.media])

    @staticmethod
    def is_light(sample: Any) -> bool:
        """Whether ``sample`` left payloads out (they must be read again before it is encoded)."""
        return any(isinstance(ref.payload, LeftOut) for ref in getattr(sample, "media", ()) or ())

    def refill(self, sample: Any, fresh: Any) -> Any:
        """``sample`` with the payloads it left out taken from ``fresh`` (the same sample read
        again by its restore key); a re-read that differs (the source changed) is a ``DataError``."""
        key = sample.__key__
        if len(fresh.media) != len(sample.media):
            raise DataError(key, f"read again for its pack, the sample has {len(fresh.media)} media items, "
                                 f"not {len(sample.media)}: the dataset changed while it was read")
        media = []
        for i, (ref, again) in enumerate(zip(sample.media, fresh.media)):
            if isinstance(ref.payload, LeftOut):
                if _held(again.payload) != ref.payload.size or again.name != ref.name:
                    raise DataError(key, f"read again for its pack, media item {i} ({ref.name or ref.modality}) is "
                                         f"{_held(again.payload)} bytes, not {ref.payload.size}: the dataset "
                                         "changed while it was read")
                ref = dataclasses.replace(ref, payload=again.payload)
            media.append(ref)
        _set_media(sample, media)
        if self.counter is not None:
            self.counter.add("reread")
        return sample
