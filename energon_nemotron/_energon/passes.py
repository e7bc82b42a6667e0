"""The pass over the data each sample was read in, carried in its restore key.

Energon's sample loader (``WebdatasetSampleLoaderDataset``, the leaf of every prepared and JSONL
dataset) counts, per worker, the passes it has made over its slices (``_epoch_count``); in pass
``e`` it reads each of its samples once, so ``e`` is also how many times the sample was read
before, whichever worker reads it. Its restore key is ``("Webdataset", index)``; with
:func:`install` it is ``("Webdataset", index, pass)``: read in iteration, the leaf's count; read
back from a saved restore key (a buffered sample after a resume), the pass the key names (a key
saved without one: pass 0). So the pass of a sample is the same for any worker count and
data-parallel size, across an exact resume, and counts up in the next epoch or repetition.
:func:`sample_pass` reads it from any restore key above the leaf (a ``Sample``'s ``__restore_key__``).
"""

from __future__ import annotations

from typing import Any

from megatron.energon.flavors.webdataset.sample_loader import RawSampleData, WebdatasetSampleLoaderDataset

__all__ = ["install", "sample_pass"]

_SAMPLE_TOKEN = "Webdataset"
_ORIGINAL_GET = WebdatasetSampleLoaderDataset._get_sample


def _with_pass(raw: RawSampleData, index: int, pass_: int) -> RawSampleData:
    """``raw`` with the pass in its restore key and in its readers' samples' (the crude sample
    Energon makes of them carries the latter)."""
    key = (_SAMPLE_TOKEN, index, int(pass_))
    data = tuple(part if not isinstance(part, dict) or "__restore_key__" not in part
                 else {**part, "__restore_key__": (*tuple(part["__restore_key__"])[:2], int(pass_))}
                 for part in raw.data)
    return RawSampleData(__restore_key__=key, data=data)


def _get_sample(self: Any, index: int) -> RawSampleData:
    """The leaf's read in iteration, its restore key naming the pass it is in."""
    return _with_pass(_ORIGINAL_GET(self, index), index, self._epoch_count)


def _restore_sample(self: Any, restore_key: tuple) -> RawSampleData:
    """The leaf's read of a saved restore key: ``("Webdataset", index[, pass])``."""
    name, index, *rest = restore_key
    if name != _SAMPLE_TOKEN or not isinstance(index, int) or len(rest) > 1:
        raise ValueError(f"not a sample's restore key: {restore_key!r}")
    return _with_pass(_ORIGINAL_GET(self, index), index, rest[0] if rest else 0)


def install() -> None:
    """Make every Energon sample loader name the pass in its samples' restore keys (idempotent;
    before the loader's workers start)."""
    WebdatasetSampleLoaderDataset._get_sample = _get_sample
    WebdatasetSampleLoaderDataset.restore_sample = _restore_sample


def sample_pass(restore_key: Any) -> int:
    """The pass a restore key names (the int after the sample's index at its end; 0 when it names
    none)."""
    key = tuple(restore_key or ())
    for i in range(len(key) - 1, -1, -1):
        if key[i] == _SAMPLE_TOKEN:
            tail = key[i + 1:]
            return int(tail[1]) if len(tail) >= 2 and isinstance(tail[1], int) else 0
    return 0
