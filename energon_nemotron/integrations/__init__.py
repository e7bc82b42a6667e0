"""Adapters to the training stacks that consume ``PackedBatch``: the Megatron-Bridge step dicts,
and the padding-safe expert-bias count for megatron-core's MoE router (``moe_router``).

A leaf of the package: it imports the core and nothing in the package imports it.
"""

from energon_nemotron.integrations.megatron_bridge import (BridgeBatchError, to_gpt_step_batch,
                                                           to_nemotron_omni_step_batch)
from energon_nemotron.integrations.moe_router import mask_expert_bias_counts

__all__ = ["to_nemotron_omni_step_batch", "to_gpt_step_batch", "BridgeBatchError", "mask_expert_bias_counts"]
