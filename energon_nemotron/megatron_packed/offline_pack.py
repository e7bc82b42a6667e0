"""Offline packer: raw ``{"messages": [...]}`` conversations → Megatron-LM offline-packed rows.

Each input line is split into conversations at ``system`` messages (a conversation that does not
start with one gets an empty system message, because in a packed row the system message is what
separates conversations). Pass 1 counts each conversation's cost with the very encoder that will
read the rows (its tokens, rounded up to a multiple of 2·CP; ``counting``); the driver bin-packs
all costs with a registered packer into rows of ``seq_length`` positions, so re-encoding a row never
truncates, and shuffles the rows with the seed; pass 2 writes them, to one file or to shards
(``shards``). A conversation longer than ``seq_length`` gets a row of its own (the loader will
truncate it and say so); the summary lists them. Memory holds one cost, file, offset and index per
conversation (24 bytes), plus the packer's bins.

Two engines run the passes: ``LocalEngine`` (this process) and ``ray_engine.RayEngine`` (Ray Data
actors count, Ray tasks write); for the same inputs and options both write the same bytes. A
manifest beside the output (``manifest``) records options, inputs, counts and shards, so that a
rerun resumes: shards that are complete are kept, the rest written.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np
from tqdm import tqdm

from energon_nemotron.errors import ConfigError
from energon_nemotron.megatron_packed import manifest as mf
from energon_nemotron.megatron_packed.counting import Counted, count_local
from energon_nemotron.megatron_packed.encoder import MegatronSFTPackedEncoder
from energon_nemotron.megatron_packed.inputs import describe_input, expand_inputs, split_blocks
from energon_nemotron.megatron_packed.output_lock import output_lock
from energon_nemotron.megatron_packed.shards import (
    pack_rows,
    shard_jobs,
    shard_names,
    shard_rows,
    write_shard,
)
from energon_nemotron.packing.algorithms import fill_ratio

@dataclass
class PackSummary:
    """What a pack did."""

    input_lines: int = 0
    conversations: int = 0
    rows: int = 0
    fill_ratio: float = 0.0
    tokens: int = 0
    seq_length: int = 0
    algorithm: str = ""
    added_system_messages: int = 0
    oversized: list[str] = field(default_factory=list)   # "file:line#conversation" of each
    skipped: dict[str, int] = field(default_factory=dict)   # reason code -> lines or conversations dropped
    skipped_examples: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    shards: list[str] = field(default_factory=list)      # the output files, beside the manifest
    manifest: str = ""
    engine: str = "local"
    shards_skipped: int = 0                              # already complete (resumed run)
    notes: list[str] = field(default_factory=list)
    times: dict[str, float] = field(default_factory=dict)   # seconds per stage: hash, count, pack, write

    def as_dict(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        def shown(items: list[str]) -> list[str]:
            out = [f"  {k}" for k in items[:20]]
            return out + ([f"  ... {len(items) - 20} more"] if len(items) > 20 else [])

        skipped = sum(self.skipped.values())
        lines = [
            f"input lines        {self.input_lines}  ({len(self.inputs)} file{'s' if len(self.inputs) != 1 else ''})",
            f"conversations      {self.conversations}",
            f"rows               {self.rows}  (seq_length {self.seq_length}, {self.algorithm})",
            f"fill ratio         {self.fill_ratio:.4%}  ({self.tokens} token positions used)",
            f"empty system added {self.added_system_messages}",
            f"oversized          {len(self.oversized)}  (each in a row of its own; truncated when read)",
            *shown(self.oversized),
            f"skipped            {skipped}" + (" (" + ", ".join(f"{k} {n}" for k, n in self.skipped.items()) + ")"
                                               if skipped else ""),
            *shown(self.skipped_examples),
            f"output files       {len(self.shards)}  ({len(self.shards) - self.shards_skipped} written, "
            f"{self.shards_skipped} complete already); manifest {self.manifest}",
            f"engine             {self.engine}; " + ", ".join(f"{k} {v:.2f} s" for k, v in self.times.items()),
        ]
        return "\n".join(lines + self.notes)


class LocalEngine:
    """Both passes in this process, in order (the single-process engine)."""

    name = "local"

    def __enter__(self) -> "LocalEngine":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def block_size(self, total_bytes: int) -> Optional[int]:
        return None                                     # one block per file

    def count(self, blocks, encoder: MegatronSFTPackedEncoder, on_error: str, bar) -> Counted:
        return count_local(blocks, encoder, on_error, bar)

    def write(self, paths: list[str], chat_key: str, jobs, on_done: Callable[[dict], None]) -> None:
        for job in jobs:
            on_done(write_shard(paths, chat_key, job))


def describe_inputs(paths: Sequence[Path]) -> list[dict]:
    """``{path, size, sha256}`` of every input (hashed in a few threads: hashlib releases the GIL)."""
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(paths)))) as pool:
        return list(pool.map(describe_input, paths))


def _counts_section(counted: Counted, bins: list, seq_length: int) -> dict:
    return {"input_lines": counted.input_lines, "conversations": int(counted.costs.size), "rows": len(bins),
            "tokens": int(np.minimum(counted.costs, seq_length).sum()),
            "fill_ratio": fill_ratio(counted.costs, bins, seq_length),
            "added_system_messages": counted.added_system, "skipped": counted.skipped,
            "skipped_examples": counted.skipped_examples, "oversized": counted.oversized}


def _summary(manifest: dict, manifest_file: Path, engine: str, skipped: int, notes: list[str],
             times: dict[str, float]) -> PackSummary:
    c = manifest["counts"]
    return PackSummary(
        input_lines=c["input_lines"], conversations=c["conversations"], rows=c["rows"], fill_ratio=c["fill_ratio"],
        tokens=c["tokens"], seq_length=manifest["encoder"]["seq_length"], algorithm=manifest["packing"]["algorithm"],
        added_system_messages=c["added_system_messages"], oversized=c["oversized"], skipped=c["skipped"],
        skipped_examples=c["skipped_examples"], inputs=[i["path"] for i in manifest["inputs"]],
        shards=[s["file"] for s in manifest["shards"]], manifest=str(manifest_file), engine=engine,
        shards_skipped=skipped, notes=notes, times={k: round(v, 3) for k, v in times.items()})


def _previous(path: Path, options: dict, notes: list[str]) -> tuple[Optional[dict], Optional[dict]]:
    """(the manifest on disk if this run resumes it, the one it replaces otherwise)."""
    if not path.exists():
        return None, None
    try:
        old = mf.load_manifest(path)
    except ConfigError as e:
        notes.append(f"note: {e}; rewriting everything")
        return None, None
    diff = mf.options_diff(old, options)
    if diff:
        notes.append(f"note: {path.name} was written with other options or inputs; rewriting everything:\n"
                     + "\n".join(f"  {d}" for d in diff))
        return None, old
    return old, None


def _remove_stale(folder: Path, stale: Optional[dict], keep: set[str], output: Path) -> None:
    """Delete the files of a replaced manifest that this run does not write again."""
    if stale is None:
        return
    for entry in stale.get("shards", []):
        if entry["file"] not in keep:
            (folder / entry["file"]).unlink(missing_ok=True)
    mf.counts_path(output).unlink(missing_ok=True)


@dataclass
class PackOptions:
    """How :func:`pack` packs and writes (besides the encoder and the engine).

    Args:
        algorithm: a registered packer (see ``registry.PACKERS``; default ``best_fit_decreasing``).
        seed: rows are written in a shuffled order with this seed (None: packer order, which puts
            the longest conversations first). Conversations inside a row keep their input order.
        rows_per_shard: None (one output file) or N: shards of N rows beside the output.
        on_error: ``raise`` (the first bad line or conversation in input order, a ``DataError``
            naming ``file:line[#k]``) or ``skip`` (dropped and counted by reason in the summary).
        block_size: bytes per counting block (whole lines); default: the engine's.
    """

    algorithm: str = "best_fit_decreasing"
    seed: Optional[int] = 0
    rows_per_shard: Optional[int] = None
    on_error: str = "raise"
    block_size: Optional[int] = None

    def check(self) -> None:
        if self.on_error not in ("raise", "skip"):
            raise ConfigError(f"--on-error must be 'raise' or 'skip', got {self.on_error!r}")
        if self.rows_per_shard is not None and self.rows_per_shard < 1:
            raise ConfigError(f"--rows-per-shard must be >= 1, got {self.rows_per_shard}")


@dataclass
class _Run:
    """One call of :func:`pack`: what its phases share."""

    out: Path
    paths: list[Path]
    encoder: MegatronSFTPackedEncoder
    options: PackOptions
    engine: Any
    progress: bool
    notes: list[str] = field(default_factory=list)
    times: dict[str, float] = field(default_factory=dict)

    @property
    def folder(self) -> Path:
        return self.out.parent

    @property
    def manifest(self) -> Path:
        return mf.manifest_path(self.out)

    @property
    def counts(self) -> Path:
        return mf.counts_path(self.out)

    @contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        """Record the seconds of ``stage`` (not when it raises)."""
        t = time.perf_counter()
        yield
        self.times[stage] = time.perf_counter() - t


@dataclass
class _Layout:
    """Pass 1's counts packed: the bins, the order rows are written in, the output files and their rows."""

    bins: list[list[int]]
    order: list[int]
    names: list[str]
    rows: list[int]


def pack(inputs: str | Path | Sequence[str | Path], output: str | Path, encoder: MegatronSFTPackedEncoder,
         options: Optional[PackOptions] = None, engine: Any = None, progress: bool = True,
         on_shard_done: Optional[Callable[[int], None]] = None) -> PackSummary:
    """Pack the conversations of ``inputs`` into rows written to ``output`` (or its shards).

    Args:
        inputs: JSONL files or globs (see ``inputs.expand_inputs``), one ``{chat_key: [messages]}``
            object per line.
        output: the ``.jsonl.packed`` file to write; its manifest is ``OUTPUT.manifest.json``.
        encoder: the encoder that will read the rows (tokenizer, format, seq_length, CP).
        options: packer, seed, shards, error policy and counting blocks (:class:`PackOptions`;
            default: its defaults).
        engine: ``LocalEngine()`` (default) or ``ray_engine.RayEngine(...)``.
        on_shard_done: called on the driver after each output file is written and recorded
            complete in the manifest, with the number of files this call has written so far.

    A manifest on disk with the same options and inputs is resumed: complete shards are kept.
    With other options or inputs, everything is rewritten (``notes`` says so).
    """
    options = options or PackOptions()
    engine = engine or LocalEngine()
    options.check()
    out = Path(output)
    if out.is_dir():
        raise ConfigError(f"--output {str(out)!r} is a folder; give the .jsonl.packed file to write")
    run = _Run(out, expand_inputs(inputs), encoder, options, engine, progress)
    run.folder.mkdir(parents=True, exist_ok=True)
    with output_lock(out), write_errors(out), engine:
        saved = _hash(run)
        old, stale = _previous(run.manifest, saved, run.notes)
        if _finished(run, old):
            return _summary(old, run.manifest, engine.name, len(old["shards"]), run.notes, run.times)
        counted = _count(run, mf.counts_key(saved), resumed=old is not None)
        layout = _layout(run, counted)
        with run.timed("write"):
            manifest, done = _manifest(run, saved, counted, layout, old, stale)
            jobs = shard_jobs(run.folder, layout.names, layout.bins, layout.order, options.rows_per_shard, counted,
                              wanted=set(range(len(layout.names))) - done)
            del layout                                  # the bins are not needed while writing
            _write(run, manifest, jobs, on_shard_done)
    return _summary(manifest, run.manifest, engine.name, len(done), run.notes, run.times)


@contextmanager
def write_errors(output: Path) -> Iterator[None]:
    """An ``OSError`` while the run writes (disk full, a file-size limit, a read-only folder) as one
    ``ConfigError`` naming the output and the error, and that the finished shards are kept."""
    try:
        yield
    except OSError as e:
        raise ConfigError(f"{output}: writing failed ({e.strerror or type(e).__name__}"
                          f"{': ' + str(e.filename) if e.filename else ''}); the shards finished before it are "
                          "complete and recorded in the manifest; fix the cause (free space, raise the file-size "
                          "limit) and rerun the same command to finish") from e


def _hash(run: _Run) -> dict:
    """The options the manifest records (the inputs hashed)."""
    with run.timed("hash"):
        o = run.options
        return mf.pack_options(run.encoder.signature(), o.algorithm, o.seed, o.rows_per_shard, o.on_error,
                               describe_inputs(run.paths))


def _finished(run: _Run, old: Optional[dict]) -> bool:
    """Whether the manifest this run resumes is complete, with every shard (nothing to write)."""
    if old is None or not old.get("complete") or not all(mf.shard_is_complete(run.folder, s) for s in old["shards"]):
        return False
    run.notes.append(f"note: every shard of {run.manifest.name} is complete already; nothing to write")
    return True


def _count(run: _Run, key: str, resumed: bool) -> Counted:
    """Pass 1: the counts of the interrupted run this one resumes, or the engine's."""
    with run.timed("count"):
        counted = mf.load_counts(run.counts, key) if resumed else None
        if counted is not None:
            run.notes.append(f"note: reused the counts of the interrupted run ({run.counts.name})")
            return counted
        total = sum(p.stat().st_size for p in run.paths)
        blocks = split_blocks(run.paths, run.options.block_size or run.engine.block_size(total))
        with tqdm(total=total, unit="B", unit_scale=True, desc="counting", disable=not run.progress) as bar:
            return run.engine.count(blocks, run.encoder, run.options.on_error, bar)


def _layout(run: _Run, counted: Counted) -> _Layout:
    """The costs bin-packed into rows, their order and the output files."""
    with run.timed("pack"):
        bins, order = pack_rows(counted.costs, run.encoder.seq_length, run.options.algorithm, run.options.seed)
        names = shard_names(run.out, len(bins), run.options.rows_per_shard)
        return _Layout(bins, order, names, shard_rows(len(bins), len(names), run.options.rows_per_shard))


def _manifest(run: _Run, saved: dict, counted: Counted, layout: _Layout, old: Optional[dict],
              stale: Optional[dict]) -> tuple[dict, set[int]]:
    """(the manifest of this run, saved with no shard written yet; the shards it keeps from ``old``:
    same file and rows, complete). The files of a ``stale`` manifest that this run does not write
    are removed; the counts are saved while shards are left to write (an interrupted run reuses them)."""
    manifest = {"format": mf.FORMAT, "version": mf.VERSION, "output": run.out.name, **saved,
                "counts": _counts_section(counted, layout.bins, run.encoder.seq_length),
                "shards": [{"file": n, "rows": r, "bytes": None, "sha256": None, "complete": False}
                           for n, r in zip(layout.names, layout.rows)],
                "complete": False}
    done: set[int] = set()
    for k, entry in enumerate((old or {}).get("shards", [])[:len(layout.names)]):
        if (entry["file"] == layout.names[k] and entry.get("rows") == layout.rows[k]
                and mf.shard_is_complete(run.folder, entry)):
            manifest["shards"][k] = entry
            done.add(k)
    if old is not None:
        run.notes.append(f"note: resumed {run.manifest.name}: {len(done)} of {len(layout.names)} shards "
                         "complete already, kept")
    _remove_stale(run.folder, stale, set(layout.names), run.out)
    if len(done) < len(layout.names):
        mf.save_counts(run.counts, counted, mf.counts_key(saved))
    mf.save_manifest(run.manifest, manifest)
    return manifest, done


def _write(run: _Run, manifest: dict, jobs: list, on_shard_done: Optional[Callable[[int], None]]) -> None:
    """Pass 2: the engine writes ``jobs``; each file is recorded complete as it is done."""
    written = 0
    with tqdm(total=sum(int(j.row_lengths.shape[0]) for j in jobs), desc="writing rows", unit="row",
              disable=not run.progress) as bar:
        def on_done(result: dict) -> None:
            nonlocal written
            entry = manifest["shards"][result["shard"]]
            entry.update(rows=result["rows"], bytes=result["bytes"], sha256=result["sha256"], complete=True)
            mf.save_manifest(run.manifest, manifest)
            bar.update(result["rows"])
            written += 1
            if on_shard_done is not None:
                on_shard_done(written)

        run.engine.write([str(p) for p in run.paths], run.encoder.chat_key, jobs, on_done)
    manifest["complete"] = True
    mf.save_manifest(run.manifest, manifest)
    run.counts.unlink(missing_ok=True)


def pack_file(input_path: str | Path | Sequence[str | Path], output_path: str | Path,
              encoder: MegatronSFTPackedEncoder, algorithm: str = "best_fit_decreasing", seed: Optional[int] = 0,
              progress: bool = True, **options: Any) -> PackSummary:
    """:func:`pack` with the single-process engine (``options``: the other fields of :class:`PackOptions`)."""
    return pack(input_path, output_path, encoder, PackOptions(algorithm=algorithm, seed=seed, **options),
                progress=progress)
