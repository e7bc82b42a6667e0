"""What reading a dataset for statistics produces: one plain record per sample (or row), and the
merge of the parts several readers produced.

A reader (the single-process engine, or one Ray actor of N) reads its part of every dataset of a
data source and returns one :class:`DatasetPart` per dataset, in the source's order. Each record
carries the sample's position in its dataset (``index``: Energon's sample index, or the row index
of a Megatron-LM file), so :func:`merge_parts` can put the parts of N readers back into dataset
order; every engine then aggregates the same sequence and reports the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Union


@dataclass
class SampleRecord:
    """One sample of an Energon dataset after phase 1 (``preencode_sample``), or why it was skipped.

    ``code``: the skip reason (``DataError.code`` / ``errors.error_code``; None: read fine);
    ``message``: ``where: why`` of a skipped sample. ``length``: the packing cost (its sources, each
    rounded up to the pad multiple) before the ``over_length`` policy; ``tokens``: the same without
    the rounding; ``cost``: what the packer sees (after ``over_length: truncate``; None when the
    sample is dropped). ``length`` is set for every sample that was tokenized, also one dropped as
    over-length. ``media``: per item ``(kind, bytes, planned tokens)``; ``patches``: vision patches.
    """

    index: Optional[int]
    key: str
    code: Optional[str] = None
    message: str = ""
    length: Optional[int] = None
    tokens: Optional[int] = None
    cost: Optional[int] = None
    patches: int = 0
    media: tuple = ()


@dataclass
class RowRecord:
    """One row of a Megatron-LM offline-packed file: ``index`` (row number from 0, blank lines not
    counted), ``conversations`` in it, ``length`` (the positions its conversations take after
    re-tokenization, each rounded up to 2·CP, before any truncation), ``truncated`` (longer than
    ``seq_length``: cut as Megatron-LM cuts it), ``dropped`` conversations; or ``code`` /
    ``message`` when the row cannot be read."""

    index: Optional[int]
    key: str
    code: Optional[str] = None
    message: str = ""
    conversations: int = 0
    length: Optional[int] = None
    truncated: bool = False
    dropped: int = 0


Record = Union[SampleRecord, RowRecord]


@dataclass
class DatasetPart:
    """A reader's records of one dataset, and what describes the dataset (``info``: path, format,
    blend weight, subflavors, ...; the same in every reader)."""

    info: dict
    records: list = field(default_factory=list)


def order_key(record: Record) -> tuple:
    """Dataset order: by ``index``; records without one last, by key."""
    return (record.index is None, record.index if record.index is not None else 0, record.key)


def limited(records: Sequence[Record], limit: Optional[int]) -> list:
    """The records in dataset order, at most the first ``limit`` (None: all)."""
    ordered = sorted(records, key=order_key)
    return ordered if limit is None else ordered[:limit]


def merge_parts(parts: Sequence[Sequence[DatasetPart]], limit: Optional[int] = None) -> list[DatasetPart]:
    """The parts of several readers (each reader's list of ``DatasetPart`` in source order) as one
    ``DatasetPart`` per dataset, records in dataset order and at most ``limit`` of them. Each reader
    must have read at most its own first ``limit`` records, which covers the first ``limit`` of
    the dataset. A reader that saw other datasets is a ``RuntimeError``."""
    if not parts:
        return []
    first = parts[0]
    for r, other in enumerate(parts[1:], 1):
        if [p.info.get("path") for p in other] != [p.info.get("path") for p in first]:
            raise RuntimeError(f"reader {r} saw other datasets than reader 0: "
                               f"{[p.info.get('path') for p in other]} vs {[p.info.get('path') for p in first]}")
    merged = []
    for i, part in enumerate(first):
        records: list[Any] = [rec for reader in parts for rec in reader[i].records]
        merged.append(DatasetPart(dict(part.info), limited(records, limit)))
    return merged
