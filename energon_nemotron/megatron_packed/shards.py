"""Pass 2 of the offline packer: bins → rows in their shuffled order → output files (shards).

Rows are the packer's bins in the order ``random.Random(seed).shuffle`` gives (no seed: packer
order); a row's conversations keep their input order. Without ``rows_per_shard`` every row goes
to the output file itself; with it, rows ``[k·N, (k+1)·N)`` go to shard ``k`` of
``ceil(rows / N)`` (at least one), named ``NAME-0000k-of-0000S.jsonl.packed`` beside the output
(``NAME`` is the output's file name without ``.jsonl.packed``). ``write_shard`` is what every
engine runs to write one file, so their bytes cannot differ.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Optional

import numpy as np

from energon_nemotron.errors import ConfigError, DataError
from energon_nemotron.guards.json_safety import parse_json
from energon_nemotron.megatron_packed.conversation import row_messages, split_conversations
from energon_nemotron.megatron_packed.counting import Counted, with_system
from energon_nemotron.registry import PACKERS

SUFFIX = ".jsonl.packed"


def pack_rows(costs: np.ndarray, seq_length: int, algorithm: str, seed: Optional[int]
              ) -> tuple[list[list[int]], list[int]]:
    """(bins, order): the registered packer's bins of ``costs`` (int64 [C]) into ``seq_length``
    positions, and the order rows are written in (bin indices, shuffled with ``seed``)."""
    try:
        packer = PACKERS.get(algorithm)
    except KeyError as e:
        raise ConfigError(f"--algorithm: {e.args[0]}") from None
    bins = packer(costs, seq_length) if costs.size else []
    order = list(range(len(bins)))
    if seed is not None:
        random.Random(seed).shuffle(order)
    return bins, order


def shard_names(output: Path, num_rows: int, rows_per_shard: Optional[int]) -> list[str]:
    """File names (beside ``output``) of the output files, in row order."""
    if rows_per_shard is None:
        return [output.name]
    if rows_per_shard < 1:
        raise ConfigError(f"--rows-per-shard must be >= 1, got {rows_per_shard}")
    n = max(1, -(-num_rows // rows_per_shard))
    base = output.name[:-len(SUFFIX)] if output.name.endswith(SUFFIX) and output.name != SUFFIX else output.name
    width = max(5, len(str(n)))
    return [f"{base}-{k:0{width}d}-of-{n:0{width}d}{SUFFIX}" for k in range(n)]


@dataclass
class WriteJob:
    """One output file to write: per item (a conversation, rows' items back to back) its input
    file, line offset and index in the line; ``row_lengths`` items per row."""

    shard: int
    dst: str
    files: np.ndarray          # int32 [k]
    offsets: np.ndarray        # int64 [k]
    index_in_line: np.ndarray  # int32 [k]
    row_lengths: np.ndarray    # int32 [rows]


def shard_jobs(folder: Path, names: list[str], bins: list[list[int]], order: list[int],
               rows_per_shard: Optional[int], counted: Counted, wanted: Optional[set[int]] = None) -> list[WriteJob]:
    """The ``WriteJob`` of every shard (only those in ``wanted`` when given); ``counted`` locates
    each conversation (its input file, line offset and index in the line)."""
    per = rows_per_shard or max(len(order), 1)
    jobs = []
    for k, name in enumerate(names):
        if wanted is not None and k not in wanted:
            continue
        rows = [sorted(bins[b]) for b in order[k * per:(k + 1) * per]]
        items = np.fromiter((i for r in rows for i in r), dtype=np.int64, count=sum(len(r) for r in rows))
        jobs.append(WriteJob(k, str(folder / name), counted.files[items], counted.offsets[items],
                             counted.index_in_line[items], np.asarray([len(r) for r in rows], dtype=np.int32)))
    return jobs


def shard_rows(num_rows: int, num_shards: int, rows_per_shard: Optional[int]) -> list[int]:
    """Rows in each shard."""
    per = rows_per_shard or max(num_rows, 1)
    return [max(0, min(per, num_rows - k * per)) for k in range(num_shards)]


def _conversation(f: BinaryIO, path: str, offset: int, ci: int, chat_key: str) -> list[dict]:
    f.seek(offset)
    where = f"{path} (line at byte {offset})"
    try:
        convs = split_conversations(row_messages(parse_json(f.readline(), where), chat_key, where))
    except DataError as e:
        raise ConfigError(f"{e}: the input changed since its conversations were counted") from None
    if ci >= len(convs):
        raise ConfigError(f"{where}: has {len(convs)} conversations, not {ci + 1}: the input changed since "
                          "its conversations were counted")
    return with_system(convs[ci])[0]


def write_shard(paths: list[str], chat_key: str, job: WriteJob) -> dict:
    """Write ``job``'s rows to ``job.dst`` (through ``dst.tmp``, renamed when complete); returns
    ``{shard, rows, bytes, sha256}`` of the file. Each row is ``{chat_key: [messages]}``, JSON
    with ``ensure_ascii=False``, one per line."""
    handles: dict[int, BinaryIO] = {}
    digest = hashlib.sha256()
    size = 0
    tmp = job.dst + ".tmp"
    try:
        with open(tmp, "wb") as out:
            item = 0
            for n in job.row_lengths.tolist():
                messages: list[dict] = []
                for j in range(item, item + n):
                    fi = int(job.files[j])
                    if fi not in handles:
                        handles[fi] = open(paths[fi], "rb")
                    messages.extend(_conversation(handles[fi], paths[fi], int(job.offsets[j]),
                                                  int(job.index_in_line[j]), chat_key))
                item += n
                data = (json.dumps({chat_key: messages}, ensure_ascii=False) + "\n").encode("utf-8")
                out.write(data)
                digest.update(data)
                size += len(data)
        os.replace(tmp, job.dst)
    finally:
        for h in handles.values():
            h.close()
    return {"shard": job.shard, "rows": int(job.row_lengths.shape[0]), "bytes": size, "sha256": digest.hexdigest()}


def file_rows_sha256(path: Path) -> tuple[int, int, str]:
    """(rows, bytes, sha256) of a written output file (rows: newline-terminated lines)."""
    digest = hashlib.sha256()
    rows = size = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
            rows += chunk.count(b"\n")
            size += len(chunk)
    return rows, size, digest.hexdigest()
