"""``PackedBatch``: the one output type of the library, produced by both input paths.

A micro-batch of packed rows ready for a Megatron model with ``qkv_format="thd"``: the token
tensors, the segment boundaries, and per row the sources and media it holds (``MediaSpan``: where
each media item sits; ``BatchMedia``: the items' processed tensors). What a consumer derives from
it (megatron-core ``PackedSeqParams``, multi-token-prediction targets, a context-parallel slice, a
TP broadcast) lives in ``parallel/``; the Megatron-Bridge step dicts in ``integrations/``.
"""

from energon_nemotron.batch.media import MEDIA_KINDS, BatchMedia, MediaSpan
from energon_nemotron.batch.packed import IGNORE_INDEX, PackedBatch

__all__ = ["PackedBatch", "MediaSpan", "BatchMedia", "IGNORE_INDEX", "MEDIA_KINDS"]
