"""A loader's running statistics: what its batches show (samples, packs, fill, tokens/s) in the main
process, with the counters its workers share (``telemetry.SharedCounter``: media decoded, media
found by basename in an aux source, samples skipped by reason)."""

from __future__ import annotations

import logging
import sys
import time
from typing import Optional

import torch

from energon_nemotron.packing.balance import CostModel
from energon_nemotron.telemetry import SharedCounter, SharedGauge

log = logging.getLogger("energon_nemotron")

__all__ = ["LoaderStats", "batch_cost"]


def batch_cost(batch, model: CostModel) -> float:
    """A batch's training work (``packing.balance.CostModel``, LLM token positions): every row
    position, attention over each segment (``cu_seqlens``), the vision patches of its units
    (``image_sizes``: grid_h x grid_w each) and its audio mel frames (``sound_lengths``)."""
    squares = 0
    for cu in batch.cu_seqlens:
        lengths = (cu[1:] - cu[:-1]).to(dtype=torch.float64)
        squares += float((lengths * lengths).sum())
    media = batch.media
    patches = int(media.image_sizes.as_tensor().prod(dim=-1).sum()) if media.image_sizes is not None else 0
    frames = int(media.sound_lengths.as_tensor().sum()) if media.sound_lengths is not None else 0
    return float(batch.batch_size * batch.seq_length) + model.extra([], patches, frames) + model.attention * squares


class LoaderStats:
    """Running totals of a loader's batches; ``line()`` is the one-line summary that is logged
    every ``log_every`` batches (:func:`emit`)."""

    def __init__(self, skips: SharedCounter, decodes: Optional[SharedCounter], pad_id: Optional[int] = None,
                 log_every: int = 0, lookups: Optional[SharedCounter] = None,
                 packing: Optional[SharedCounter] = None, cost: Optional[CostModel] = None,
                 buffer_bytes: Optional[tuple[SharedGauge, int]] = None) -> None:
        self.skips, self.decodes, self.pad_id, self.log_every = skips, decodes, pad_id, log_every
        self.lookups = lookups      # media found by basename in an aux source (cookers.media_sources)
        self.packing = packing      # samples carried into a next buffer (encoders.pre_pack), read again
        self.buffer_bytes = buffer_bytes   # (gauge, budget per worker): packing.max_buffer_bytes
        self.cost = cost            # the packing's cost model: this rank's step costs (None: not counted)
        self.cost_sum = self.cost_max = 0.0
        self.batches = self.rows = self.samples = self.tokens = self.positions = 0
        self.carried: dict[str, int] = {}    # the skips the batches so far carried (PackedBatch.skipped)
        self.ended = False                   # the iteration ended: add what no batch carried
        self.start = time.perf_counter()

    def update(self, batch) -> None:
        self.batches += 1
        for reason, n in batch.skipped.items():
            self.carried[reason] = self.carried.get(reason, 0) + n
        self.rows += batch.batch_size
        self.positions += batch.batch_size * batch.seq_length
        self.samples += sum(len(k) for k, pad in zip(batch.sample_keys, batch.is_padding) if not pad)
        if self.pad_id is not None:       # Megatron-LM rows: pads sit inside the segments
            self.tokens += int((batch.tokens != self.pad_id).sum())
        else:
            self.tokens += sum(int(c[-1]) for c in batch.cu_seqlens)
        if self.cost is not None:
            c = batch_cost(batch, self.cost)
            self.cost_sum += c
            self.cost_max = max(self.cost_max, c)
        if self.log_every and self.batches % self.log_every == 0:
            emit(self.line())

    def skipped(self) -> dict[str, int]:
        """The skips the batches so far carried; once the iteration ended, plus those no batch
        carried (a worker's skips after its last batch; ``telemetry.SharedCounter``)."""
        out = dict(self.carried)
        left = self.skips.unreported_totals() if self.ended and hasattr(self.skips, "unreported_totals") else {}
        for reason, n in left.items():
            out[reason] = out.get(reason, 0) + n
        return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))

    def as_dict(self) -> dict:
        seconds = time.perf_counter() - self.start
        media = self.decodes.totals() if self.decodes is not None else {}
        truncated = media.pop("audio_truncated", 0)
        fallback = self.lookups.totals().get("basename_fallback", 0) if self.lookups is not None else 0
        return {"batches": self.batches, "packs": self.rows, "samples": self.samples, "tokens": self.tokens,
                "fill_ratio": self.tokens / self.positions if self.positions else 0.0,
                "tokens_per_s": self.tokens / seconds if seconds > 0 else 0.0, "seconds": seconds,
                "media_decoded": media, "audio_truncated": truncated, "basename_fallback": fallback,
                "carried": self.packing.totals().get("carried", 0) if self.packing is not None else 0,
                "step_cost": self._step_cost(), "buffer_bytes": self._buffer_bytes(),
                "skipped": self.skipped()}

    def _buffer_bytes(self) -> dict:
        """The media bytes the packing buffers hold (all workers now, one worker's peak), the budget
        per worker and the samples read again; {} without ``packing.max_buffer_bytes``."""
        if self.buffer_bytes is None:
            return {}
        gauge, budget = self.buffer_bytes
        reread = self.packing.totals().get("reread", 0) if self.packing is not None else 0
        return {"held": gauge.now(), "peak_per_worker": gauge.peak(), "budget_per_worker": budget, "reread": reread}

    def _step_cost(self) -> dict:
        """This rank's step costs so far (``batch_cost``, row positions): mean, and max ÷ mean (the
        spread across ranks needs every rank's: ``benchmarks/dp_balance.py``); {} when not counted."""
        if self.cost is None or not self.batches:
            return {}
        mean = self.cost_sum / self.batches
        return {"mean": round(mean, 1), "max_over_mean": round(self.cost_max / mean, 4)}

    def line(self) -> str:
        d = self.as_dict()
        media = " ".join(f"{k} {v}" for k, v in d["media_decoded"].items()) or "none"
        skipped = " ".join(f"{k} {v}" for k, v in d["skipped"].items()) or "none"
        truncated = f" ({d['audio_truncated']} audio truncated)" if d["audio_truncated"] else ""
        fallback = f" | media found by basename: {d['basename_fallback']}" if d["basename_fallback"] else ""
        carried = f" | carried {d['carried']}" if d["carried"] else ""
        b = d["buffer_bytes"]
        if b:
            carried += (f" | buffer media {b['peak_per_worker'] / 2**20:,.0f} of {b['budget_per_worker'] / 2**20:,.0f} "
                        f"MiB per worker, reread {b['reread']}")
        return (f"batches {d['batches']} | packs {d['packs']} | samples {d['samples']} | fill {d['fill_ratio']:.2%} | "
                f"{d['tokens_per_s']:,.0f} tokens/s | media decoded: {media}{truncated}{fallback}{carried} | "
                f"skipped: {skipped}")


def emit(line: str) -> None:
    """Log ``line`` at INFO on the logger ``energon_nemotron`` where logging is set up to show it
    (a handler, and INFO enabled); else write it to stderr as ``energon_nemotron: LINE``, so that
    ``loader.log_every`` prints without the user configuring logging."""
    if log.isEnabledFor(logging.INFO) and log.hasHandlers():
        log.info(line)
    else:
        print(f"energon_nemotron: {line}", file=sys.stderr, flush=True)
