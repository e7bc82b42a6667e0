"""Records → the numbers of ``energon-nemotron stats`` (pure functions; one JSON-able dict).

Per dataset: samples read, skipped by reason code (with the first examples), the length
distribution (histogram, percentiles), the share over ``seq_length``, media by kind (bytes and
planned tokens) and the fill the configured packer reaches on the dataset's real lengths; then a
total over the datasets. Megatron-LM files: rows, conversations per row, positions per row and the
share truncated.

Definitions:

- *measured* samples: those that were tokenized (read fine, or dropped as over-length by the
  ``over_length`` policy); lengths, the share over ``seq_length`` and media are taken over them.
- percentiles are nearest-rank: ``p``-th = the ``ceil(p/100 · n)``-th smallest length.
- the histogram has :data:`HIST_BINS` bins of equal integer width ``w = ceil(top / HIST_BINS)``,
  ``top = max(seq_length, longest)``; bin ``i`` holds lengths in ``[i·w, (i+1)·w)``, the last one
  also ``HIST_BINS·w``.
- packing: the samples the loader would pack (read fine; ``cost`` after ``over_length``), in
  dataset order, in consecutive buffers of ``buffer_size``, each packed by the configured packer
  with the loader's seed (``crc32`` of the buffer's keys xor ``loader.seed``) and limits, and the
  samples of under-filled packs carried into the next buffer as the loader carries them
  (``packing.carry``; the last buffer carries nothing); fill = Σ min(cost, seq_length) / (packs ·
  seq_length). The cost cap (``packing.balance.cost_cap``) is not applied here. Without packing one sample is one row.
  The total packs each dataset on its own and sums (the loader's blend mixes them).
"""

from __future__ import annotations

import math
import zlib
from collections import Counter
from typing import Any, Iterable, Optional, Sequence

from energon_nemotron.stats.records import DatasetPart, RowRecord, SampleRecord

HIST_BINS = 20
EXAMPLES = 3
KINDS = ("image", "video", "audio")
SAMPLE_LENGTH = ("packing cost: a sample's tokens (media placeholders included), each of its sources rounded up "
                 "to the pad multiple, before the over_length policy")
ROW_LENGTH = ("positions per row: its conversations' tokens after re-tokenization, each rounded up to "
              "2*context_parallel_size, before truncation")


def _round(x: float) -> float:
    return round(float(x), 6)


def nearest_rank(ordered: Sequence[int], p: float) -> int:
    """The ``p``-th percentile (nearest rank) of the sorted, non-empty ``ordered``."""
    return int(ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)])


def histogram(values: Sequence[int], seq_length: int, bins: int = HIST_BINS) -> dict:
    """``{"edges": [0, w, ..., bins·w], "counts": [...]}`` (see the module docstring)."""
    top = max([seq_length, *values])
    width = max(1, math.ceil(top / bins))
    counts = [0] * bins
    for v in values:
        counts[min(int(v) // width, bins - 1)] += 1
    return {"edges": [i * width for i in range(bins + 1)], "counts": counts}


def length_summary(values: Sequence[int], seq_length: int) -> dict:
    """Count, min, mean, p50/p90/p99, max, the share over ``seq_length`` and the histogram."""
    ordered = sorted(int(v) for v in values)
    n = len(ordered)
    over = sum(1 for v in ordered if v > seq_length)
    out: dict[str, Any] = {"count": n, "total": sum(ordered)}
    if n:
        out.update({"min": ordered[0], "mean": _round(sum(ordered) / n), "p50": nearest_rank(ordered, 50),
                    "p90": nearest_rank(ordered, 90), "p99": nearest_rank(ordered, 99), "max": ordered[-1]})
    out["over_seq_length"] = {"count": over, "share": _round(over / n) if n else 0.0}
    out["histogram"] = histogram(ordered, seq_length)
    return out


def _spread(values: Sequence[int]) -> dict:
    return {"total": sum(values), "mean": _round(sum(values) / len(values)) if values else 0.0,
            "max": max(values) if values else 0}


def media_summary(records: Iterable[SampleRecord]) -> dict:
    """Per kind: items, their bytes and planned tokens (total, mean, max)."""
    sizes: dict[str, list[int]] = {}
    tokens: dict[str, list[int]] = {}
    for r in records:
        for kind, nbytes, ntokens in r.media:
            sizes.setdefault(kind, []).append(int(nbytes))
            tokens.setdefault(kind, []).append(int(ntokens))
    order = [k for k in KINDS if k in sizes] + sorted(k for k in sizes if k not in KINDS)
    return {k: {"count": len(sizes[k]), "bytes": _spread(sizes[k]), "planned_tokens": _spread(tokens[k])}
            for k in order}


def skip_summary(records: Sequence[Any]) -> tuple[dict, dict]:
    """(skips by code, the first :data:`EXAMPLES` messages per code) of records in dataset order."""
    counts = Counter(r.code for r in records if r.code is not None)
    examples: dict[str, list[str]] = {}
    for r in records:
        if r.code is not None and len(examples.setdefault(r.code, [])) < EXAMPLES:
            examples[r.code].append(r.message)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))), {k: examples[k] for k in sorted(examples)}


def pack_fill(records: Sequence[SampleRecord], seq_length: int, packing: Any, seed: int) -> dict:
    """The packing the loader's packer makes of these records' costs (see the module docstring);
    ``packing``: a ``PackingConfig`` or None."""
    rows = [r for r in records if r.cost is not None]
    tokens = sum(min(r.cost, seq_length) for r in rows)
    if packing is None:
        return {"algorithm": None, "note": "no packing configured: one sample per row", "samples": len(rows),
                "packs": len(rows), "tokens": tokens,
                "fill_ratio": _round(tokens / (len(rows) * seq_length)) if rows else 0.0}
    from energon_nemotron.packing.balance import CarryRule, plan_buffer
    from energon_nemotron.packing.spec import packer_options
    from energon_nemotron.registry import PACKERS

    packer = PACKERS.get(packing.algorithm)
    rule = CarryRule(packing.carry.max_times, packing.carry.min_fill) if packing.carry is not None else None
    packs, at, carried = 0, 0, []             # carried: (record, times carried) back at the next buffer's front
    while at < len(rows) or carried:
        fresh = rows[at:at + packing.buffer_size - len(carried)]
        at += len(fresh)
        buffer, times = [r for r, _ in carried] + fresh, [t for _, t in carried] + [0] * len(fresh)
        buffer_seed = zlib.crc32("\0".join(r.key for r in buffer).encode()) ^ seed
        plan = plan_buffer(packer, [r.cost for r in buffer], seq_length, carried=times,
                           carry=rule if at < len(rows) else None, seed=buffer_seed,
                           **packer_options(packing, [r.patches for r in buffer]))
        packs += len(plan.bins)
        carried = [(buffer[i], times[i] + 1) for i in plan.carry]
    return {"algorithm": packing.algorithm, "buffer_size": packing.buffer_size, "pad_multiple": packing.pad_multiple,
            "carry": packing.carry.model_dump() if packing.carry is not None else None,
            "max_sequences_per_bin": packing.max_sequences_per_bin,
            "balanced_knapsack_delta": packing.balanced_knapsack_delta,
            "max_media_patches_per_pack": packing.max_media_patches_per_pack, "samples": len(rows), "packs": packs,
            "tokens": tokens, "fill_ratio": _round(tokens / (packs * seq_length)) if packs else 0.0,
            "samples_per_pack": _round(len(rows) / packs) if packs else 0.0}


def sample_summary(records: Sequence[SampleRecord], seq_length: int) -> dict:
    """The numbers of an Energon dataset's records (or of several datasets' records, for the
    total), packing aside (:func:`pack_fill`, :func:`combined_packing`)."""
    skipped, examples = skip_summary(records)
    measured = [r for r in records if r.length is not None]
    out = {"unit": "samples", "read": len(records), "ok": sum(1 for r in records if r.code is None),
           "skipped": skipped, "skip_examples": examples,
           "length": length_summary([r.length for r in measured], seq_length),
           "tokens": sum(r.tokens for r in measured), "media": media_summary(measured)}
    return out


def combined_packing(packings: Sequence[dict], seq_length: int) -> dict:
    """The datasets' packings summed (each dataset packed on its own)."""
    samples = sum(p["samples"] for p in packings)
    packs = sum(p["packs"] for p in packings)
    tokens = sum(p["tokens"] for p in packings)
    first = dict(packings[0]) if packings else {"algorithm": None}
    first.update({"samples": samples, "packs": packs, "tokens": tokens,
                  "fill_ratio": _round(tokens / (packs * seq_length)) if packs else 0.0})
    if "samples_per_pack" in first:
        first["samples_per_pack"] = _round(samples / packs) if packs else 0.0
    first["note"] = "each dataset packed on its own, summed" + ("" if first.get("algorithm") else
                                                               "; no packing configured: one sample per row")
    return first


def row_summary(records: Sequence[RowRecord], seq_length: int) -> dict:
    """The numbers of a Megatron-LM file's row records."""
    skipped, examples = skip_summary(records)
    rows = [r for r in records if r.code is None]
    convs = Counter(r.conversations for r in rows)
    truncated = sum(1 for r in rows if r.truncated)
    return {"unit": "rows", "read": len(records), "ok": len(rows), "skipped": skipped, "skip_examples": examples,
            "conversations": {"total": sum(r.conversations for r in rows),
                              "per_row_mean": _round(sum(r.conversations for r in rows) / len(rows)) if rows else 0.0,
                              "per_row_max": max((r.conversations for r in rows), default=0),
                              "rows_by_count": {str(k): convs[k] for k in sorted(convs)}},
            "length": length_summary([r.length for r in rows], seq_length),
            "truncated": {"count": truncated, "share": _round(truncated / len(rows)) if rows else 0.0},
            "dropped_conversations": sum(r.dropped for r in rows)}


def summarize(parts: Sequence[DatasetPart], *, seq_length: int, packing: Any = None, seed: int = 0,
              megatron: bool = False) -> dict:
    """``{"length_measure", "seq_length", "datasets": [...], "total": {...}}`` of merged parts."""
    datasets, everything = [], []
    for part in parts:
        if megatron:
            numbers = row_summary(part.records, seq_length)
        else:
            numbers = sample_summary(part.records, seq_length)
            numbers["packing"] = pack_fill(part.records, seq_length, packing, seed)
        datasets.append({**part.info, **numbers})
        everything += part.records
    if megatron:
        total = row_summary(everything, seq_length)
    else:
        total = sample_summary(everything, seq_length)
        total["packing"] = combined_packing([d["packing"] for d in datasets], seq_length)
    total["datasets"] = len(datasets)
    return {"length_measure": ROW_LENGTH if megatron else SAMPLE_LENGTH, "seq_length": seq_length,
            "datasets": datasets, "total": total}


def histograms(summary: dict) -> list[tuple[str, dict, Optional[int]]]:
    """(title, histogram, seq_length) of every histogram of a summary: each dataset's, then the total's."""
    out = [(d["path"], d["length"]["histogram"], summary["seq_length"]) for d in summary["datasets"]]
    out.append(("total", summary["total"]["length"]["histogram"], summary["seq_length"]))
    return out
