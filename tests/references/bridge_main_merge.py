"""Run Megatron-Bridge **main**'s Nemotron Omni step and model on project batches (makes fixtures).

    python tests/references/bridge_main_merge.py BRIDGE_SRC CASES.pt RESULTS.pt

``BRIDGE_SRC``: Bridge's ``src`` folder at the commit the fixtures name (Bridge main is not on PyPI:
``git archive <commit> src`` of its repository). Bridge's modules are imported from there as
``tests/references/bridge.py`` imports the 0.6.2 wheel, on megatron-core 0.19.2
(``bridge_runtime.activate``). ``CASES.pt``: ``[{"name", "cp_size", "batch", "model"}]``
(``tests/bridge_main_cases.py``). For every case and every CP rank (``cp_size`` gloo processes):

- Bridge main's real ``nemotron_omni_step.forward_step`` (→ ``get_batch`` →
  ``get_batch_from_iterator``; ``Tensor.cuda`` is the identity) calls the real
  ``NemotronOmniModel.forward``: ``_encode_images`` (``_patchify_dynamic_images``, the vision
  packed-sequence params, the per-image pixel shuffle), ``_encode_sound`` with Bridge's real
  ``BridgeSoundEncoder`` (a one-layer Parakeet; its valid-length rule is the real one),
  ``_merge_projected_media`` and the CP partition of the full THD row
  (``_apply_context_parallel_sharding`` → ``get_packed_seq_cp_partition_indices`` → megatron-core's
  ``get_batch_on_this_cp_rank``), then Bridge's ``masked_next_token_loss``.
- Stand-ins, only where the real part cannot run on CPU (``references.bridge_steps``): RADIO (a
  linear map of each patch, with RADIO's temporal tubelet grouping), projections whose features 0
  and 1 spell the placeholder id, a recording language model whose embedding spells every token
  id; and Transformer Engine's ``thd_get_partitioned_indices`` (a GPU kernel), rewritten from its
  documented rule: every padded segment in 2·CP chunks, rank r takes chunks r and 2·CP-1-r.

``RESULTS.pt``: per case ``{"name", "ok", "error", "ranks": [per CP rank: "merged_ids", "labels",
"loss_mask" (the model's), "position_ids", "padding_mask" (after the CP partition), "index" (the
row positions the rank holds), "packed" (the language model's packed-sequence params or None),
"loss_tokens", "sound_embedding_lengths", "vision_cu_seqlens"]}``.
"""

from __future__ import annotations

import os
import sys
import tempfile
import types
import warnings
from pathlib import Path

if __name__ == "__main__" and len(sys.argv) > 1:
    os.environ.setdefault("ENERGON_NEMOTRON_BRIDGE_ROOT", sys.argv[1])
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
warnings.simplefilter("ignore")

from references import bridge_steps as steps  # noqa: E402  (activates megatron-core 0.19.2)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from references.bridge import import_bridge_module  # noqa: E402

MODEL = "megatron.bridge.models.nemotron_omni.modeling_nemotron_omni"


def thd_get_partitioned_indices(cu_seqlens: torch.Tensor, total_tokens: int, cp_size: int, cp_rank: int):
    """int64 [total_tokens / cp_size]: the positions CP rank ``cp_rank`` holds of a THD row whose
    padded segments end at ``cu_seqlens`` int32 [n+1] (each a multiple of 2·CP): chunks ``cp_rank``
    and ``2·CP-1-cp_rank`` of every segment, segment after segment."""
    out = []
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        chunk = (end - start) // (2 * cp_size)
        if chunk * 2 * cp_size != end - start:
            raise ValueError(f"segment {start}..{end} is not a multiple of 2 * CP ({2 * cp_size})")
        for k in (cp_rank, 2 * cp_size - 1 - cp_rank):
            out.append(torch.arange(start + k * chunk, start + (k + 1) * chunk))
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.int64)


class MainLM(steps.RecordingLM):
    """The recording language model, also keeping the loss mask and positions it is given."""

    def forward(self, **kwargs):
        out = super().forward(**kwargs)
        self.seen["loss_mask"] = None if kwargs.get("loss_mask") is None else kwargs["loss_mask"].clone()
        self.seen["position_ids"] = kwargs["position_ids"].clone()
        return out


def tiny_omni(model: dict, cp_size: int, cp_group) -> torch.nn.Module:
    """A ``NemotronOmniModel`` with the attributes its ``forward`` reads and the tiny parts above."""
    omni = import_bridge_module(MODEL)
    sound = import_bridge_module("megatron.bridge.models.nemotron_omni.nemotron_omni_sound")
    torch.manual_seed(0)
    m = omni.NemotronOmniModel.__new__(omni.NemotronOmniModel)
    torch.nn.Module.__init__(m)
    t = model["temporal_patch_dim"]
    m.pre_process = m.post_process = True
    m.image_token_index, m.sound_token_index = model["image_token_id"], model["sound_token_id"]
    m.patch_dim = 16
    m.context_parallel_lm = cp_size
    m.sequence_parallel_lm = False
    m.config = types.SimpleNamespace(mtp_num_layers=0)
    m.pg_collection = types.SimpleNamespace(pp=None, cp=cp_group, tp=None)
    m.vision_model = steps.TinyVision(t)
    m.vision_model.temporal_patch_dim = t
    m.vision_projection = steps._id_projection(4 * steps.VISION, model["image_token_id"])
    m.sound_model = sound.BridgeSoundEncoder(types.SimpleNamespace(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        num_mel_bins=128, subsampling_factor=8)).eval()
    m.sound_projection = steps._id_projection(16, model["sound_token_id"])
    m.language_model = MainLM(model["vocab_size"])
    return m.to(steps.DTYPE)


def run_case(case: dict, cp_rank: int, cp_group) -> dict:
    """One case on one CP rank (module docs)."""
    step = import_bridge_module("megatron.bridge.training.nemotron_omni_step")
    model = tiny_omni(case["model"], case["cp_size"], cp_group)
    seen: dict = {}
    shard = model._apply_context_parallel_sharding
    index_of = model._context_parallel_index

    def sharding(**kwargs):
        out = shard(**kwargs)
        seen["padding_mask"] = None if out[6] is None else out[6].clone()
        return out

    def index(**kwargs):
        got = index_of(**kwargs)
        seen["index"] = None if got is None else got.clone()
        return got

    model._apply_context_parallel_sharding = sharding
    model._context_parallel_index = index
    encode_sound = model._encode_sound

    def sound(clips, lengths):
        seen["sound_embedding_lengths"] = model.sound_model(clips.to(steps.DTYPE), lengths)[1].tolist()
        return encode_sound(clips, lengths)

    model._encode_sound = sound
    with torch.no_grad():
        loss_mask, tokens = steps._forward(step, model, dict(case["batch"]))
    lm = model.language_model.seen
    return {"merged_ids": lm["merged_ids"][0], "labels": lm["labels"][0], "loss_mask": loss_mask,
            "lm_loss_mask": lm["loss_mask"], "position_ids": lm["position_ids"][0],
            "padding_mask": seen.get("padding_mask"), "index": seen.get("index"),
            "packed": steps._packed(lm["packed_seq_params"]) or None, "loss_tokens": tokens,
            "sound_embedding_lengths": seen.get("sound_embedding_lengths"),
            "vision_cu_seqlens": model.vision_model.seen.get("vision_cu_seqlens")}


def _rank(rank: int, cases: list, cp_size: int, init: str, out: str) -> None:
    import megatron.core.utils as mcore_utils

    torch.Tensor.cuda = lambda self, *args, **kwargs: self     # no GPU: device copies are the identity
    torch.cuda.current_device = lambda: torch.device("cpu")

    mcore_utils.tex = types.SimpleNamespace(thd_get_partitioned_indices=thd_get_partitioned_indices)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=cp_size)
    try:
        group = dist.new_group(list(range(cp_size)))
        results = []
        for case in cases:
            try:
                results.append({"ok": True, "error": None, "rank": run_case(case, rank, group)})
            except Exception as e:           # Bridge's refusal is a result (the controls expect one)
                results.append({"ok": False, "error": f"{type(e).__name__}: {e}", "rank": None})
        torch.save(results, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def run(cases: list) -> list:
    """RESULTS (module docs) for ``cases``, the CP-1 cases in this process, the others in
    ``cp_size`` spawned gloo processes."""
    by_cp: dict[int, list] = {}
    for case in cases:
        by_cp.setdefault(case["cp_size"], []).append(case)
    got: dict[str, dict] = {}
    for cp_size, group in by_cp.items():
        with tempfile.TemporaryDirectory() as tmp:
            init, out = f"file://{tmp}/init", f"{tmp}/out"
            if cp_size == 1:
                _rank(0, group, 1, init, out)
            else:
                torch.multiprocessing.spawn(_rank, args=(group, cp_size, init, out), nprocs=cp_size)
            per_rank = [torch.load(f"{out}.{r}", weights_only=False) for r in range(cp_size)]
        for k, case in enumerate(group):
            ranks = [per_rank[r][k] for r in range(cp_size)]
            errors = [r["error"] for r in ranks if not r["ok"]]
            got[case["name"]] = {"name": case["name"], "ok": not errors, "error": errors[0] if errors else None,
                                 "ranks": [r["rank"] for r in ranks] if not errors else None}
    return [got[case["name"]] for case in cases]


def main(cases_path: str, results_path: str) -> None:
    cases = torch.load(cases_path, weights_only=False)
    torch.save(run(cases), results_path)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(sys.argv[2], sys.argv[3])
