"""This library's packing stage: Energon's ``PackingDataset`` that can carry samples into the next
buffer and tells the pre-packer where its buffer stands.

Energon packs each buffer on its own: ``select_samples_to_pack`` gets the whole reading buffer and
every sample it is given must leave in a pack (its pushback, PR #228, is not released).
:class:`CarryingPackingDataset` calls the pre-packer with a :class:`BufferContext` as well: how
often each of the buffer's samples was carried already, whether the source has ended (then nothing
may be carried), the worker's pack count and its place in the loader's turn (what the step
schedule needs), and the running cost sums. The samples the pre-packer names in
``context.carry`` go back into the reading buffer, before the samples read next: Energon's own
reading buffer then saves them (as restore keys, re-read and re-prepared on restore) and its
state counts them as in flight, so exact and elastic resume cover them. Its own state adds the
carry counts of those samples, the cost sums and the pack count.

Given ``held`` (``encoders.held_media.HeldMedia``: ``packing.max_buffer_bytes``), the stage bounds
the media bytes its buffers hold: each sample entering them (read, or restored from a saved
state) keeps its bytes only if ``held.admits`` it, else it leaves them out; when its pack is built
it is read again from the source by its restore key (``dataset.restore_sample``, what Energon's
own restore of the buffer does) and refilled before the sample encoder sees it.

:func:`packing_stage` makes Energon's ``TaskEncoder.build_batch`` build this class instead of its
own (Energon names the class in its module; it is replaced for the call only).
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, List

import megatron.energon.task_encoder.base as _task_base
from megatron.energon.wrappers.base import get_sample_restore_key
from megatron.energon.wrappers.buffer import SavableSampleBuffer
from megatron.energon.wrappers.packing_dataset import PackingDataset

from energon_nemotron.errors import ConfigError

__all__ = ["BufferContext", "CarryingPackingDataset", "packing_stage"]


@dataclass
class BufferContext:
    """What the pre-packer learns of its buffer, and what it answers.

    - ``carried``: int per sample handed to it, times it was carried already.
    - ``final``: the source has ended; this is the last buffer (carry nothing).
    - ``first_pack``: the worker's count of packs planned before this buffer.
    - ``worker``, ``num_workers``, ``batch_size``: the worker's logical id in the loader's turn,
      how many take turns (at least 1), packs per batch.
    - ``density``: ``[extra work, tokens]`` summed over the samples first seen so far (the
      pre-packer adds this buffer's new samples, in place).
    - ``carry``: set by the pre-packer: ``(sample, times carried)`` to put back into the buffer.
    """

    carried: List[int]
    final: bool
    first_pack: int
    worker: int
    num_workers: int
    batch_size: int
    density: list
    carry: list = field(default_factory=list)


class _Admitted:
    """``source`` whose samples pass ``admit`` as they are read."""

    def __init__(self, source: Iterator, admit: Callable[[Any], Any]) -> None:
        self.source, self.admit = source, admit

    def __iter__(self) -> "_Admitted":
        return self

    def __next__(self) -> Any:
        return self.admit(next(self.source))


class CarryingPackingDataset(PackingDataset):
    """Energon's ``PackingDataset`` whose pre-packer is called as ``pre_packer(samples, context)``
    (:class:`BufferContext`) and may carry samples into the next buffer; with ``held``, its
    buffers hold media bytes within ``held``'s budget (see the module docstring)."""

    _savable_fields = PackingDataset._savable_fields + ("_carried", "_density", "_packs_planned")

    def __init__(self, *args: Any, batch_size: int = 1, held: Any = None, **kwargs: Any) -> None:
        self.batch_size = max(int(batch_size or 1), 1)
        self.held = held
        super().__init__(*args, **kwargs)
        self._select = self.pre_packer
        self.pre_packer = self._pre_pack
        if held is not None:
            if self.sample_encoder is None or not self.dataset.can_restore_sample():
                raise ConfigError("packing.max_buffer_bytes needs a sample encoder and a source whose samples "
                                  "can be read again by restore key; set it null for this source")
            self._encode = self.sample_encoder
            self.sample_encoder = self._refilled

    def reset_state_own(self) -> None:
        super().reset_state_own()
        if self.held is not None:       # the buffers stay Energon's class (its saved states name it)
            for buffer in (self._reading_buffer, self._pre_packing_buffer):
                buffer.restore_sample = functools.partial(self._admit_restored, buffer)
        self._tally = [0, 0]            # media bytes held and samples, as samples enter the buffers
        self._carried: list[int] = []
        self._density: list = [0.0, 0]
        self._packs_planned = 0
        self._exhausted = False

    def restore_state(self, state: Any) -> None:
        super().restore_state(state)
        self._tally = [0, 0]            # the buffers' samples are restored (and admitted) afresh

    def _admit(self, sample: Any) -> Any:
        """``sample`` entering the buffers keeps its media bytes if ``held`` admits them, else
        leaves them out."""
        n = self.held.nbytes(sample)
        if self.held.admits(n, *self._tally):
            self._tally[0] += n
        else:
            self.held.leave_out(sample)
        self._tally[1] += 1
        return sample

    def _admit_restored(self, buffer: SavableSampleBuffer, restore_key: Any) -> Any:
        """``buffer``'s restore of a sample from a saved state, admitted."""
        return self._admit(SavableSampleBuffer.restore_sample(buffer, restore_key))

    def _refilled(self, sample: Any) -> Any:
        """The sample encoder's call, on ``sample`` refilled first if it left its bytes out."""
        if self.held.is_light(sample):
            sample = self.held.refill(sample, self.dataset.restore_sample(get_sample_restore_key(sample)))
        return self._encode(sample)

    def _fill_reading_buffer(self, source_iter: Iterator, log_progress: bool = False) -> bool:
        if self.held is not None:
            buffered = self._reading_buffer.buffer + self._pre_packing_buffer.buffer
            self._tally = [sum(self.held.nbytes(s) for s in buffered), len(buffered)]
            source_iter = _Admitted(source_iter, self._admit)
        more = super()._fill_reading_buffer(source_iter, log_progress=log_progress)
        if self.held is not None:
            self.held.report(self._tally[0])
        if not more:
            self._exhausted = True
        return more

    def __iter__(self):
        self._exhausted = False
        yield from super().__iter__()

    def _pre_pack(self, samples: list) -> list:
        carried = list(self._carried[:len(samples)]) + [0] * max(len(samples) - len(self._carried), 0)
        self._carried = []
        wc = self.worker_config
        context = BufferContext(carried, self._exhausted, self._packs_planned, wc.rank_worker_id(),
                                max(wc.num_workers, 1), self.batch_size, self._density)
        packs = self._select(samples, context)
        for sample, _ in context.carry:
            self._reading_buffer.append(sample)
        self._carried = [int(times) for _, times in context.carry]
        self._packs_planned += sum(1 for p in packs if p)
        return packs

    def __str__(self) -> str:
        return f"CarryingPackingDataset(buffer_size={self.buffer_size}, dataset={self.dataset})"


@contextlib.contextmanager
def packing_stage(batch_size: int, held: Any = None) -> Iterator[Callable[..., CarryingPackingDataset]]:
    """While open, Energon's ``build_batch`` builds a :class:`CarryingPackingDataset` (told the
    loader's ``batch_size`` and the media bytes ``held`` policy, or None) where it would build its
    ``PackingDataset``."""

    def build(*args: Any, **kwargs: Any) -> CarryingPackingDataset:
        return CarryingPackingDataset(*args, batch_size=batch_size, held=held, **kwargs)

    saved = _task_base.PackingDataset
    _task_base.PackingDataset = build
    try:
        yield build
    finally:
        _task_base.PackingDataset = saved
