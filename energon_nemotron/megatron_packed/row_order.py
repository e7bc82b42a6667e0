"""Where each row of a ``.jsonl.packed`` file (or of a manifest's shards) starts, and the order a
training epoch reads rows in.

A shuffled epoch reads rows by byte offset, so the file is indexed once (one streamed pass, no
parsing): memory holds two int64 and one int32 per row (offset, line number, file), never the
file's bytes.
"""

from __future__ import annotations

import hashlib
from array import array
from pathlib import Path
from typing import BinaryIO, Optional, Sequence

import numpy as np

from energon_nemotron._energon.storage import RemotePath, as_data_path, data_signature, open_binary
from energon_nemotron.megatron_packed.manifest import check_digest


class RowIndex:
    """Byte offset, line number and file of every row (non-blank line) of ``paths`` (one file, or
    the shards of a manifest: their rows back to back, in order).

    ``offsets``, ``lines``: int64 [N]; ``files``: int32 [N] (index into ``paths``); row ``i`` starts
    at byte ``offsets[i]`` on line ``lines[i]`` (lines count from 1) of ``paths[files[i]]``.
    ``stale()`` tells whether a file changed since.
    """

    def __init__(self, paths: str | Path | Sequence[str | Path], digests: Optional[Sequence[Optional[str]]] = None,
                 origin: str = "") -> None:
        """``digests``: per path the sha256 a manifest records (None: unchecked), checked in the
        same pass (``manifest.check_digest``; ``origin`` names the manifest)."""
        self.paths = [as_data_path(paths)] if isinstance(paths, (str, Path, RemotePath)) else \
            [as_data_path(p) for p in paths]
        self.path = self.paths[0]
        self.signature = self._signature()
        offsets, lines, files = array("q"), array("q"), array("i")
        for fi, path in enumerate(self.paths):
            position = 0
            expected = digests[fi] if digests else None
            digest = hashlib.sha256() if expected is not None else None
            with open_binary(path) as f:
                for line_no, raw in enumerate(f, 1):
                    if digest is not None:
                        digest.update(raw)
                    if raw.strip():
                        offsets.append(position)
                        lines.append(line_no)
                        files.append(fi)
                    position += len(raw)
            if digest is not None:
                check_digest(path, digest.hexdigest(), expected, origin)
        self.offsets = np.frombuffer(offsets, dtype=np.int64) if offsets else np.zeros(0, np.int64)
        self.lines = np.frombuffer(lines, dtype=np.int64) if lines else np.zeros(0, np.int64)
        self.files = np.frombuffer(files, dtype=np.int32) if files else np.zeros(0, np.int32)

    def _signature(self) -> list[tuple[int, int]]:
        return [data_signature(p) for p in self.paths]

    def stale(self) -> bool:
        return self._signature() != self.signature

    def __len__(self) -> int:
        return int(self.offsets.shape[0])

    def read(self, f: BinaryIO | Sequence[BinaryIO], row: int) -> tuple[int, bytes]:
        """(line number, raw line) of row ``row``, read from ``f`` (the file, or one open file per
        path, opened ``rb``)."""
        handle = f[int(self.files[row])] if isinstance(f, (list, tuple)) else f
        handle.seek(int(self.offsets[row]))
        return int(self.lines[row]), handle.readline()


def epoch_seed(seed: int, epoch: int) -> int:
    """A 32-bit seed for ``epoch`` of a run seeded with ``seed`` (any int, negative included)."""
    digest = hashlib.blake2b(f"megatron_sft_packed rows:{seed}:{epoch}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


def epoch_order(num_rows: int, seed: int, epoch: int) -> np.ndarray:
    """The rows of ``epoch`` in reading order: a permutation of ``range(num_rows)``, int64
    [num_rows]. NumPy's legacy ``RandomState`` (what Megatron-LM shuffles with; its stream is frozen
    across NumPy versions), seeded with :func:`epoch_seed`."""
    return np.random.RandomState(epoch_seed(seed, epoch)).permutation(num_rows).astype(np.int64)
