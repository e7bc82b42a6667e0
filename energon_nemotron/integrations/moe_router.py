"""Packing-safe routing statistics for megatron-core's mixture-of-experts router.

A packed row holds alignment pads and a tail (``PackedBatch.padding_mask``). Routed like real
tokens, they count towards each expert's load, the aux loss and the aux-loss-free expert-bias
update, so the statistics of a packed batch differ from those of the same samples unpacked.
megatron-core's ``TopKRouter.routing(logits, padding_mask=...)`` (0.19.2) leaves padding out of the
aux loss and the z-loss, but its ``_apply_expert_bias`` combines the flattened ``[T]`` mask with
the ``[T, E]`` routing map without a trailing axis: a shape error, so a masked call fails where the
expert bias is on (Megatron-Bridge's ``gpt_step`` patches the same method; megatron-core's fix is
pending). :func:`mask_expert_bias_counts` is the smallest fix, applied once by the training script.
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["mask_expert_bias_counts"]

_MARK = "_energon_nemotron_masked"


def mask_expert_bias_counts(router_class: Any) -> None:
    """Make ``router_class._apply_expert_bias`` (megatron-core's ``TopKRouter`` or a subclass) leave
    the tokens ``padding_mask`` marks (bool, True = padding, any shape with T elements) out of
    ``local_tokens_per_expert``, the counts the expert-bias update uses. Idempotent; the method's
    other behaviour (only with grad enabled, only with the expert bias on) is megatron-core's.

    Call it once, before training, with ``megatron.core.transformer.moe.router.TopKRouter``; then
    pass ``padding_mask`` (``PackedBatch.padding_mask`` of the row, in the layout of the router's
    input) to the router's ``forward`` or ``routing``."""
    original = router_class._apply_expert_bias
    if getattr(original, _MARK, False):
        return

    def _apply_expert_bias(self: Any, routing_map: Any, padding_mask: Optional[Any] = None) -> Any:
        if padding_mask is not None:
            routing_map = routing_map & ~padding_mask.reshape(-1, 1).to(routing_map.device)
        return original(self, routing_map, None)

    setattr(_apply_expert_bias, _MARK, True)
    _apply_expert_bias.__doc__ = original.__doc__
    router_class._apply_expert_bias = _apply_expert_bias
