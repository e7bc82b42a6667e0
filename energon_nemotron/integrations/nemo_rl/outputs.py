"""The ``nemo_rl_packed`` task-encoder output (``task_encoder.options.output``): the encoder's
``batch`` yields NeMo-RL's packed SFT batch dict (:func:`~energon_nemotron.integrations.nemo_rl.
batches.to_nemo_rl_packed`) instead of a ``PackedBatch``, for NeMo-RL's own Energon loader.

Registered in ``registry.BATCH_OUTPUTS`` by this module's name, so the core never imports it. The
dict holds NeMo-RL's keys only (its ``BatchedDataDict`` slices every value by pack): the per-batch
``skipped`` counts are not carried (the encoder's ``counters.skipped`` still counts every skip). Rows keep the library's width (the encoder's
options do not carry ``packing.pad_multiple``): ``input_lengths`` and ``cu_seqlens_padded[-1]`` are
the sequence length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from energon_nemotron.batch import PackedBatch
from energon_nemotron.integrations.nemo_rl.batches import to_nemo_rl_packed
from energon_nemotron.registry import BATCH_OUTPUTS

__all__ = ["NemoRLPackedOutput"]


@dataclass(frozen=True)
class NemoRLPackedOutput:
    """NeMo-RL's packed batch: one pack per row, any number of rows per batch."""

    name: str = "nemo_rl_packed"

    def check_options(self, options: Any) -> None:
        """Nothing to refuse: NeMo-RL's prepacked path takes any layout the options make."""

    def check_media(self, key: str, kinds: set[str], options: Any) -> None:
        """Nothing to refuse: NeMo-RL's Nemotron path takes images, video and audio."""

    def convert(self, batch: PackedBatch, options: Any, skipped: dict[str, int]) -> dict[str, Any]:
        return to_nemo_rl_packed(batch)


BATCH_OUTPUTS.register("nemo_rl_packed", NemoRLPackedOutput())
