"""Pass 1 of the offline packer: each conversation's cost, per block of whole input lines.

A block is counted on its own (by the single-process engine in order, by Ray actors in any order):
``count_block`` returns, per conversation that can be encoded, its cost (tokens rounded up to
2·CP, counted by the very encoder that will read the rows), the byte offset of its line and its
index in the line. Errors and oversized conversations are located by the block's own line numbers
(a block does not know where in its file it starts); ``CountMerger`` puts the blocks back in input
order, turns those into ``file:line#conversation`` and raises or counts the errors.
"""

from __future__ import annotations

from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterator, Optional

import numpy as np

from energon_nemotron.errors import ConfigError, DataError
from energon_nemotron.guards.json_safety import parse_json
from energon_nemotron.megatron_packed.encoder import MegatronSFTPackedEncoder
from energon_nemotron.megatron_packed.inputs import Block

#: conversations tokenized per native tokenizer call while counting
COUNT_CHUNK = 512
#: errors kept per block (and in the summary) as examples; all are counted by reason
EXAMPLES = 20


def with_system(conversation: list[dict]) -> tuple[list[dict], bool]:
    """The conversation, starting with an (empty, added) ``system`` message if it had none; and
    whether one was added. In a packed row the system message is what separates conversations."""
    if conversation[0]["role"] == "system":
        return conversation, False
    return [{"role": "system", "content": ""}] + conversation, True


@dataclass
class BlockCount:
    """The count of one block. Lines are the block's own (1 = its first line)."""

    block: int
    costs: np.ndarray                       # int64 [n] per kept conversation
    offsets: np.ndarray                     # int64 [n] byte offset of its line in the file
    index_in_line: np.ndarray               # int32 [n]
    lines: int = 0                          # physical lines in the block (blank ones included)
    rows: int = 0                           # non-blank lines
    added_system: int = 0
    skipped: dict = field(default_factory=dict)        # reason code -> conversations or lines dropped
    errors: list = field(default_factory=list)         # (line, conversation or -1, code, reason), first ones
    oversized: list = field(default_factory=list)      # (line, conversation)
    stopped: bool = False                   # on_error raise: counting stopped at errors[0]


def _line_conversations(encoder: MegatronSFTPackedEncoder, raw: bytes) -> list[list[dict]]:
    return encoder.conversations(parse_json(raw, None), None)


class _BlockCounter:
    """The count of one block under way: lines are added in order; their conversations wait in
    ``pending`` until ``flush`` tokenizes them (one native tokenizer call)."""

    def __init__(self, block: Block, encoder: MegatronSFTPackedEncoder, on_error: str) -> None:
        self.encoder = encoder
        self.on_error = on_error
        self.out = BlockCount(block.id, np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int32))
        self.costs, self.offsets, self.index_in_line = array("q"), array("q"), array("i")
        self.skipped: Counter = Counter()
        self.pending: list[tuple[list[dict], int, int, int, bool]] = []  # conversation, line, index, offset, added

    def error(self, line: int, ci: int, e: DataError) -> None:
        self.skipped[e.code] += 1
        if len(self.out.errors) < EXAMPLES:
            self.out.errors.append((line, ci, e.code, e.reason))
        if self.on_error == "raise":
            self.out.stopped = True

    def line(self, raw: bytes, start: int) -> None:
        """A non-blank line (the block's ``out.lines``-th) starting at byte ``start`` of the file."""
        out = self.out
        out.rows += 1
        try:
            convs = _line_conversations(self.encoder, raw)
        except DataError as e:
            if self.on_error == "raise":
                self.flush()                # an earlier conversation's error comes first
                if out.stopped:
                    return
            self.error(out.lines, -1, e)
            return
        for ci, conv in enumerate(convs):
            conv, added = with_system(conv)
            self.pending.append((conv, out.lines, ci, start, added))

    def flush(self) -> None:
        """Tokenize the pending conversations: each one's cost is kept, or its error counted."""
        out = self.out
        if not self.pending or out.stopped:
            return
        pending = self.pending
        results = self.encoder.conversation_costs_or_errors([p[0] for p in pending], [None] * len(pending))
        for (_, line, ci, offset, added), cost in zip(pending, results):
            if isinstance(cost, DataError):
                self.error(line, ci, cost)
                if out.stopped:
                    break
                continue
            self.costs.append(cost)
            self.offsets.append(offset)
            self.index_in_line.append(ci)
            out.added_system += added
            if cost > self.encoder.seq_length:
                out.oversized.append((line, ci))
        pending.clear()

    def result(self) -> BlockCount:
        self.flush()
        out = self.out
        if self.costs:
            out.costs = np.frombuffer(self.costs, dtype=np.int64).copy()
            out.offsets = np.frombuffer(self.offsets, dtype=np.int64).copy()
            out.index_in_line = np.frombuffer(self.index_in_line, dtype=np.int32).copy()
        out.skipped = dict(self.skipped)
        return out


def count_block(block: Block, encoder: MegatronSFTPackedEncoder, on_error: str = "raise",
                chunk: int = COUNT_CHUNK) -> BlockCount:
    """Count the conversations of ``block`` (see the module docstring). ``on_error``: ``raise``
    stops at the first error (recorded in ``errors``, ``stopped`` set); ``skip`` drops the line
    (unreadable or invalid messages) or the conversation (cannot be tokenized) and counts it by
    ``DataError.code``. Conversations are tokenized ``chunk`` at a time."""
    counter = _BlockCounter(block, encoder, on_error)
    out = counter.out
    with open(block.path, "rb") as f:
        f.seek(block.start)
        position = block.start
        while position < block.end and not out.stopped:
            raw = f.readline()
            if not raw:
                break
            start, position = position, position + len(raw)
            out.lines += 1
            if raw.strip():
                counter.line(raw, start)
                if len(counter.pending) >= chunk:
                    counter.flush()
    return counter.result()


@dataclass
class Counted:
    """Every block's count in input order: what packing and writing need, and the summary's counts."""

    costs: np.ndarray                       # int64 [C]
    files: np.ndarray                       # int32 [C] input file index
    offsets: np.ndarray                     # int64 [C]
    index_in_line: np.ndarray               # int32 [C]
    input_lines: int = 0
    added_system: int = 0
    skipped: dict = field(default_factory=dict)
    skipped_examples: list = field(default_factory=list)    # "file:line[#k]: reason (code)"
    oversized: list = field(default_factory=list)           # "file:line#k"


class CountMerger:
    """Collects ``BlockCount``s in any order and yields the input-order result.

    ``add`` raises the first error in input order (``on_error: raise``) as soon as every block
    before it is in, as a ``DataError`` naming ``file:line[#conversation]``.
    """

    def __init__(self, blocks: list[Block], on_error: str = "raise") -> None:
        if on_error not in ("raise", "skip"):
            raise ConfigError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.blocks = blocks
        self.on_error = on_error
        self.counts: dict[int, BlockCount] = {}
        self._next = 0                      # blocks [0, _next) are in and located
        self._first_line: dict[int, int] = {}
        self._file_line: dict[int, int] = {}   # file -> lines of its located blocks so far

    def where(self, block: int, line: int, ci: int) -> str:
        """``file:line`` (``#ci`` for a conversation) of a block's own line ``line``."""
        b = self.blocks[block]
        text = f"{b.path}:{self._first_line[block] + line - 1}"
        return text if ci < 0 else f"{text}#{ci}"

    def add(self, count: BlockCount) -> None:
        self.counts[count.block] = count
        while self._next in self.counts:
            b = self.blocks[self._next]
            c = self.counts[self._next]
            self._first_line[b.id] = self._file_line.get(b.file, 0) + 1
            self._file_line[b.file] = self._file_line.get(b.file, 0) + c.lines
            if self.on_error == "raise" and c.errors:
                line, ci, code, reason = c.errors[0]
                raise DataError(self.where(b.id, line, ci), reason, code)
            self._next += 1

    def done(self) -> bool:
        return self._next == len(self.blocks)

    def result(self) -> Counted:
        """The merged counts (every block must have been added)."""
        if not self.done():
            raise RuntimeError(f"{len(self.blocks) - self._next} blocks were not counted")
        parts = [self.counts[b.id] for b in self.blocks]

        def cat(name: str, dtype) -> np.ndarray:
            arrays = [getattr(c, name) for c in parts]
            return np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype)

        files = np.concatenate([np.full(c.costs.shape[0], self.blocks[c.block].file, np.int32) for c in parts]) \
            if parts else np.zeros(0, np.int32)
        skipped: Counter = Counter()
        examples: list[str] = []
        oversized: list[str] = []
        for c in parts:
            skipped.update(c.skipped)
            for line, ci, code, reason in c.errors:
                if len(examples) < EXAMPLES:
                    examples.append(f"{self.where(c.block, line, ci)}: {reason} ({code})")
            oversized += [self.where(c.block, line, ci) for line, ci in c.oversized]
        return Counted(costs=cat("costs", np.int64), files=files, offsets=cat("offsets", np.int64),
                       index_in_line=cat("index_in_line", np.int32), input_lines=sum(c.rows for c in parts),
                       added_system=sum(c.added_system for c in parts), skipped=dict(sorted(skipped.items())),
                       skipped_examples=examples, oversized=oversized)


def count_local(blocks: list[Block], encoder: MegatronSFTPackedEncoder, on_error: str = "raise",
                progress: Optional[object] = None) -> Counted:
    """Count every block in this process, in order (the single-process engine). ``progress``: a
    tqdm bar advanced by each block's bytes."""
    merger = CountMerger(blocks, on_error)
    for count in _counts(blocks, encoder, on_error):
        merger.add(count)
        if progress is not None:
            progress.update(blocks[count.block].size)
    return merger.result()


def _counts(blocks: list[Block], encoder: MegatronSFTPackedEncoder, on_error: str) -> Iterator[BlockCount]:
    for block in blocks:
        yield count_block(block, encoder, on_error)
