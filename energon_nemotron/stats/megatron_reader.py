"""Reading one rank's rows of a Megatron-LM offline-packed file (``megatron_sft_packed``) for statistics.

The rows are read by the loader's own ``MegatronSFTPackedDataset`` (DP rank ``r`` of ``N`` reads
rows ``r, r+N, ...`` in file order) with ``on_error: skip``, so a bad row is counted by its reason
code and never stops the reading, and re-encoded by the same ``MegatronSFTPackedEncoder`` the
loader builds: its ``truncated`` and ``dropped_conversations`` are Megatron-LM's. The encoder is
wrapped (:class:`MeasuringEncoder`) to add each row's length: the positions its conversations take
after re-tokenization (``conversation_costs``: tokens rounded up to 2·CP), before any truncation.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any, Optional

from energon_nemotron.config import LoaderConfig, MegatronSource
from energon_nemotron.errors import CODES, DataError
from energon_nemotron.guards.skip_limits import SkipTally
from energon_nemotron.stats.records import DatasetPart, RowRecord, limited


class SkipLog(SkipTally):
    """The dataset's skip counter, without limits, that also keeps each skip (code, ``where: why``)
    in reading order."""

    def __init__(self) -> None:
        super().__init__(CODES, 0, None, None)
        self.events: list[tuple[str, str]] = []

    def skip(self, name: str, example: Optional[str] = None, after_read: bool = False) -> None:
        self.events.append((name, example or ""))

    def take(self) -> list[tuple[str, str]]:
        out, self.events = self.events, []
        return out


def row_length(encoder: Any, conversations: list[list[dict]], where: Optional[str]) -> int:
    """Positions the row's conversations take (each one's tokens rounded up to 2·CP). A conversation
    past ``seq_length`` that cannot be encoded (the row drops it) counts 0."""
    wheres = [f"{where or 'row'}#{i}" for i in range(len(conversations))]
    try:
        return sum(encoder.conversation_costs(conversations, wheres))
    except DataError:
        total = 0
        for conversation, w in zip(conversations, wheres):
            try:
                total += encoder.conversation_cost(conversation, w)
            except DataError:
                pass
        return total


class MeasuringEncoder:
    """A ``MegatronSFTPackedEncoder`` whose ``encode`` also returns ``row_length``; everything else
    is the wrapped encoder's."""

    def __init__(self, encoder: Any) -> None:
        self.encoder = encoder

    def __getattr__(self, name: str) -> Any:
        return getattr(self.encoder, name)

    def encode(self, row: Any, where: Optional[str] = None) -> dict:
        out = self.encoder.encode(row, where)
        out["row_length"] = row_length(self.encoder, self.encoder.conversations(row, where), where)
        return out


def megatron_encoder(cfg: LoaderConfig, src: MegatronSource) -> Any:
    """The encoder the loader reads ``src`` with."""
    from energon_nemotron.megatron_packed import MegatronSFTPackedEncoder

    return MegatronSFTPackedEncoder(cfg.tokenizer, src.seq_length, prompt_format=src.prompt_format,
                                    context_parallel_size=src.context_parallel_size, pad_token=src.pad_token,
                                    chat_key=src.chat_key, identity_masks_prompt=src.identity_masks_prompt,
                                    allow_eos_pad=src.allow_eos_pad)


def read_megatron(cfg: LoaderConfig, src: MegatronSource, rank: int = 0, world: int = 1,
                  limit: Optional[int] = None, progress: bool = False) -> list[DatasetPart]:
    """Rank ``rank`` of ``world``'s records of the file's rows (one ``DatasetPart``), at most its
    first ``limit`` rows. A skipped row's index follows from the dataset's item positions: rank
    ``r`` reads rows ``r + (p - 1) * world`` for its items ``p = 1, 2, ...``, read or skipped."""
    from pathlib import Path

    from tqdm import tqdm

    from energon_nemotron.megatron_packed import MegatronSFTPackedDataset

    encoder = megatron_encoder(cfg, src)
    skips = SkipLog()
    dataset = MegatronSFTPackedDataset(src.path, MeasuringEncoder(encoder), dp_rank=rank, dp_size=world,
                                       on_error="skip", skips=skips)
    info = {"path": str(src.path), "format": "megatron_sft_packed", "seq_length": src.seq_length,
            "prompt_format": src.prompt_format, "context_parallel_size": src.context_parallel_size,
            "rows_in_file": dataset.num_rows()}
    records: list[RowRecord] = []
    position = 0                                 # the last item (row read or skipped) placed

    def skipped(events: list, upto: Optional[int]) -> None:
        nonlocal position
        if upto is not None and len(events) != upto - position - 1:
            raise RuntimeError(f"{src.path}: {len(events)} skipped rows before item {upto}, "
                               f"expected {upto - position - 1}")
        for code, message in events:
            position += 1
            index = rank + (position - 1) * world
            records.append(RowRecord(index, f"row {index}", code, message))

    total = info["rows_in_file"] if world == 1 else None
    total = min(total, limit) if total is not None and limit is not None else total
    with warnings.catch_warnings(), tqdm(total=total, desc=Path(src.path).name, unit="row",
                                         disable=not progress, leave=False, file=sys.stderr) as bar:
        warnings.simplefilter("ignore")          # truncation and pad reports: counted here instead
        for out in dataset:
            _, p = out["position"]
            before = len(records)
            skipped(skips.take(), p)
            index = rank + (p - 1) * world
            records.append(RowRecord(index, f"row {index}", conversations=int(out["num_conversations"]),
                                     length=int(out["row_length"]), truncated=bool(out["truncated"]),
                                     dropped=int(out["dropped_conversations"])))
            position = p
            bar.update(len(records) - before)
            if limit is not None and len(records) >= limit:
                break
        else:
            skipped(skips.take(), None)
    return [DatasetPart(info, limited(records, limit))]
