"""Validation passes evened out over data-parallel ranks (:func:`build_val_loader`): a rank that
runs out of batches first yields padding batches (``is_padding`` True, ``loss_mask`` all zero) up to
the largest rank's count."""

from __future__ import annotations

from typing import Any, Iterable, Optional

import torch

from energon_nemotron.config import LoaderConfig, MegatronSource
from energon_nemotron.guards.policy import skip_counter
from energon_nemotron.loading.loader import ConfigLike, Loader, build_loader, with_dp
from energon_nemotron.loading.stats import LoaderStats
from energon_nemotron.batch import IGNORE_INDEX, PackedBatch


class EvenedValidation:
    """A rank's validation batches, then padding batches up to the largest rank's count."""

    def __init__(self, cfg: LoaderConfig, group: Any = None) -> None:
        self.cfg = cfg
        self.group = group
        self._loader: Optional[Loader] = None

    def _count(self, rank: int) -> int:
        other = with_dp(self.cfg, rank, self.cfg.loader.dp_size)
        return sum(1 for _ in build_loader(other, validation=True, repeat=False))

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
        last, n = None, 0
        self._loader = build_loader(self.cfg, validation=True, repeat=False)
        for batch in self._loader:
            last, n = batch, n + 1
            yield batch
        for _ in range(self._max_count(n) - n):
            yield padding_batch(last, self.cfg)


def padding_batch(template, cfg: LoaderConfig):
    """A batch that trains nothing: ``template`` with its loss mask zeroed, or (a rank that got no
    data at all) one row of pad ids."""
    if template is not None:
        return template.replace(loss_mask=torch.zeros_like(template.loss_mask),
                                 is_padding=[True] * template.batch_size, skipped={})
    s = int(cfg.task_encoder.options.get("seq_length", 1))
    bounds = torch.tensor([0, s], dtype=torch.int32)
    return PackedBatch(tokens=torch.zeros(1, s, dtype=torch.int64),
                       labels=torch.full((1, s), IGNORE_INDEX, dtype=torch.int64),
                       loss_mask=torch.zeros(1, s), position_ids=torch.arange(s).unsqueeze(0),
                       cu_seqlens=[torch.tensor([0, 0], dtype=torch.int32)], cu_seqlens_padded=[bounds],
                       max_seqlen=[s], sample_keys=[[]], is_padding=[True])


def build_val_loader(config: ConfigLike, dp_rank: Optional[int] = None, dp_size: Optional[int] = None,
                     group: Any = None) -> Iterable[Any]:
    """Batches of the validation split for one data-parallel rank (one pass), padded so that every
    rank yields the same number of batches. ``group``: the data-parallel ``torch.distributed``
    group, used to agree on that number; without it (single process) the other ranks' batch
    counts are computed by reading their parts."""
    cfg = with_dp(config, dp_rank, dp_size)
    if isinstance(cfg.data.validation, MegatronSource):
        return build_loader(cfg, validation=True, repeat=False)          # pads by rows itself
    return EvenedValidation(cfg, group)
