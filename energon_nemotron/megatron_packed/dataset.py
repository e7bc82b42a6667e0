"""Streaming a ``.jsonl.packed`` file of Megatron-LM offline-packed rows, sharded over DP ranks.

The file is read line by line (constant memory in the file size); only this rank's rows are parsed
and encoded. A row is a non-blank line; rows are numbered from 0, lines from 1. An epoch reads the
rows in an order ``o`` (file order; with ``shuffle_seed``, a permutation of all rows seeded with
``(shuffle_seed, epoch)``, read by byte offset through a ``RowIndex``): DP rank ``r`` of ``d`` gets
rows ``o[r], o[r+d], o[r+2d], ...``, so every row is read by exactly one rank; inside a
``DataLoader`` with workers, worker ``w`` of ``W`` takes every W-th of those, so the loader's
round-robin keeps the order.

Validation mode pads every rank to ``ceil(N/d)`` rows: a rank short of a row repeats row
``(r + k*d) mod N`` with an all-zero loss mask and ``is_padding=True``, so all ranks yield the same
number of batches and each real row is counted exactly once across ranks.
"""

from __future__ import annotations

import hashlib
import math
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import torch

from energon_nemotron._energon.storage import as_data_path, open_binary
from energon_nemotron.errors import ConfigError, DataError
from energon_nemotron.guards.policy import skip_counter as skip_counter
from energon_nemotron.guards.json_safety import parse_json
from energon_nemotron.megatron_packed import manifest as mf
from energon_nemotron.megatron_packed.encoder import MegatronSFTPackedEncoder
from energon_nemotron.megatron_packed.row_order import RowIndex, epoch_order
from energon_nemotron.guards.skip_limits import record_pass, record_skip


#: bytes per ranged GET when rows on object storage are read by offset (shuffled): about a row
ROW_CHUNK = 1 << 20


class TruncationWarning(UserWarning):
    """Rows longer than ``seq_length`` after re-tokenization were truncated (as Megatron-LM does)."""


class PadInContentWarning(UserWarning):
    """The pad id occurs inside real tokens, so those labels are masked out of the loss."""


def _line_list(lines: list[int], limit: int = 20) -> str:
    shown = ", ".join(str(x) for x in lines[:limit])
    return shown + (f", ... ({len(lines) - limit} more)" if len(lines) > limit else "")


def iter_rows(paths: list[Path], digests: Optional[Sequence[Optional[str]]] = None,
              origin: str = "") -> Iterator[tuple[int, int, int, bytes]]:
    """(row index, file index, line number, raw line) of every non-blank line of ``paths`` (their
    rows back to back), streamed. ``digests``: per path the sha256 its manifest records (None:
    unchecked); a file whose bytes differ is a ``ConfigError`` (``origin``: the manifest) when
    its end is reached."""
    row = 0
    for fi, path in enumerate(paths):
        expected = digests[fi] if digests else None
        digest = hashlib.sha256() if expected is not None else None
        with open_binary(path) as f:
            for line_no, raw in enumerate(f, 1):
                if digest is not None:
                    digest.update(raw)
                if raw.strip():
                    yield row, fi, line_no, raw
                    row += 1
        if digest is not None:
            mf.check_digest(path, digest.hexdigest(), expected, origin)


def source_files(path: Path, encoder: MegatronSFTPackedEncoder) -> tuple[list[Path], Optional[Path]]:
    """The files of a rows source and its manifest: ``path`` itself (with ``path.manifest.json`` if
    there is one), or the shards of the manifest ``path`` is. A manifest's encoder must match
    ``encoder`` (``ConfigError`` listing every differing key)."""
    files, where, _ = source_and_digests(path, encoder)
    return files, where


def source_and_digests(path: Path, encoder: MegatronSFTPackedEncoder) -> tuple[list[Path], Optional[Path], list]:
    """:func:`source_files` and, per file, the sha256 its manifest records (None where none is)."""
    digests: list = []
    if mf.is_manifest(path):
        files, manifest = mf.manifest_shards(path)
        digests = [entry.get("sha256") for entry in manifest["shards"]]
        where: Optional[Path] = path
    else:
        if not path.is_file():
            hint = ""
            if mf.manifest_path(path).is_file():
                hint = f"; it was packed into shards: read its manifest {mf.manifest_path(path).name}"
            raise ConfigError(f"{str(path)!r} is not a file{hint}")
        files, where = [path], mf.manifest_path(path)
        if not where.is_file():
            return files, None, [None]
        manifest = mf.load_manifest(where)
        digests = [None]
    mf.check_encoder(manifest, encoder.signature(), str(where))
    return files, where, digests


def recorded_oversized(manifest: Optional[Path], seq_length: int) -> list:
    """The conversations longer than ``seq_length`` that ``manifest`` records (``pack-megatron``
    reported each, in a row of its own), said once as a ``TruncationWarning``: reading truncates
    them, as Megatron-LM does. [] without a manifest."""
    if manifest is None:
        return []
    oversized = list(mf.load_manifest(manifest).get("counts", {}).get("oversized") or [])
    if oversized:
        warnings.warn(TruncationWarning(
            f"{manifest.name}: {len(oversized)} conversations are longer than seq_length={seq_length} "
            f"(pack-megatron reported them: {_line_list(oversized)}); each fills a row of its own and is truncated "
            f"to {seq_length} when read, as Megatron-LM does"), stacklevel=3)
    return oversized


class MegatronSFTPackedDataset(torch.utils.data.IterableDataset):
    """Encoded rows of one ``.jsonl.packed`` file (or of the shards of a ``pack-megatron``
    manifest, read in order as one stream) for one data-parallel rank.

    Args:
        path: the offline-packed JSONL file, or an ``OUT.manifest.json``. A manifest (given, or
            beside the file) must record the configured encoder (tokenizer files, prompt format,
            seq_length, CP size, pad token, chat key, identity masking), else ``ConfigError``
            listing every differing key.
        encoder: a :class:`MegatronSFTPackedEncoder`.
        dp_rank, dp_size: this rank and the data-parallel world size.
        validation: pad ranks to equal length (see the module docstring).
        on_error: ``raise`` (a ``DataError`` naming file and line) or ``skip`` (the row is dropped and
            counted by reason in ``skips``, a ``skip_counter`` shared with the workers; its skip
            limits stop a run that only skips, see ``energon_nemotron.guards.skip_limits``).
        shuffle_seed: None (file order) or the seed of a full per-epoch permutation of the rows
            (training only; validation always reads in file order). ``epoch`` (attribute, default
            0) selects the permutation; one iteration reads one epoch.

    Yields ``encoder.encode`` dicts with ``is_padding`` and ``position`` (worker id, items of the
    worker's stream consumed) added; batch them with ``collate_rows``. Setting
    ``resume_positions`` (``{worker id: items}``, from ``PackedBatch.__restore_key__``) before
    iterating resumes each worker exactly there. After each pass, truncated rows and rows
    containing the pad id are reported as warnings with their line numbers
    (``TruncationWarning``, ``PadInContentWarning``); ``last_report`` holds them and the skips.
    """

    def __init__(self, path: str | Path, encoder: MegatronSFTPackedEncoder, dp_rank: int = 0,
                 dp_size: int = 1, validation: bool = False, on_error: str = "raise",
                 skips: Optional[Any] = None, shuffle_seed: Optional[int] = None) -> None:
        super().__init__()
        if dp_size < 1 or not 0 <= dp_rank < dp_size:
            raise ConfigError(f"invalid dp_rank={dp_rank} / dp_size={dp_size}")
        self.path = as_data_path(path)
        self.encoder = encoder
        self.files, self.manifest_path, self.digests = source_and_digests(self.path, encoder)
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.validation = validation
        if on_error not in ("raise", "skip"):
            raise ConfigError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.on_error = on_error
        self.skips = skips or skip_counter()
        if validation and shuffle_seed is not None:
            raise ConfigError("validation rows are read in file order; shuffle_seed applies to training only")
        self.shuffle_seed = shuffle_seed
        self.epoch = 0
        self._index: Optional[RowIndex] = None
        self._order: tuple = ()
        self.resume_positions: dict[int, int] = {}
        #: after a restore, DataLoader worker w plays stream w + worker_offset, so that the stream
        #: due next comes first (the DataLoader's round-robin always starts at worker 0)
        self.worker_offset = 0
        self._num_rows: Optional[int] = None
        self.last_report: dict[str, Any] = {}
        #: a whole pass has checked the files against the manifest's sha256 (later passes skip it)
        self._verified = False
        #: the conversations longer than seq_length the manifest records (``file:line#k``), said once here
        self.oversized = recorded_oversized(self.manifest_path, encoder.seq_length)

    def _stream(self) -> Iterator[tuple[int, int, int, bytes]]:
        """:func:`iter_rows` over the files; the manifest's sha256 are checked until one whole pass
        has (the first, at start: ``num_rows`` or ``row_index``), not on every epoch's read."""
        yield from iter_rows(self.files, None if self._verified else self.digests, str(self.manifest_path))
        self._verified = True

    def num_rows(self) -> int:
        """Rows (non-blank lines) in the file(s); one streamed pass, cached."""
        if self._index is not None:
            return len(self.row_index())
        if self._num_rows is None:
            self._num_rows = sum(1 for _ in self._stream())
        return self._num_rows

    def row_index(self) -> RowIndex:
        """The rows' byte offsets (one streamed pass; cached, rebuilt if the file changed). Built
        before the workers start, they inherit it."""
        if self._index is None or self._index.stale():
            self._index = RowIndex(self.files, self.digests, str(self.manifest_path))   # a (re)built index re-checks
            self._num_rows, self._verified = len(self._index), True
        return self._index

    def _epoch_order(self, n: int):
        """This epoch's reading order of the ``n`` rows (int64 [n]), cached per (seed, epoch)."""
        key = (n, self.shuffle_seed, self.epoch)
        if self._order[:3] != key:
            self._order = (*key, epoch_order(n, self.shuffle_seed, self.epoch))
        return self._order[3]

    def __len__(self) -> int:
        n = self.num_rows()
        if self.validation:
            return math.ceil(n / self.dp_size)
        return len(range(self.dp_rank, n, self.dp_size))

    def _mine(self) -> tuple[int, int, int]:
        """(worker id, first, step) of this rank's and worker's rows among all rows."""
        info = torch.utils.data.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        wid = (wid + self.worker_offset) % nw
        return wid, self.dp_rank + wid * self.dp_size, self.dp_size * nw

    def _label(self, fi: int, line_no: int) -> int | str:
        """How reports name a row: its line (one file), or ``shard-file:line`` (a manifest's shards)."""
        return line_no if len(self.files) == 1 else f"{self.files[fi].name}:{line_no}"

    def _encode(self, raw: bytes, fi: int, line_no: int) -> dict[str, Any]:
        where = f"{self.files[fi]}:{line_no}"
        try:
            return self.encoder.encode(parse_json(raw, where), where)
        except DataError as e:
            raise e.located(where) from None

    def _items(self, first: int, step: int, start: int) -> Iterator[tuple[int, int, int, bytes, bool]]:
        """(position, file index, line number, raw line, is padding) of this worker's rows, then
        its padding rows, after its first ``start`` items; position counts items from 1."""
        if self.shuffle_seed is not None:
            yield from self._shuffled_items(first, step, start)
            return
        for position, (fi, line_no, raw, padding) in enumerate(self._file_order_items(first, step), 1):
            if position > start:
                yield position, fi, line_no, raw, padding

    def _file_order_items(self, first: int, step: int) -> Iterator[tuple[int, int, bytes, bool]]:
        """(file index, line number, raw line, is padding) of this worker's rows in file order,
        streamed, then its padding rows."""
        for row, fi, line_no, raw in self._stream():
            if row >= first and (row - first) % step == 0:
                yield fi, line_no, raw, False
        if self.validation:
            for fi, line_no, raw in self._padding_rows(first, step):
                yield fi, line_no, raw, True

    def _shuffled_items(self, first: int, step: int, start: int) -> Iterator[tuple[int, int, int, bytes, bool]]:
        """``_items`` in this epoch's order: rows ``order[first + k*step]``, read by offset."""
        index = self.row_index()
        order = self._epoch_order(len(index))
        handles = [open_binary(p, ROW_CHUNK) for p in self.files]
        try:
            for position, k in enumerate(range(first + start * step, len(index), step), start + 1):
                row = int(order[k])
                line_no, raw = index.read(handles, row)
                yield position, int(index.files[row]), line_no, raw, False
        finally:
            for h in handles:
                h.close()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        wid, first, step = self._mine()
        truncated: list[int] = []
        oversized: list[int] = []
        with_pad: list[int] = []
        skipped: Counter = Counter()
        rows = 0
        start = self.resume_positions.get(wid, 0)
        for position, fi, line_no, raw, padding in self._items(first, step, start):
            try:
                out = self._encode(raw, fi, line_no)
            except DataError as e:
                if self.on_error == "raise":
                    raise
                skipped[e.code] += 1
                record_skip(self.skips, e.code, str(e))
                continue
            record_pass(self.skips)
            if padding:
                out["loss_mask"] = torch.zeros_like(out["loss_mask"])
            else:
                rows += 1
                if out["truncated"]:        # one conversation alone over L, or several that no longer fit
                    (oversized if out["num_conversations"] == 1 else truncated).append(self._label(fi, line_no))
                if out["pad_in_content"]:
                    with_pad.append(self._label(fi, line_no))
            out["is_padding"] = padding
            out["position"] = (wid, position)
            out["skipped"] = self._unreported_skips()          # the rows skipped since this worker's last row
            yield out
        self._report(rows, truncated, oversized, with_pad, dict(skipped))

    def _unreported_skips(self) -> dict[str, int]:
        """This process's skips not yet carried by a row (``telemetry.SharedCounter``; none from a
        counter that does not report, e.g. the stats reader's)."""
        take = getattr(self.skips, "take_unreported", None)
        return take() if take is not None else {}

    def _padding_rows(self, first: int, step: int) -> Iterator[tuple[int, int, bytes]]:
        """This worker's share of the rank's padding rows (real row index >= N): (file, line, raw)."""
        n = self.num_rows()
        per_rank = math.ceil(n / self.dp_size)
        wanted = {}
        for k in range(per_rank):
            idx = self.dp_rank + k * self.dp_size
            if idx >= n and idx >= first and (idx - first) % step == 0:
                wanted[idx % n] = wanted.get(idx % n, 0) + 1
        if not wanted:
            return
        for row, fi, line_no, raw in self._stream():
            for _ in range(wanted.get(row, 0)):
                yield fi, line_no, raw

    def _report(self, rows: int, truncated: list, oversized: list, with_pad: list, skipped: dict) -> None:
        """This worker's pass: ``last_report``, and a warning for each cause of truncation that was
        not already said (a manifest's oversized conversations are said once, when it is opened)."""
        self.last_report = {"rows": rows, "truncated_lines": truncated + oversized, "pad_in_content_lines": with_pad,
                            "skipped": skipped}
        L = self.encoder.seq_length
        if oversized and len(oversized) > len(self.oversized):
            warnings.warn(TruncationWarning(
                f"{self.path}: {len(oversized)} of {rows} rows hold one conversation longer than seq_length={L}; "
                f"each was truncated to {L} as Megatron-LM does (lines {_line_list(oversized)})"), stacklevel=2)
        if truncated:
            hint = "" if self.manifest_path is None else f" although {self.manifest_path.name} records the same encoder"
            warnings.warn(TruncationWarning(
                f"{self.path}: {len(truncated)} of {rows} rows of several conversations no longer fit seq_length={L} "
                f"after re-tokenization{hint}, and were truncated as Megatron-LM does (lines {_line_list(truncated)}): "
                "the tokenizer files, prompt format, seq_length and context-parallel size must be those the rows "
                "were packed with"), stacklevel=2)
        if with_pad:
            warnings.warn(PadInContentWarning(
                f"{self.path}: {len(with_pad)} rows contain the pad id {self.encoder.pad_id} inside "
                f"their content; those labels are masked out of the loss (lines {_line_list(with_pad)})"),
                stacklevel=2)
