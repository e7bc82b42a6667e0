"""Pure helpers for context parallelism, multi-token prediction and megatron-core parameters."""

from energon_nemotron.parallel.context_parallel import partition_indices, slice_for_cp_rank
from energon_nemotron.parallel.mtp import roll_targets
from energon_nemotron.parallel.packed_seq_params import to_packed_seq_params

__all__ = ["partition_indices", "slice_for_cp_rank", "roll_targets", "to_packed_seq_params"]
