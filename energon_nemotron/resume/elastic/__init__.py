"""Elastic resume: continue the epoch in progress on another data-parallel size or worker count.

What a rank's state records (``Loader.state_dict()["elastic"]``): per leaf dataset of the Energon
tree (a ``WebdatasetSampleLoaderDataset``: one prepared WebDataset or JSONL dataset, named by its
path of blend indices) its size and the slice offsets Energon's sharder gave each of this rank's
workers; after an elastic start also what that start skips in the rank's part. Nothing per batch:
the rest is Energon's own state, which the loader checkpoints at every batch so that it is exact.

How often each sample was consumed (:func:`merge_rank_states`), per worker from Energon's state: a
leaf in its pass ``e`` (``_energon.leaf_epoch``) has consumed each of the worker's samples ``e`` times, plus
once for the samples it has read in this pass (the slices already opened, and inside the active
ones up to the read position), less once for every restore key still in flight in the worker's
buffers (shuffle buffer, packing buffers). A sample read and skipped as bad counts as consumed (it
would be skipped again). With ``repeat`` (no end), counts are taken relative to the lowest pass of
any worker of the leaf; with ``repeat=False`` they are absolute, so that a dataset repeated by a
blend (``repetitions: 2``) resumes in the right pass.

Resuming (``Loader.load_state_dict(merged, elastic=True)``): the new shape is built fresh (Energon's
sharding and seeds for M ranks, any worker count) and every leaf, in its pass ``k``, skips without
reading the samples consumed more than ``k`` times. Every sample that no rank had yielded in the
pass in progress is yielded exactly once in the first pass of the new shape; later passes are the
new shape's own. Limits: a sample still buffered when its worker had already started the next pass
(only with ``repeat``, at most a buffer per worker) counts for the new pass; fractional blend
repetitions end their last partial pass where the new shape's sharding ends it.

Sizes: the merged state holds one byte per sample of each leaf, zlib-compressed (counts of a run
stopped mid-pass are runs of 0 and 1: a few KB per million samples when the rank parts are read in
order, measured in the README); a rank's state carries its own part of it only after an elastic start.
"""

from energon_nemotron.resume.elastic.filters import install_filters, start_elastic
from energon_nemotron.resume.elastic.merge import merge_rank_states
from energon_nemotron._energon import sample_refs
from energon_nemotron.resume.elastic.record import (RecentBatches, dataset_leaves, decode_counts, encode_counts,
                                                    rank_record, rank_skipped)

__all__ = ["merge_rank_states", "start_elastic", "install_filters", "rank_record", "rank_skipped", "RecentBatches",
           "dataset_leaves", "sample_refs", "encode_counts", "decode_counts"]
