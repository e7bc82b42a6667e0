"""Route one packed row through megatron-core 0.19.2's own ``TopKRouter`` (a subprocess of the tests).

    python tests/references/moe_router.py CASE.pt RESULT.pt

``CASE.pt`` (``torch.save``): ``{"logits": float32 [S, E] the router logits of a packed row,
"padding_mask": bool [S] (``PackedBatch.padding_mask`` of that row), "topk": int}``. The gating
linear layer is left out (megatron-core's ``gating`` moves its weight to a GPU); everything after
it is megatron-core's: ``TopKRouter.routing`` with sigmoid scores, the switch aux loss, the z-loss
and the aux-loss-free expert bias, then ``get_updated_expert_bias``. Four runs, each with a fresh
router: the packed row with its padding mask on megatron-core as it is (``raw_masked``), then,
with ``energon_nemotron.integrations.moe_router.mask_expert_bias_counts`` applied, the packed row
with its padding mask (``masked``), without it (``unmasked``), and only the row's real tokens
(``logits[~padding_mask]``, ``unpacked``), as if the samples were routed unpacked.

``RESULT.pt``: per run ``tokens_per_expert`` float32 [E]
(what the expert bias update counts), ``aux_loss`` and ``z_loss`` (float), ``expert_bias`` float32
[E] after one update; a run that raised holds ``{"error": its message}`` instead.

Shims, besides ``bridge_runtime.activate``: ``torch.cuda.current_device`` answers ``"cpu"`` (the
router puts its buffers on the current CUDA device), ``torch.compile`` (megatron-core's JIT fuser
on ``_apply_expert_bias``) runs eagerly, and a one-process gloo group stands for every parallel
group.
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
warnings.simplefilter("ignore")

from references.bridge_runtime import activate  # noqa: E402

activate()

import torch  # noqa: E402

torch.cuda.current_device = lambda: "cpu"
torch._dynamo.config.disable = True

from megatron.core.process_groups_config import ProcessGroupCollection  # noqa: E402
from megatron.core.transformer.moe import moe_utils  # noqa: E402
from megatron.core.transformer.moe.router import TopKRouter  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

AUX, Z, RATE = 1e-2, 1e-3, 1e-3


def _router(experts: int, topk: int, group) -> TopKRouter:
    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1, num_moe_experts=experts,
                               moe_router_topk=topk, moe_router_load_balancing_type="aux_loss",
                               moe_aux_loss_coeff=AUX, moe_z_loss_coeff=Z, moe_router_score_function="sigmoid",
                               moe_router_enable_expert_bias=True, moe_router_bias_update_rate=RATE,
                               moe_router_dtype="fp32", add_bias_linear=False, use_cpu_initialization=True)
    pgs = ProcessGroupCollection(tp=group, cp=group, tp_cp=group, tp_dp_cp=group, dp=group, dp_cp=group, ep=group)
    router = TopKRouter(config, pg_collection=pgs)
    router.set_layer_number(1)
    router.train()
    return router


def _route(logits: torch.Tensor, padding_mask, topk: int, group) -> dict:
    router = _router(int(logits.shape[-1]), topk, group)
    seen: dict = {}
    attach = router.attach_and_log_load_balancing_loss

    def spy(activation, coeff, aux_loss, name, *args, **kwargs):
        seen[name] = float(aux_loss)
        return attach(activation, coeff, aux_loss, name, *args, **kwargs)

    router.attach_and_log_load_balancing_loss = spy
    z_loss_func = moe_utils.z_loss_func

    def z_spy(*args, **kwargs):
        out = z_loss_func(*args, **kwargs)
        seen["z_loss"] = float(out)
        return out

    import megatron.core.transformer.moe.router as router_module

    router_module.z_loss_func = z_spy
    try:
        x = logits.clone().requires_grad_(True).unsqueeze(1)           # [S, 1, E]
        router.routing(x, padding_mask=None if padding_mask is None else padding_mask.unsqueeze(1))
    except RuntimeError as e:
        return {"error": str(e).splitlines()[0]}
    finally:
        router_module.z_loss_func = z_loss_func
    tokens = router.local_tokens_per_expert.clone()
    bias = moe_utils.get_updated_expert_bias(tokens.clone(), router.expert_bias.clone(), RATE, tp_dp_cp_group=group)
    return {"tokens_per_expert": tokens, "aux_loss": seen["load_balancing_loss"], "z_loss": seen["z_loss"],
            "expert_bias": bias}


def main(case_path: str, result_path: str) -> None:
    case = torch.load(case_path)
    store = tempfile.mkdtemp()
    torch.distributed.init_process_group("gloo", init_method=f"file://{os.path.join(store, 'pg')}", rank=0,
                                         world_size=1)
    group = torch.distributed.new_group([0], backend="gloo")
    logits, mask, k = case["logits"], case["padding_mask"], int(case["topk"])
    out = {"raw_masked": _route(logits, mask, k, group)}
    from energon_nemotron.integrations.moe_router import mask_expert_bias_counts

    mask_expert_bias_counts(TopKRouter)
    mask_expert_bias_counts(TopKRouter)                 # idempotent
    out.update(masked=_route(logits, mask, k, group), unmasked=_route(logits, None, k, group),
               unpacked=_route(logits[~mask], None, k, group))
    torch.distributed.destroy_process_group()
    torch.save(out, result_path)


if __name__ == "__main__":
    main(*sys.argv[1:3])
