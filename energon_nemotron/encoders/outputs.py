"""What the task encoder's ``batch`` yields (``task_encoder.options.output``).

``packed_batch`` (the default): a ``PackedBatch``. Any other name is a :class:`BatchOutput`
registered in ``registry.BATCH_OUTPUTS``: the library registers the Megatron-Bridge steps
(``nemotron_omni_step``, ``nemotron_omni_expanded``, ``gpt_step``) from ``integrations.bridge_outputs``,
by module name, so the core never imports its consumer adapters. An output checks the media of each
sample before packing (a sample it cannot carry is a ``DataError`` of the sample, so ``on_error``
applies) and turns each batch into what its consumer reads.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol

from energon_nemotron.batch import PackedBatch
from energon_nemotron.registry import BATCH_OUTPUTS

#: the ``output`` that yields the library's own ``PackedBatch``
PACKED_BATCH = "packed_batch"

__all__ = ["BatchOutput", "PACKED_BATCH", "batch_output"]


class BatchOutput(Protocol):
    """A consumer's batch format (registered in ``registry.BATCH_OUTPUTS``)."""

    def check_options(self, options: Any) -> None:
        """Raise ``ConfigError`` when the encoder ``options`` can make batches the consumer cannot
        take (checked once, when the encoder is built)."""

    def check_media(self, key: str, kinds: set[str], options: Any) -> None:
        """Raise ``DataError`` (naming ``key``) when a sample with media of ``kinds`` cannot be
        carried under the encoder ``options``."""

    def convert(self, batch: PackedBatch, options: Any, skipped: dict[str, int]) -> Any:
        """``batch`` as the consumer reads it; ``skipped``: this process's skips since the last
        batch, by reason."""


def batch_output(name: str) -> Optional[BatchOutput]:
    """The registered output ``name`` (None for :data:`PACKED_BATCH`)."""
    return None if name == PACKED_BATCH else BATCH_OUTPUTS.get(name)
