"""Where each row of a ``.jsonl.packed`` file starts, and the order a training epoch reads rows in.

A shuffled epoch reads rows by byte offset, so the file is indexed once (one streamed pass, no
parsing): memory holds two int64 per row (offset, line number), never the file's bytes.
"""

from __future__ import annotations

import hashlib
import os
from array import array
from pathlib import Path
from typing import BinaryIO

import numpy as np


class RowIndex:
    """Byte offset and line number of every row (non-blank line) of ``path``.

    ``offsets``, ``lines``: int64 [N]; row ``i`` starts at byte ``offsets[i]`` on line
    ``lines[i]`` (lines count from 1). ``stale()`` tells whether the file changed since.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.signature = self._signature()
        offsets, lines = array("q"), array("q")
        position = 0
        with open(self.path, "rb") as f:
            for line_no, raw in enumerate(f, 1):
                if raw.strip():
                    offsets.append(position)
                    lines.append(line_no)
                position += len(raw)
        self.offsets = np.frombuffer(offsets, dtype=np.int64) if offsets else np.zeros(0, np.int64)
        self.lines = np.frombuffer(lines, dtype=np.int64) if lines else np.zeros(0, np.int64)

    def _signature(self) -> tuple[int, int]:
        st = os.stat(self.path)
        return st.st_size, st.st_mtime_ns

    def stale(self) -> bool:
        return self._signature() != self.signature

    def __len__(self) -> int:
        return int(self.offsets.shape[0])

    def read(self, f: BinaryIO, row: int) -> tuple[int, bytes]:
        """(line number, raw line) of row ``row``, read from ``f`` (this file, opened ``rb``)."""
        f.seek(int(self.offsets[row]))
        return int(self.lines[row]), f.readline()


def epoch_seed(seed: int, epoch: int) -> int:
    """A 32-bit seed for ``epoch`` of a run seeded with ``seed`` (any int, negative included)."""
    digest = hashlib.blake2b(f"megatron_sft_packed rows:{seed}:{epoch}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


def epoch_order(num_rows: int, seed: int, epoch: int) -> np.ndarray:
    """The rows of ``epoch`` in reading order: a permutation of ``range(num_rows)``, int64
    [num_rows]. NumPy's legacy ``RandomState`` (what Megatron-LM shuffles with; its stream is frozen
    across NumPy versions), seeded with :func:`epoch_seed`."""
    return np.random.RandomState(epoch_seed(seed, epoch)).permutation(num_rows).astype(np.int64)
