"""A built Energon dataset tree: its leaves (one per prepared dataset), their readers, passes and
worker slices, how a leaf reads a sample, and the restore keys that name samples."""

from __future__ import annotations

from bisect import bisect_right
from typing import Any, Callable, Iterator, Optional

from megatron.energon.flavors.webdataset.sample_loader import RawSampleData

from energon_nemotron._energon.storage import as_data_path
from energon_nemotron.errors import sample_where


#: the dataset class that reads the samples of one prepared dataset (a leaf of the tree)
LEAF = "WebdatasetSampleLoaderDataset"
#: wrappers whose restore keys carry the index of the inner dataset a sample came from
SELECTORS = ("BlendDataset", "ConcatDataset")
#: the restore-key token before a sample's index in its leaf, and the worker wrapper's of a batch
_SAMPLE_TOKEN, _WORKER_WRAPPER = "Webdataset", "SavableDatasetWrapper"


def inner_datasets(dataset: Any) -> list:
    """The datasets a built dataset wraps (``datasets`` of a blend or concatenation, the one
    ``dataset`` of another wrapper; none for a leaf)."""
    inner = getattr(dataset, "datasets", None)
    if isinstance(inner, (list, tuple)):
        return list(inner)
    one = getattr(dataset, "dataset", None)
    return [one] if one is not None and hasattr(one, "save_state") else []


def is_leaf(dataset: Any) -> bool:
    return type(dataset).__name__ == LEAF


def leaf_readers(leaf: Any) -> list:
    """A leaf's sample readers (one per joined dataset; the first is its own)."""
    return leaf.join_readers


def wrap_leaf_readers(dataset: Any, wrap: Callable[[Any], Any], done: Callable[[Any], bool]) -> int:
    """Replace, in place, every sample reader of every leaf below ``dataset`` (a built tree) by
    ``wrap(reader)`` unless ``done(reader)``; returns how many were wrapped."""
    wrapped, seen, stack = 0, set(), [dataset]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        readers = getattr(node, "join_readers", None)
        if isinstance(readers, list):
            for i, reader in enumerate(readers):
                if not done(reader):
                    readers[i] = wrap(reader)
                    wrapped += 1
        stack.extend(getattr(node, "datasets", None) or ())
    return wrapped


def leaf_size(leaf: Any) -> int:
    """Samples in a leaf's dataset (its split part, every worker and rank together)."""
    return len(leaf.join_readers[0])


def leaf_epoch(leaf: Any) -> int:
    """The pass a leaf is in (0 first; Energon's ``_epoch_count``)."""
    return leaf._epoch_count


def leaf_worker_slices(leaf: Any) -> list:
    """Per worker of this rank, the slice offsets Energon's sharder gave it in the leaf (a worker's
    slices are consecutive samples ``[offsets[0], offsets[-1])``)."""
    return leaf.workers_slice_offsets


def leaf_shuffle_over_epochs(leaf: Any) -> Optional[int]:
    return leaf.shuffle_over_epochs


def reader_location(reader: Any) -> Optional[str]:
    """Where a sample reader reads: a prepared folder, or a ``.jsonl`` file (None: unknown)."""
    where = getattr(reader, "base_path", None) or getattr(reader, "jsonl_path", None)
    return None if where is None else str(where)


def reader_jsonl(reader: Any) -> Optional[str]:
    """The ``.jsonl`` file a JSONL sample reader reads (None for another reader)."""
    where = getattr(reader, "jsonl_path", None)
    return None if where is None else str(where)


def reader_position(reader: Any, index: int) -> Optional[tuple[Any, str, int, int, Any]]:
    """``(shard path, shard name, samples in the shard, position in it, dataset folder)`` of global
    sample ``index`` of a tar-shard reader (paths: a local ``Path`` or an ``msc://`` ``RemotePath``);
    None for another reader."""
    if not (hasattr(reader, "shard_count_cumsum") and hasattr(reader, "shard_infos")):
        return None
    at = bisect_right(reader.shard_count_cumsum, index) - 1
    if not 0 <= at < len(reader.shard_infos):
        return None
    shard = reader.shard_infos[at]
    return (as_data_path(str(shard.path)), shard.name, shard.count, index - reader.shard_count_cumsum[at],
            as_data_path(str(reader.base_path)))


def read_leaf_sample(leaf: Any, index: int) -> Any:
    """The raw sample ``index`` of a leaf, read as the leaf itself reads it."""
    return type(leaf)._get_sample(leaf, index)


def empty_leaf_sample(leaf: Any, index: int) -> Any:
    """What a leaf yields for a sample it skips without reading (Energon's empty-sample convention)."""
    return RawSampleData(__restore_key__=(_SAMPLE_TOKEN, index), data=(None,) * len(leaf.join_readers))


def filter_leaf_samples(leaf: Any, get_sample: Callable[[int], Any]) -> None:
    """Make this leaf read sample ``index`` through ``get_sample(index)`` (replacing, on the
    instance, its ``_get_sample``), while samples named by restore keys (buffered when a state was
    saved) are read as they are (its ``restore_sample``)."""
    def restore(restore_key: tuple) -> Any:
        return type(leaf).restore_sample(leaf, restore_key)     # its pass kept (``_energon.passes``)

    leaf._get_sample = get_sample
    leaf.restore_sample = restore


def sample_refs(key: Any, path: tuple = ()) -> Iterator[tuple[tuple, int]]:
    """``(leaf path, sample index)`` of every sample named in an Energon restore key (a tuple, with
    nested tuples for packs and batches); the path is the inner-dataset index at every blend or
    concatenation (:data:`SELECTORS`)."""
    tokens = list(key)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        if isinstance(token, tuple):
            yield from sample_refs(token, path)
        elif token in SELECTORS and isinstance(nxt, int):
            path, i = path + (nxt,), i + 1
        elif token == _SAMPLE_TOKEN and isinstance(nxt, int):
            yield path, nxt
            i += 1
        i += 1


def names_samples(value: Any) -> bool:
    """Whether a tuple of a saved state is (or holds) a restore key."""
    return any(isinstance(t, str) and t == _SAMPLE_TOKEN for t in value) or any(isinstance(t, tuple) for t in value)


def batch_worker(restore_key: Any) -> tuple[int, Any]:
    """``(worker, the batch's own key)`` of a delivered batch's ``__restore_key__`` (the worker
    wrapper's name, the worker's global id over all ranks, its batch index, then the batch's key;
    worker 0 without workers): the caller takes the id modulo its own worker count."""
    if restore_key and restore_key[0] == _WORKER_WRAPPER:
        return int(restore_key[1]), restore_key[2:]
    return 0, restore_key[2:]


def sample_index(sample: Any) -> Optional[int]:
    """Energon's index of a sample in its dataset: the entry after the sample token at the end of its
    restore key (a crude sample dict, a ``Sample`` or Energon's raw sample data; a pass may follow
    it, ``_energon.passes``), else its first source's index."""
    key = sample.get("__restore_key__") if isinstance(sample, dict) else getattr(sample, "__restore_key__", None)
    key = tuple(key or ())
    at = max((i for i, t in enumerate(key) if t == _SAMPLE_TOKEN), default=None)
    if at is not None and at + 1 < len(key) and isinstance(key[at + 1], int):
        return int(key[at + 1])
    if at is None and key and isinstance(key[-1], int):
        return int(key[-1])
    sources = sample.get("__sources__") if isinstance(sample, dict) else getattr(sample, "__sources__", None)
    if sources:
        return int(sources[0].index)
    return None


def raw_sample_key(sample: Any) -> Optional[str]:
    """The ``__key__`` inside Energon's raw sample data (a JSONL line's or a tar sample's; None when it
    holds none), as the library shows it (``errors.shown_key``: ``FILE.jsonl:N`` for a JSONL line,
    ``DATASET/SHARD:KEY`` for a tar sample)."""
    data = getattr(sample, "data", None)
    if isinstance(data, (list, tuple)) and data and isinstance(data[0], dict) and "__key__" in data[0]:
        return sample_where(data[0])
    return None
