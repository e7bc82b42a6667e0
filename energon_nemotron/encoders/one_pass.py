"""The end of a one-pass read, kept in the loader state.

Energon's sample loader resets its position when its source is exhausted (ready for the next
epoch), and a blend resets which of its datasets are exhausted once all are. In a loader that
repeats, the next epoch starts right away, so no state ever holds that reset. In a one-pass loader
(``repeat=False``, validation) the shuffle and packing buffers are still draining after it: a
state saved then holds a source that looks unread, and a restored loader would read the whole
epoch again.

:class:`OnePassEnd` saves one flag, ``_ended``: the wrapped source has been read to its end in
this pass. Restored with the flag set it reads nothing more; iterated again without a restore (a
second pass over the same loader object) it reads the source anew. A one-pass training loader
wraps its whole source (the blend with its repetitions: :func:`guard_source`), right below the
shuffle buffer; Energon's own state covers everything inside (which datasets of a blend are
exhausted, a ``RepeatDataset``'s repetition). A validation loader wraps each dataset: Energon
concatenates them, and the concatenation keeps no state of which one it is reading.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator

from megatron.energon import SavableDataset, ShuffleBufferDataset

from energon_nemotron._energon import WrapperDataset, saves


@saves("_ended")
class OnePassEnd(WrapperDataset):
    """Yields the wrapped dataset's samples unchanged; remembers (in its state) that the wrapped
    dataset has been read to its end."""

    def __init__(self, dataset: SavableDataset, *, worker_config: Any) -> None:
        super().__init__(dataset, worker_config=worker_config)
        self.reset_state_own()

    def reset_state_own(self) -> None:
        self._ended = False
        self._restored = False

    def restore_state(self, state: Any) -> None:
        super().restore_state(state)
        self._restored = True

    def len_worker(self, worker_idx: int | None = None) -> int:
        return self.dataset.len_worker(worker_idx)

    def __iter__(self) -> Iterator[Any]:
        if self._restored and self._ended:
            self._restored = False          # restored after this pass had read the source to its end
            return
        self._restored = False
        self._ended = False
        yield from self.dataset
        self._ended = True

    def config(self) -> Dict[str, Any]:
        return {"type": type(self).__qualname__, "dataset": self.dataset.config(),
                "worker_config": self.worker_config.config()}

    def __str__(self) -> str:
        return f"OnePassEnd(dataset={self.dataset})"


def guard_source(dataset: SavableDataset, worker_config: Any) -> SavableDataset:
    """``dataset`` (Energon's combined training source, under its shuffle buffer if it has one)
    with :class:`OnePassEnd` between the source and the buffer (nothing has been read yet, so the
    buffer is rebuilt around the guarded source with the same size)."""
    if isinstance(dataset, ShuffleBufferDataset):
        return ShuffleBufferDataset(OnePassEnd(dataset.dataset, worker_config=worker_config), size=dataset.size,
                                    worker_config=worker_config)
    return OnePassEnd(dataset, worker_config=worker_config)
