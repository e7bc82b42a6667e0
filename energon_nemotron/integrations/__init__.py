"""Adapters to the training stacks that consume ``PackedBatch``: the Megatron-Bridge step dicts.

A leaf of the package: it imports the core and nothing in the package imports it.
"""

from energon_nemotron.integrations.megatron_bridge import (BridgeBatchError, to_gpt_step_batch,
                                                           to_nemotron_omni_step_batch)

__all__ = ["to_nemotron_omni_step_batch", "to_gpt_step_batch", "BridgeBatchError"]
