"""Context parallelism, multi-token prediction, megatron-core parameters and TP broadcast."""

from energon_nemotron.parallel.broadcast import broadcast_packed_batch
from energon_nemotron.parallel.context_parallel import partition_indices, slice_for_cp_rank
from energon_nemotron.parallel.mtp import mtp_targets, roll_targets
from energon_nemotron.parallel.packed_seq_params import packed_seq_params, row_boundaries, to_packed_seq_params

__all__ = ["broadcast_packed_batch", "partition_indices", "slice_for_cp_rank", "roll_targets", "mtp_targets",
           "to_packed_seq_params", "packed_seq_params", "row_boundaries"]
