"""Validation passes evened out over data-parallel ranks: a rank that runs out of batches first
yields padding batches (``is_padding`` True, ``loss_mask`` all zero) up to the largest rank's count."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch

from energon_nemotron.config import LoaderConfig
from energon_nemotron.guards.policy import skip_counter as skip_counter
from energon_nemotron.telemetry import LoaderStats

if TYPE_CHECKING:
    from energon_nemotron.loader import Loader


class EvenedValidation:
    """A rank's validation batches, then padding batches up to the largest rank's count."""

    def __init__(self, cfg: LoaderConfig, group: Any = None) -> None:
        self.cfg = cfg
        self.group = group
        self._loader: Optional[Loader] = None

    def _count(self, rank: int) -> int:
        from energon_nemotron.loader import _build, _with_dp

        other = _with_dp(self.cfg, rank, self.cfg.loader.dp_size)
        return sum(1 for _ in _build(other, validation=True, repeat=False))

    def _max_count(self, mine: int) -> int:
        if self.cfg.loader.dp_size == 1:
            return mine
        if self.group is not None:
            import torch.distributed as dist

            t = torch.tensor([mine], dtype=torch.int64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
            return int(t.item())
        me = self.cfg.loader.dp_rank
        return max([mine] + [self._count(r) for r in range(self.cfg.loader.dp_size) if r != me])

    def skipped(self) -> dict[str, int]:
        """Samples skipped by this rank's pass, by reason."""
        return self._loader.skipped() if self._loader is not None else {}

    def telemetry(self) -> dict:
        """The telemetry of this rank's real batches (padding batches excluded)."""
        if self._loader is None:
            return LoaderStats(skip_counter(), None).as_dict()
        return self._loader.telemetry()

    def __iter__(self):
        from energon_nemotron.loader import _build

        last, n = None, 0
        self._loader = _build(self.cfg, validation=True, repeat=False)
        for batch in self._loader:
            last, n = batch, n + 1
            yield batch
        for _ in range(self._max_count(n) - n):
            yield padding_batch(last, self.cfg)


def padding_batch(template, cfg: LoaderConfig):
    """A batch that trains nothing: ``template`` with its loss mask zeroed, or (a rank that got no
    data at all) one row of pad ids."""
    from energon_nemotron.types import IGNORE_INDEX, PackedBatch

    if template is not None:
        return template._replace(loss_mask=torch.zeros_like(template.loss_mask),
                                 is_padding=[True] * template.batch_size, skipped={})
    s = int(cfg.task_encoder.options.get("seq_length", 1))
    bounds = torch.tensor([0, s], dtype=torch.int32)
    return PackedBatch(tokens=torch.zeros(1, s, dtype=torch.int64),
                       labels=torch.full((1, s), IGNORE_INDEX, dtype=torch.int64),
                       loss_mask=torch.zeros(1, s), position_ids=torch.arange(s).unsqueeze(0),
                       cu_seqlens=[torch.tensor([0, 0], dtype=torch.int32)], cu_seqlens_padded=[bounds],
                       max_seqlen=[s], sample_keys=[[]], is_padding=[True])
