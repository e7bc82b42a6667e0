"""The raw inputs of ``pack-megatron``: file lists from paths and globs, blocks of whole lines, digests.

The conversation order, which defines the packing input, is: the files in the order given (a glob
expands to its matches sorted by name), the lines of each file in order, the conversations of a
line in order. Blocks cut that order into byte ranges of whole lines, so that counting can be
spread over workers and the results put back in order.
"""

from __future__ import annotations

import glob
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from energon_nemotron.errors import ConfigError

#: bytes read per call when hashing a file
HASH_CHUNK = 1 << 22


def expand_inputs(specs: Sequence[str | Path]) -> list[Path]:
    """The input files of ``specs`` (paths or globs), in order.

    A glob (``*``, ``?``, ``[``; unless a file has that very name) expands to its matches sorted
    by name and must match at least one file; a plain path must be a file. A file named twice (also through two globs) is a
    ``ConfigError``: its conversations would be packed twice.
    """
    if isinstance(specs, (str, Path)):
        specs = [specs]
    if not specs:
        raise ConfigError("--input: no input file given")
    out: list[Path] = []
    seen: dict[str, str] = {}
    for spec in specs:
        spec = str(spec)
        if glob.has_magic(spec) and not os.path.isfile(spec):
            matches = sorted(p for p in glob.glob(spec) if os.path.isfile(p))
            if not matches:
                raise ConfigError(f"--input {spec!r} matches no file")
        else:
            if not os.path.isfile(spec):
                what = "is a folder" if os.path.isdir(spec) else "does not exist"
                raise ConfigError(f"--input {spec!r} {what}; give JSONL files or globs of them")
            matches = [spec]
        for m in matches:
            key = os.path.realpath(m)
            if key in seen:
                raise ConfigError(f"--input: {m!r} is named twice (by {seen[key]!r} and {spec!r}); each input "
                                  "file may be given once")
            seen[key] = spec
            out.append(Path(m))
    return out


@dataclass(frozen=True)
class Block:
    """Bytes ``[start, end)`` of input file ``file`` (an index into the input list): whole lines."""

    id: int
    file: int
    path: str
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def line_boundaries(path: Path, block_size: int) -> list[int]:
    """Offsets ``[0, b1, ..., size]`` cutting ``path`` into ranges of about ``block_size`` bytes,
    each cut placed just after a newline (so every range holds whole lines)."""
    size = path.stat().st_size
    cuts = [0]
    with open(path, "rb") as f:
        target = block_size
        while target < size:
            f.seek(target - 1)
            f.readline()                      # to the end of the line holding byte target-1
            cut = f.tell()
            if cut >= size:
                break
            cuts.append(cut)
            target = cut + block_size
    cuts.append(size)
    return cuts


def split_blocks(paths: Sequence[Path], block_size: int | None = None) -> list[Block]:
    """The blocks of ``paths`` in input order (``block_size`` None: one block per file). An empty
    file gives one empty block (so every file has one)."""
    if block_size is not None and block_size < 1:
        raise ConfigError(f"block size must be >= 1 byte, got {block_size}")
    blocks: list[Block] = []
    for fi, path in enumerate(paths):
        cuts = [0, path.stat().st_size] if block_size is None else line_boundaries(path, block_size)
        for start, end in zip(cuts, cuts[1:]):
            blocks.append(Block(len(blocks), fi, str(path), start, end))
    return blocks


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes, streamed."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(HASH_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def describe_input(path: str | Path) -> dict:
    """``{path, size, sha256}`` of one input file (the path as given)."""
    p = Path(path)
    return {"path": str(path), "size": p.stat().st_size, "sha256": file_sha256(p)}
