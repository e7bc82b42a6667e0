"""Adapters to the training stacks that consume ``PackedBatch``: the Megatron-Bridge step dicts
(0.6.2's ``nemotron_omni_step`` and ``gpt_step``, main's expanded Nemotron Omni step),
the padding-safe expert-bias count for megatron-core's MoE router (``moe_router``), and the
``cfg.dataset`` a Bridge recipe names to train on this library's task encoder (``bridge_recipe``).

A leaf of the package: it imports the core and nothing in the package imports it.
"""

from energon_nemotron.integrations.bridge_expanded import to_nemotron_omni_expanded_batch
from energon_nemotron.integrations.bridge_recipe import NemotronEnergonProvider
from energon_nemotron.integrations.megatron_bridge import (BridgeBatchError, to_gpt_step_batch,
                                                           to_nemotron_omni_step_batch)
from energon_nemotron.integrations.moe_router import mask_expert_bias_counts

__all__ = ["to_nemotron_omni_step_batch", "to_nemotron_omni_expanded_batch", "to_gpt_step_batch", "BridgeBatchError",
           "mask_expert_bias_counts", "NemotronEnergonProvider"]
