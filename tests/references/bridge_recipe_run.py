"""Megatron-Bridge 0.6.2's own training setup on ``NemotronEnergonProvider`` (a subprocess of
``tests/test_bridge_recipe.py``; one process per rank).

    python tests/references/bridge_recipe_run.py CASES.json OUT_DIR RANK WORLD

For every case of ``CASES.json`` (a list; see ``tests/test_bridge_recipe.py``), in this order, each
step Bridge's code unless named otherwise (``bridge_setup_runtime`` says what stands in for what):

1. ``validate``: a real ``ConfigContainer`` (a tiny ``GPTModelProvider``, ``TrainingConfig``, ...)
   whose ``dataset`` is the provider, through ``runtime_config_update`` (the start of
   ``pretrain``: ``ConfigContainer.validate()``, which calls the provider's ``finalize``);
2. ``initialize``: ``training.initialize._initialize_distributed`` on the gloo group of the
   ``WORLD`` processes (megatron-core's ``initialize_model_parallel``, then
   ``ProcessGroupCollection.use_mpu_process_groups()``: the ``pg_collection`` setup passes on) and
   megatron-core's ``init_num_microbatches_calculator`` with the arguments ``initialize_megatron``
   gives it;
3. ``setup``: ``data.utils.get_dataset_provider(cfg.dataset)``, ``training.setup._bind_dataset_provider_context``
   and ``data.loaders.setup_data_iterators`` (``build_train_valid_test_data_loaders``, sample
   counts, the ``external`` pass-through, ``RerunDataIterator``), as ``training.setup.setup`` calls them;
4. ``train``: ``batches`` batches from the train iterator; the first ``forward`` of them through
   ``nemotron_omni_step.forward_step`` (state with the real config) into ``bridge_steps.tiny_llava``,
   megatron-core's real ``LLaVAModel.forward`` with tiny encoders, then Bridge's loss.

``OUT_DIR/results-RANK.pt``: per case ``{name, stage, error, ...}``; ``stage`` is the step that
raised (None when all ran), ``error`` its ``"Type: message"``.
"""

from __future__ import annotations

import contextlib
import json
import sys
import types
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
warnings.simplefilter("ignore")

from references.bridge_setup_runtime import activate_setup  # noqa: E402

config = activate_setup()

import torch  # noqa: E402
from megatron.core import num_microbatches_calculator as nmc  # noqa: E402
from megatron.core import parallel_state  # noqa: E402
from megatron.core.distributed import DistributedDataParallelConfig  # noqa: E402
from megatron.core.optimizer import OptimizerConfig  # noqa: E402

from references.bridge import import_bridge_module  # noqa: E402
from references.bridge_steps import _Timer, tiny_llava  # noqa: E402

from energon_nemotron.integrations import NemotronEnergonProvider  # noqa: E402


class _HostTorch:
    """``torch`` as ``data.loaders`` sees it: ``torch.tensor(..., device="cuda")`` (its do-train
    flags, broadcast from rank 0) made on the host; everything else is torch's."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def tensor(*args, device=None, **kwargs):
        return torch.tensor(*args, **kwargs)


def container(case: dict):
    """Bridge's real ``ConfigContainer`` for ``case`` (the smallest parts ``validate()`` accepts)."""
    models = sys.modules["megatron.bridge.models"]
    m = case["model"]
    model = models.GPTModelProvider(num_layers=1, hidden_size=64, num_attention_heads=4, seq_length=m["seq_length"],
                                    apply_rope_fusion=False, context_parallel_size=m.get("context_parallel_size", 1),
                                    calculate_per_token_loss=True)
    t = case["train"]
    return config.ConfigContainer(
        train=config.TrainingConfig(global_batch_size=t["global_batch_size"], micro_batch_size=t["micro_batch_size"],
                                    train_iters=4),
        model=model, optimizer=OptimizerConfig(lr=1e-4, use_distributed_optimizer=False),
        scheduler=config.SchedulerConfig(lr_decay_style="linear", lr_warmup_iters=0),
        dataset=NemotronEnergonProvider(**case["provider"]), logger=config.LoggerConfig(),
        tokenizer=config.TokenizerConfig(), checkpoint=config.CheckpointConfig(ckpt_format="torch_dist"),
        dist=config.DistributedInitConfig(distributed_backend="gloo", use_gloo_process_groups=True,
                                          lazy_mpu_init=False),
        ddp=DistributedDataParallelConfig(average_in_collective=False), rng=config.RNGConfig(),
        rerun_state_machine=config.RerunStateMachineConfig(), validation=config.ValidationConfig(eval_iters=0))


def _controls(cfg, case: dict) -> dict:
    """What Bridge makes of the config itself: the provider type it accepts, its serialization,
    and its own ``EnergonDatasetConfig`` refusing this library's encoder (the issue)."""
    from energon_nemotron.loading import build_task_encoder

    base = import_bridge_module("megatron.bridge.data.base")
    builders = sys.modules["megatron.bridge.data.builders"]
    out = {"is_dataset_provider": isinstance(cfg.dataset, base.DatasetProvider),
           "serialized": cfg.to_dict()["dataset"]}
    declarative = builders.EnergonDatasetConfig(path=cfg.dataset.path or "unused", seq_length=cfg.dataset.seq_length,
                                                micro_batch_size=1,
                                                task_encoder=build_task_encoder(case["provider"]["loader_config"]))
    try:
        declarative.validate()
        out["energon_dataset_config"] = None
    except Exception as e:
        out["energon_dataset_config"] = f"{type(e).__name__}: {e}"
    return out


def _setup(cfg, pgs):
    data_utils = import_bridge_module("megatron.bridge.data.utils")
    loaders = import_bridge_module("megatron.bridge.data.loaders")
    setup = import_bridge_module("megatron.bridge.training.setup")
    state = import_bridge_module("megatron.bridge.training.state")
    loaders.torch = _HostTorch()
    provider = data_utils.get_dataset_provider(cfg.dataset)
    provider = setup._bind_dataset_provider_context(provider, tokenizer=None, pg_collection=pgs)
    return loaders.setup_data_iterators(cfg=cfg, train_state=state.TrainState(), model_length=1,
                                        train_valid_test_datasets_provider=provider, dp_group=pgs.dp)


def _train(cfg, case: dict, iterators) -> dict:
    train, valid, test = iterators
    step = import_bridge_module("megatron.bridge.training.nemotron_omni_step")
    state = types.SimpleNamespace(timers=_Timer(), straggler_timer=_Timer(), cfg=cfg)
    model = tiny_llava(case["omni_model"]) if case.get("forward") else None
    out = {"iterator": type(train).__name__, "iterable": type(train.iterable).__name__,
           "valid": valid is not None, "test": test is not None, "batches": []}
    for k in range(case["batches"]):
        batch = next(train)
        summary = {"keys": sorted(batch), "sample_keys": list(batch["sample_keys"]),
                   "compact_trained": int(batch["loss_mask"].sum()), "telemetry": dict(batch["telemetry"]),
                   "skipped": dict(batch["skipped"]), "total_tokens": int(batch["total_tokens"])}
        if k < case.get("forward", 0):
            with torch.no_grad():
                output, loss_fn = step.forward_step(state, iter([batch]), model)
                _, tokens, _ = loss_fn(output)
            summary["loss_tokens"] = int(tokens)
        out["batches"].append(summary)
    out["saved_state"] = type(train.iterable.save_state()).__name__
    return out


def run_case(case: dict, rank: int) -> dict:
    out = {"name": case["name"], "stage": "validate", "error": None}
    cfg = pgs = None
    try:
        cfg = container(case)
        config.runtime_config_update(cfg)
        if case.get("controls"):
            out.update(_controls(cfg, case))
        out["stage"] = "initialize"
        init = import_bridge_module("megatron.bridge.training.initialize")
        pgs = init._initialize_distributed(model_config=cfg.model, dist_config=cfg.dist,
                                           num_distributed_optimizer_instances=1, get_embedding_ranks=None,
                                           get_position_embedding_ranks=None)
        nmc.init_num_microbatches_calculator(rank, cfg.train.rampup_batch_size, cfg.train.global_batch_size,
                                             cfg.train.micro_batch_size, cfg.data_parallel_size,
                                             cfg.train.decrease_batch_size_if_needed)
        out["ranks"] = {"dp": [pgs.dp.rank(), pgs.dp.size()], "cp": [pgs.cp.rank(), pgs.cp.size()]}
        out["stage"] = "setup"
        iterators = _setup(cfg, pgs)
        out["stage"] = "train"
        out.update(_train(cfg, case, iterators))
        out["stage"] = None
    except Exception as e:                      # the test reads the stage and the message
        import traceback

        out["error"] = f"{type(e).__name__}: {e}"
        out["traceback"] = traceback.format_exc()[-3000:]
    finally:
        nmc.unset_num_microbatches_calculator()
        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()
    return out


def main(cases_path: str, out_dir: str, rank: str, world: str) -> None:
    rank, world = int(rank), int(world)
    torch.Tensor.cuda = lambda self, *args, **kwargs: self     # no GPU: device copies are the identity
    torch.cuda.current_device = lambda: torch.device("cpu")    # and the current device is the CPU
    store = Path(out_dir) / "gloo.store"                      # the rendezvous: a file, no TCP port
    torch.distributed.init_process_group("gloo", init_method=store.resolve().as_uri(), rank=rank, world_size=world)
    results = [run_case(case, rank) for case in json.loads(Path(cases_path).read_text())]
    torch.distributed.destroy_process_group()
    torch.save(results, Path(out_dir) / f"results-{rank}.pt")


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        main(*sys.argv[1:5])
