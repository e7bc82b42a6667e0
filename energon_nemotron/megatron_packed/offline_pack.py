"""Offline packer: raw ``{"messages": [...]}`` conversations → Megatron-LM offline-packed rows.

Each input line is split into conversations at ``system`` messages (a conversation that does not
start with one gets an empty system message, because in a packed row the system message is what
separates conversations). Each conversation's cost is counted with the very encoder that will read
the rows (its tokens, rounded up to a multiple of 2·CP), and whole conversations are bin-packed into
rows of ``seq_length`` positions with a registered packer, so re-encoding a row never truncates.
A conversation longer than ``seq_length`` gets a row of its own (the loader will truncate it and
say so); the summary lists them. Input is streamed twice (costs, then rows), so memory holds only
one length and one file offset per conversation.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
from tqdm import tqdm

from energon_nemotron.megatron_packed.dataset import iter_jsonl, parse_json_line
from energon_nemotron.megatron_packed.encoder import MegatronSFTPackedEncoder
from energon_nemotron.packing.algorithms import fill_ratio
from energon_nemotron.registry import PACKERS

#: conversations tokenized per native tokenizer call while counting
COUNT_CHUNK = 512


@dataclass
class PackSummary:
    """What ``pack_file`` did."""

    input_lines: int = 0
    conversations: int = 0
    rows: int = 0
    fill_ratio: float = 0.0
    tokens: int = 0
    seq_length: int = 0
    algorithm: str = ""
    added_system_messages: int = 0
    oversized: list[str] = field(default_factory=list)   # "file:line#conversation" of each

    def as_dict(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        lines = [
            f"input lines        {self.input_lines}",
            f"conversations      {self.conversations}",
            f"rows               {self.rows}  (seq_length {self.seq_length}, {self.algorithm})",
            f"fill ratio         {self.fill_ratio:.4%}  ({self.tokens} token positions used)",
            f"empty system added {self.added_system_messages}",
            f"oversized          {len(self.oversized)}  (each in a row of its own; truncated when read)",
        ]
        lines += [f"  {k}" for k in self.oversized[:20]]
        if len(self.oversized) > 20:
            lines.append(f"  ... {len(self.oversized) - 20} more")
        return "\n".join(lines)


def _with_system(conversation: list[dict]) -> tuple[list[dict], bool]:
    if conversation[0]["role"] == "system":
        return conversation, False
    return [{"role": "system", "content": ""}] + conversation, True


def count_costs(path: Path, encoder: MegatronSFTPackedEncoder, progress: bool = True):
    """Pass 1: per conversation (cost, byte offset of its line, index in the line, where).

    Returns (costs int64 [C], offsets int64 [C], index_in_line int32 [C], where list[str],
    input lines, added system messages).
    """
    costs, offsets, index_in_line, wheres = [], [], [], []
    pending: list[tuple[list[dict], str]] = []
    added = lines = 0

    def flush() -> None:
        costs.extend(encoder.conversation_costs([c for c, _ in pending], [w for _, w in pending]))
        pending.clear()

    bar = tqdm(total=path.stat().st_size, unit="B", unit_scale=True, desc="counting", disable=not progress)
    offset = 0
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, 1):
            start, offset = offset, offset + len(raw)
            bar.update(len(raw))
            if not raw.strip():
                continue
            lines += 1
            where = f"{path}:{line_no}"
            convs = encoder.conversations(parse_json_line(raw, where), where)
            for ci, conv in enumerate(convs):
                conv, was_added = _with_system(conv)
                added += was_added
                offsets.append(start)
                index_in_line.append(ci)
                wheres.append(f"{where}#{ci}")
                pending.append((conv, wheres[-1]))
            if len(pending) >= COUNT_CHUNK:
                flush()
    flush()
    bar.close()
    return (np.asarray(costs, dtype=np.int64), np.asarray(offsets, dtype=np.int64),
            np.asarray(index_in_line, dtype=np.int32), wheres, lines, added)


def pack_file(input_path: str | Path, output_path: str | Path, encoder: MegatronSFTPackedEncoder,
              algorithm: str = "best_fit_decreasing", seed: Optional[int] = 0,
              progress: bool = True) -> PackSummary:
    """Pack the conversations of ``input_path`` into rows written to ``output_path``.

    Args:
        input_path: JSONL, one ``{chat_key: [messages]}`` object per line.
        output_path: the ``.jsonl.packed`` file to write (``{chat_key: [messages]}`` per row).
        encoder: the encoder that will read the rows (tokenizer, format, seq_length, CP).
        algorithm: a registered packer (see ``registry.PACKERS``; default ``best_fit_decreasing``).
        seed: rows are written in a shuffled order with this seed (None: packer order, which puts
            the longest conversations first). Conversations inside a row keep their input order.
    """
    packer = PACKERS.get(algorithm)
    src, dst = Path(input_path), Path(output_path)
    costs, offsets, index_in_line, wheres, lines, added = count_costs(src, encoder, progress)
    L = encoder.seq_length
    bins = packer(costs, L) if costs.size else []
    order = list(range(len(bins)))
    if seed is not None:
        random.Random(seed).shuffle(order)
    tmp = dst.with_name(dst.name + ".tmp")
    with open(src, "rb") as f, open(tmp, "w", encoding="utf-8") as out:
        for b in tqdm(order, desc="writing rows", unit="row", disable=not progress):
            messages: list[dict] = []
            for item in sorted(bins[b]):
                f.seek(int(offsets[item]))
                where = wheres[item].rsplit("#", 1)[0]
                conv = encoder.conversations(parse_json_line(f.readline(), where), where)[index_in_line[item]]
                messages.extend(_with_system(conv)[0])
            out.write(json.dumps({encoder.chat_key: messages}, ensure_ascii=False) + "\n")
    tmp.replace(dst)
    return PackSummary(
        input_lines=lines, conversations=int(costs.size), rows=len(bins),
        fill_ratio=fill_ratio(costs, bins, L), tokens=int(np.minimum(costs, L).sum()),
        seq_length=L, algorithm=algorithm, added_system_messages=added,
        oversized=[wheres[i] for i in np.flatnonzero(costs > L).tolist()],
    )
