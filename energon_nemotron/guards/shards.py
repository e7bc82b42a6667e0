"""Shards and indexes of prepared Energon datasets: a cheap cross-check at start, clear errors at read.

``energon prepare`` writes per shard ``NAME.tar.idx``: ``count + 1`` little-endian uint64 byte
offsets (each sample's first tar header, then the end of the last sample), and the per-shard
``count`` into ``.nv-meta/.info.json``; a ``.jsonl`` gets ``NAME.jsonl.idx`` (each line's offset,
then the file size). Energon trusts both: a raised count reads past the index, a lowered one drops
the shard's last samples without a word, a deleted or cut shard fails with a raw traceback.

:func:`leaf_problems` checks, per shard of the split, with a stat and one small read of the index
(never the samples): the shard exists and is not empty; its index exists, lists exactly the
``.info`` count, and its offsets are ordered tar blocks that fit the shard's size (a shard cut short
ends before its index does). :func:`guard_reads` wraps Energon's sample readers so that what is
found only while reading (a damaged tar header inside a shard) is a ``DatasetError`` naming the shard,
the sample's position and key, what is wrong and the fix, raised in the worker and re-raised intact
in the parent, under every ``on_error`` (``ErrorPolicy`` never counts it as a skip).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Optional

from energon_nemotron._energon import indexed_sample_key, reader_jsonl, reader_position, wrap_leaf_readers
from energon_nemotron._energon.storage import RemotePath, as_data_path, listed, object_size, read_range
from energon_nemotron.errors import DatasetError
from energon_nemotron.guards.energon_files import META, info_counts, load_yaml_file, split_file

BLOCK = 512


def _offsets(idx: Any, *positions: int) -> list[int]:
    """The uint64 entries of an index file (local or ``msc://``) at ``positions``."""
    return [struct.unpack("<Q", read_range(as_data_path(idx), 8 * i, 8))[0] for i in positions]


def _header_ok(block: bytes) -> bool:
    """Whether ``block`` is a tar header with a valid checksum (unsigned or signed, as ``tarfile``
    accepts it); an all-zero block (the end of an archive) is not."""
    if len(block) != BLOCK:
        return False
    try:
        stored = int(block[148:156].split(b"\0", 1)[0].strip() or b"0", 8)
    except ValueError:
        return False
    unsigned = sum(block) - sum(block[148:156]) + 8 * 32
    return stored == unsigned or stored == unsigned - 256 * sum(b > 127 for b in block[:148] + block[156:])


def header_problem(shard: Any, offset: int) -> Optional[str]:
    """Why the 512 bytes at ``offset`` of ``shard`` (local or ``msc://``) are not a tar header
    (None: they are one)."""
    block = read_range(as_data_path(shard), offset, BLOCK)
    return None if _header_ok(block) else f"no valid tar header at byte {offset}"


def shard_problem(shard: Any, count: int, info: str = ".info.json") -> Optional[str]:
    """What is wrong with a shard (a local path or an ``msc://`` location) and its ``.tar.idx``
    against the ``count`` of ``info`` (None: nothing found). O(1) per shard: the sizes of the shard
    and its index and two small reads of the index (the samples' first, last and end offsets): on
    object storage four requests, no byte of the shard."""
    path = as_data_path(shard)
    name, idx = str(path), path.with_name(path.name + ".idx")
    try:
        size = object_size(path)
    except FileNotFoundError:
        return f"{name}: the shard is missing ({info} counts {count} samples in it)"
    if size == 0:
        return f"{name}: the shard is empty (0 bytes; {info} counts {count} samples in it)"
    idx_name = idx.name
    try:
        entries, rest = divmod(object_size(idx), 8)
    except FileNotFoundError:
        return f"{name}: its index {idx_name} is missing"
    if rest or entries == 0:
        return f"{name}: its index {idx_name} is damaged ({entries * 8 + rest} bytes: not count + 1 offsets)"
    if entries - 1 != count:
        what = ("the last " + str(entries - 1 - count) + " samples would be dropped") if entries - 1 > count \
            else "reading would run past the index"
        return f"{name}: {info} counts {count} samples but the index {idx_name} lists {entries - 1} ({what})"
    if count == 0:
        return None
    first, = struct.unpack("<Q", read_range(idx, 0, 8))
    last, end = struct.unpack("<QQ", read_range(idx, 8 * (count - 1), 16))
    ordered = not (first % BLOCK or last % BLOCK or end % BLOCK) and first <= last < end
    if ordered and end > size:
        return f"{name}: the shard is truncated ({size} bytes, its index says the samples end at byte {end})"
    if not ordered or end - first < BLOCK * count:
        return f"{name}: its index {idx_name} is damaged (offsets {first}, {last}, {end} do not fit a tar " \
               f"of {size} bytes with {count} samples)"
    return None


def jsonl_problem(path: Path) -> Optional[str]:
    """What is wrong with a ``.jsonl`` against its ``.jsonl.idx`` (None: nothing found)."""
    path = as_data_path(path)
    idx = path.with_name(path.name + ".idx")
    try:
        entries, rest = divmod(object_size(idx), 8)
    except FileNotFoundError:
        return f"{path}: its index {idx.name} is missing (the file is not prepared)"
    if rest or entries < 2:
        return f"{path}: its index {idx.name} is damaged ({entries * 8 + rest} bytes)"
    first, end = _offsets(idx, 0, entries - 1)
    size = object_size(path)
    if first != 0 or end != size:
        return f"{path}: the file has {size} bytes but its index {idx.name} covers bytes {first}..{end}: " \
               "the file changed after `energon prepare`"
    return None


def _read_split(leaf: Any) -> tuple[Path, str, dict, Path, dict, set]:
    """(metadata folder, info file name, its shard counts, split file, its ``split_parts``, the
    excluded names brace-expanded) of a prepared folder. Raises ``DatasetError``."""
    import braceexpand

    meta = as_data_path(leaf.path) / META
    try:
        info, counts = info_counts(meta)
    except Exception as e:
        raise DatasetError(f"{meta}: the .info file cannot be read ({type(e).__name__}: {e})") from None
    file = split_file(meta, leaf.split_config)
    try:
        splits = json.loads(file.read_text()) if file.suffix == ".json" else load_yaml_file(file)
        parts, exclude = splits["split_parts"], splits.get("exclude") or []
    except Exception as e:
        raise DatasetError(f"{file}: the split file cannot be read ({type(e).__name__}: {e})") from None
    return meta, info, counts, file, parts, {n for e in exclude for n in braceexpand.braceexpand(e)}


def _names(parts: dict, split: str, excluded: set) -> list[str]:
    """The shard names of split part ``split``, as Energon selects them (brace-expanded, minus ``excluded``)."""
    import braceexpand

    return [n for pattern in parts.get(split) or [] for n in braceexpand.braceexpand(pattern) if n not in excluded]


def split_shards(leaf: Any) -> tuple[str, list[tuple[str, int]]]:
    """(info file name, [(shard name, count)]) of a prepared folder's split, as Energon selects them:
    the split file's names brace-expanded, minus ``exclude``. Raises ``DatasetError``."""
    meta, info, counts, file, parts, excluded = _read_split(leaf)
    if leaf.split not in parts:
        raise DatasetError(f"{file}: no split part {leaf.split!r} (parts: {', '.join(parts)}); set the data "
                           "source's split")
    names = _names(parts, leaf.split, excluded)
    missing = [n for n in names if n not in counts]
    if missing:
        raise DatasetError(f"{file} lists shards that {meta / info} does not count: {', '.join(missing[:5])}")
    return info, [(n, counts[n]) for n in names]


def empty_split(leaf: Any) -> Optional[str]:
    """Why a prepared folder's split has nothing to read, naming the dataset, the split and the
    splits that have shards (None: it has shards, or the split file is wrong in another way, which
    :func:`leaf_problems` reports). Energon would raise its bare ``EmptyDatasetError``."""
    try:
        _, _, _, file, parts, excluded = _read_split(leaf)
    except DatasetError:
        return None
    if leaf.split not in parts or _names(parts, leaf.split, excluded):
        return None
    sizes = {name: len(_names(parts, name, excluded)) for name in parts}
    full = [f"{name} ({n} shard{'s' if n != 1 else ''})" for name, n in sizes.items() if n]
    where = f"splits with shards: {', '.join(full)}" if full else "no split has shards"
    return f"{leaf.path}: split {leaf.split!r} has no shards ({file.name} lists none for it; {where})"


def leaf_problems(leaf: Any) -> list[str]:
    """Every problem found in a leaf's shards (or ``.jsonl``) and indexes."""
    if leaf.kind == "jsonl":
        problem = jsonl_problem(as_data_path(leaf.path))
        return [problem] if problem else []
    try:
        info, shards = split_shards(leaf)
    except DatasetError as e:
        return [str(e)]
    root = as_data_path(leaf.path)
    with listed(root):                          # on object storage: one listing gives every size
        found = [shard_problem(root / name, count, info) for name, count in shards]
    return [p for p in found if p]


def _sample_key(dataset: Path, shard_name: str, position: int) -> Optional[str]:
    """The key of the ``position``-th sample of a shard (None if unknown)."""
    try:
        _, counts = info_counts(dataset / META)
        return indexed_sample_key(dataset / META, list(counts).index(shard_name), position)
    except Exception:
        return None


def _causes(exc: BaseException, depth: int = 3) -> str:
    """``Type: message`` of an exception and of the exceptions that caused it (up to ``depth``)."""
    parts, seen = [], exc
    while seen is not None and len(parts) < depth:
        parts.append(" ".join(f"{type(seen).__name__}: {seen}".split())[:300])
        seen = seen.__cause__ or seen.__context__
    return "; caused by ".join(parts)


def read_failure(reader: Any, index: int, exc: BaseException) -> str:
    """The message for a sample that Energon's ``reader`` could not read at global ``index``."""
    cause = f"{type(exc).__name__}: {exc}"
    fix = "restore the shard if it is damaged, then re-run `energon prepare {}`"
    at = reader_position(reader, index)
    if at is not None:
        path, name, count, position, dataset = at
        key = _sample_key(dataset, name, position)
        found = shard_problem(path, count)
        if found is None:
            try:
                offset = _offsets(path.with_name(path.name + ".idx"), position)[0]
                found = header_problem(path, offset)
            except Exception:
                found = None
        where = f"{path}: sample {position} of the shard" + (f" (key {key!r})" if key else "")
        if found is None and isinstance(path, RemotePath):
            return (f"{where} could not be fetched from the object store ({_causes(exc)}), after the "
                    "multi-storage-client's retries; its size and index agree, so the transfer failed, "
                    f"not the shard: check the endpoint of profile {path.profile!r} and the network, then "
                    "resume from the last saved state (no batch was changed)")
        detail = found.removeprefix(f"{path}: ") if found else cause
        return f"{where} cannot be read: {detail}. The shard or its index is damaged: {fix.format(dataset)}"
    jsonl = reader_jsonl(reader)
    if jsonl is not None:
        return f"{jsonl}: sample {index} cannot be read ({cause}); re-run `energon prepare {jsonl}`"
    return f"{reader}: sample {index} cannot be read ({cause}); {fix.format('DATASET')}"


class GuardedReader:
    """An Energon sample reader (``ShardInfosITarReader``, ``IJsonlReader``, ...) whose read errors
    become a :class:`DatasetError` (see :func:`read_failure`); everything else is delegated."""

    def __init__(self, reader: Any) -> None:
        self.reader = reader

    def __getattr__(self, name: str) -> Any:
        if name == "reader":                       # not set yet (unpickling)
            raise AttributeError(name)
        return getattr(self.reader, name)

    def __len__(self) -> int:
        return len(self.reader)

    def __repr__(self) -> str:
        return repr(self.reader)

    def __str__(self) -> str:
        return str(self.reader)

    def __getitem__(self, index: Any) -> Any:
        try:
            return self.reader[index]
        except (DatasetError, MemoryError):
            raise
        except Exception as e:
            try:
                message = read_failure(self.reader, index, e)
            except Exception:                      # the diagnosis itself failed: the plain cause
                message = f"{self.reader}: sample {index} cannot be read ({type(e).__name__}: {e}); the " \
                          "dataset is damaged: re-run `energon prepare`"
            raise DatasetError(message) from e


def guard_reads(dataset: Any) -> int:
    """Wrap the sample readers of every Energon sample-loading dataset below ``dataset`` (a built
    ``SavableDataset`` tree) in :class:`GuardedReader`; returns how many were wrapped."""
    return wrap_leaf_readers(dataset, GuardedReader, lambda reader: isinstance(reader, GuardedReader))
