"""Packs of distinct sources: no bin holds two reads of the same sample.

A repeating loader whose dataset is smaller than a worker's share of the packing buffer fills the
buffer with several reads of each sample; any packer then happily puts copies side by side, so one
row trains on the same conversation twice (seen: one key three times in one pack). After the
packer has chosen its bins, :func:`separate_repeats` moves each repeated read out of a bin that
already holds its sample, into the first other bin with room that does not hold it, else into a new
bin. Buffers without repeats (every normal configuration) come back unchanged.
"""

from __future__ import annotations

from typing import Hashable, Optional, Sequence


def separate_repeats(bins: list[list[int]], ids: Sequence[Hashable], sizes: Sequence[int], capacity: int,
                     max_sequences_per_bin: Optional[int] = None, secondary: Optional[Sequence[int]] = None,
                     secondary_capacity: Optional[int] = None) -> list[list[int]]:
    """``bins`` (item indices) with no two items of one bin sharing an id.

    Args:
        bins: a partition of ``range(len(ids))``, each bin within ``capacity``.
        ids: the source identity of each item (equal ids: the same sample read twice).
        sizes: each item's size (tokens), ≤ ``capacity``.
        capacity: the size budget of a bin.
        max_sequences_per_bin: the most items per bin, or None (the packers' name for it).
        secondary, secondary_capacity: an optional second size per item (e.g. vision patches) and
            its budget per bin, kept as well for the bins that receive a moved item.

    Returns the bins with repeated items moved (first fit, bins in order, then new bins); every item
    is kept exactly once, and the first read of each id stays where the packer put it.
    """
    if len(set(ids)) == len(ids):
        return bins
    out = [list(b) for b in bins]
    members = [{ids[i] for i in b} for b in out]
    used = [sum(sizes[i] for i in b) for b in out]
    moved: list[int] = []
    for k, b in enumerate(out):
        seen: set = set()
        keep = []
        for i in b:
            (moved if ids[i] in seen else keep).append(i)
            seen.add(ids[i])
        if len(keep) != len(b):
            out[k] = keep
            members[k] = seen
            used[k] = sum(sizes[i] for i in keep)
    def second_fits(b: list[int], i: int) -> bool:
        return secondary is None or secondary_capacity is None or \
            sum(secondary[j] for j in b) + secondary[i] <= secondary_capacity

    for i in moved:
        for k, b in enumerate(out):
            if ids[i] not in members[k] and used[k] + sizes[i] <= capacity and \
                    (max_sequences_per_bin is None or len(b) < max_sequences_per_bin) and second_fits(b, i):
                b.append(i)
                members[k].add(ids[i])
                used[k] += sizes[i]
                break
        else:
            out.append([i])
            members.append({ids[i]})
            used.append(sizes[i])
    return [b for b in out if b]


class BufferOverDataWarning(UserWarning):
    """The packing buffer is larger than a worker's share of (a dataset of) the data, so each buffer
    holds repeated reads of the same samples."""


def buffer_over_data(buffer: int, datasets: Sequence[tuple[str, int, Optional[float]]],
                     readers: int) -> Optional[str]:
    """Why a repeating loader's packing buffer would hold repeated reads, or None.

    Args:
        buffer: the packing buffer size (samples).
        datasets: (name, samples, blend weight or None) per dataset; with weights, a dataset's
            expected share of a buffer is ``buffer * weight / Σ weights``, else the buffer draws
            from all datasets together.
        readers: the readers the data is split over (workers × data-parallel ranks).
    """
    weights = [w for _, _, w in datasets]
    if all(w is not None for w in weights) and len(datasets) > 1:
        total = sum(weights)
        for name, n, w in datasets:
            share, wanted = n / readers, buffer * w / total
            if wanted > share:
                return (f"dataset {name} has {n} samples, {share:g} per reader over {readers} reader(s) (workers x "
                        f"data-parallel ranks), and its blend weight draws about {wanted:.3g} of them into every packing "
                        f"buffer (packing.buffer_size {buffer})")
        return None
    n = sum(count for _, count, _ in datasets)
    if buffer > n / readers:
        return (f"packing.buffer_size {buffer} is larger than a reader's share of the data: {n} samples over "
                f"{readers} reader(s) (workers x data-parallel ranks) is {n / readers:g} each")
    return None


def source_id(sample) -> Hashable:
    """The identity of the sample a (cooked, encoded) sample was read from: Energon's source infos
    (dataset path and index), else its ``__key__``. Equal for two reads of one sample."""
    sources = getattr(sample, "__sources__", None)
    if sources:
        return tuple((str(s.dataset_path), s.index) for s in sources)
    return sample.__key__
