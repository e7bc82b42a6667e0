"""One reader's part of a loader config's data source: the engines' common unit of work.

``collect_part(cfg, split, rank, world)`` reads part ``rank`` of ``world`` of every dataset of the
split's source (an Energon dataset, metadataset or JSONL: ``energon_reader``; Megatron-LM
offline-packed rows: ``megatron_reader``) and returns one ``DatasetPart`` per dataset. The
single-process engine is ``collect_part(cfg, split, 0, 1)``; the Ray engine runs it on N actors
and merges (``records.merge_parts``).
"""

from __future__ import annotations

import contextlib
import sys
from typing import Optional

from energon_nemotron.config import LoaderConfig, MegatronSource, Source
from energon_nemotron.loading.preflight import check_source_path
from energon_nemotron.errors import ConfigError
from energon_nemotron.stats.records import DatasetPart

SPLITS = ("train", "validation")


def source_of(cfg: LoaderConfig, split: str) -> Source:
    """The data source of ``split`` (``train`` | ``validation``), checked to be there."""
    if split not in SPLITS:
        raise ConfigError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    src = cfg.data.validation if split == "validation" else cfg.data.train
    if src is None:
        raise ConfigError("data.validation is not set")
    check_source_path(src, f"data.{split}")
    return src


def seq_length_of(cfg: LoaderConfig, src: Source) -> int:
    """The row length the source is read for: the Megatron-LM source's, else the task encoder's."""
    if isinstance(src, MegatronSource):
        return src.seq_length
    value = cfg.task_encoder.options.get("seq_length")
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"task_encoder.options.seq_length: expected an integer, got {value!r}")
    return value


def collect_part(cfg: LoaderConfig, split: str = "train", rank: int = 0, world: int = 1,
                 limit: Optional[int] = None, progress: bool = False) -> list[DatasetPart]:
    """Part ``rank`` of ``world`` of every dataset of the split (at most its first ``limit``
    records per dataset). Whatever Energon prints goes to stderr."""
    src = source_of(cfg, split)
    with contextlib.redirect_stdout(sys.stderr):
        if isinstance(src, MegatronSource):
            from energon_nemotron.stats.megatron_reader import read_megatron

            return read_megatron(cfg, src, rank, world, limit, progress)
        from energon_nemotron.stats.energon_reader import read_energon

        return read_energon(cfg, src, rank, world, limit, progress)
