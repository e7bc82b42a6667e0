"""``NemotronEnergonProvider``: a Megatron-Bridge recipe's ``cfg.dataset`` through Bridge 0.6.2's own setup.

``tests/references/bridge_recipe_run.py`` (one process per rank) builds Bridge's real
``ConfigContainer`` with the provider as ``dataset``, runs ``runtime_config_update`` (the start of
``pretrain``), Bridge's ``_initialize_distributed`` on gloo, then ``get_dataset_provider`` →
``_bind_dataset_provider_context`` → ``setup_data_iterators``, takes batches from the train
iterator and pushes some through ``nemotron_omni_step.forward_step`` into megatron-core's
``LLaVAModel``. The batches are checked against the project's own loader over the same data
(per-sample trained and real token counts), each refusal by the step at which it stops the run
and its message, and the data ranks on two real gloo ranks (CP 2: the same batches; DP 2:
disjoint samples). The in-process tests check the provider without Bridge.
"""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from bridge_data import batches, image_dataset, vocab
from energon_data import loader_yaml
from energon_nemotron.errors import ConfigError
from energon_nemotron.integrations import NemotronEnergonProvider

REPO = Path(__file__).resolve().parents[1]
RUNNER = REPO / "tests" / "references" / "bridge_recipe_run.py"
PACKING = {"algorithm": "best_fit_decreasing", "buffer_size": 8, "pad_multiple": 8, "max_sequences_per_bin": None}
SEQ = 2048
N_SAMPLES = 12


def _yaml(root: Path, name: str, **options) -> str:
    opts = {"preset": "nemotron_omni", "output": "nemotron_omni_step", **options}
    return str(loader_yaml(root / name, {"path": "im"}, packing=PACKING, seq_length=SEQ, prompt_format="nemotron6",
                           extra_options=opts))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("recipe")
    image_dataset(root / "im", n=N_SAMPLES)
    v = vocab()
    model = {"image_token_id": v["<image>"], "sound_token_id": v["<so_embedding>"], "vocab_size": max(v.values()) + 1,
             "temporal_patch_dim": 1, "seq_length": SEQ}
    return types.SimpleNamespace(root=root, model=model, yaml=_yaml(root, "enc.yaml"),
                                 packed=_yaml(root, "packed.yaml", output="packed_batch"),
                                 cp2=_yaml(root, "cp2.yaml", context_parallel_size=2))


def _case(name: str, loader_config: str, *, mbs: int = 1, gbs: int = 1, cp: int = 1, seq: int = SEQ, **provider):
    return {"name": name, "model": {"seq_length": seq, "context_parallel_size": cp},
            "train": {"micro_batch_size": mbs, "global_batch_size": gbs},
            "provider": {"loader_config": loader_config, "seq_length": seq, "packing_buffer_size": 8,
                         "num_workers": 0, "shuffle_buffer_size": 8, **provider}, "batches": 0}


def run_bridge(cases: list, folder: Path, world: int = 1) -> list[dict]:
    """Per rank: name -> what ``bridge_recipe_run.py`` reported for that case."""
    (folder / "cases.json").write_text(json.dumps(cases))
    procs = [subprocess.Popen([sys.executable, str(RUNNER), str(folder / "cases.json"), str(folder), str(rank),
                               str(world)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in range(world)]
    errors = []
    for rank, proc in enumerate(procs):
        _, err = proc.communicate(timeout=600)
        if proc.returncode:
            errors.append(f"rank {rank}:\n{err[-4000:]}")
    if errors:
        pytest.fail("the Bridge setup run failed:\n" + "\n".join(errors), pytrace=False)
    return [{r["name"]: r for r in torch.load(folder / f"results-{rank}.pt", weights_only=False)}
            for rank in range(world)]


@pytest.fixture(scope="module")
def one_rank(data, tmp_path_factory):
    """The training case and the refusals, on one rank."""
    train = _case("train", data.yaml, num_workers=2)
    train.update(batches=6, forward=3, omni_model=data.model, controls=True)
    cases = [train,
             _case("output-packed_batch", data.packed),
             _case("seq-length", data.yaml, seq=4096),
             _case("no-packing-buffer", data.yaml, packing_buffer_size=None),
             _case("other-packing-buffer", data.yaml, packing_buffer_size=16),
             _case("provider-micro-batch", data.yaml, mbs=2, gbs=2, micro_batch_size=2),
             _case("train-micro-batch", data.yaml, mbs=2, gbs=2),
             _case("dataloader-type", data.yaml, dataloader_type="cyclic")]
    return run_bridge(cases, tmp_path_factory.mktemp("one_rank"))[0]


def per_sample(cfg: str) -> dict:
    """key -> (trained tokens, real tokens) of every sample, from the project's own loader."""
    out = {}
    for batch in batches(cfg, 100):
        for row, keys in enumerate(batch.sample_keys):
            cu, at = batch.cu_seqlens[row].tolist(), batch.cu_seqlens_padded[row].tolist()
            for i, key in enumerate(keys):        # segment i: its real tokens from the padded start
                length = cu[i + 1] - cu[i]
                out[key] = (int(batch.loss_mask[row][at[i]:at[i] + length].sum()), length)
    return out


def test_bridge_takes_the_provider(one_rank):
    r = one_rank["train"]
    assert r["stage"] is None and r["error"] is None, r.get("traceback")
    assert r["is_dataset_provider"]                             # what get_dataset_provider accepts
    assert r["serialized"]["_target_"] == "energon_nemotron.integrations.bridge_recipe.NemotronEnergonProvider"
    assert r["serialized"]["seq_length"] == SEQ and r["serialized"]["dataloader_type"] == "external"
    # the issue: Bridge's declarative Energon config refuses this library's encoder
    assert r["energon_dataset_config"].startswith("TypeError: task_encoder must be a supported declarative")
    # Bridge passes the data module's loader through ("external"): its state is what Bridge checkpoints
    assert (r["iterator"], r["iterable"], r["saved_state"]) == ("RerunDataIterator", "EnergonDataloader",
                                                                "SavableDataLoaderState")
    assert not r["valid"] and not r["test"]                     # eval_iters 0: none built
    assert r["ranks"] == {"dp": [0, 1], "cp": [0, 1]}


def test_batches_are_the_projects(one_rank, data):
    """Every batch's samples, trained tokens (the loss's count after forward_step) and real tokens
    are what the project's loader gives for the same samples."""
    want = per_sample(data.packed)
    assert len(want) == N_SAMPLES
    got = one_rank["train"]["batches"]
    assert len(got) == 6 and sum("loss_tokens" in b for b in got) == 3
    for b in got:
        keys = b["sample_keys"]
        assert keys and set(keys) <= set(want), keys
        trained = sum(want[k][0] for k in keys)
        assert b["compact_trained"] == trained > 0
        assert b.get("loss_tokens", trained) == trained
        assert b["telemetry"]["tokens"] == sum(want[k][1] for k in keys) and b["telemetry"]["samples"] == len(keys)
        assert b["total_tokens"] == SEQ and not b["skipped"]
        assert {"tokens", "labels", "loss_mask", "position_ids", "cu_seqlens_q", "cu_seqlens_q_padded"} <= set(b["keys"])


@pytest.mark.parametrize("name, stage, message", [
    ("output-packed_batch", "validate", "task_encoder.options.output 'packed_batch'"),
    ("seq-length", "validate", "NemotronEnergonProvider.seq_length 4096 (the recipe's) but task_encoder.options."
                               "seq_length is 2048"),
    ("no-packing-buffer", "validate", "every row would hold one sample"),
    ("other-packing-buffer", "validate", "the packer would see other buffers"),
    ("provider-micro-batch", "validate", "NemotronEnergonProvider.micro_batch_size 2"),
    ("train-micro-batch", "setup", "train.micro_batch_size is 2 but NemotronEnergonProvider.micro_batch_size is 1"),
    ("dataloader-type", "validate", "NemotronEnergonProvider.dataloader_type 'cyclic'"),
])
def test_refused_at_start(one_rank, name, stage, message):
    """Refused by ``ConfigContainer.validate()`` (the provider's ``finalize``), before the process
    groups and the model; the train micro-batch size, which the provider first sees in megatron-core's
    micro-batch calculator, when setup builds the data (before any sample is read)."""
    r = one_rank[name]
    assert r["stage"] == stage and r["error"].startswith("ConfigError: "), r
    assert message in r["error"], r["error"]


@pytest.fixture(scope="module")
def two_ranks(data, tmp_path_factory):
    cp2 = _case("cp2", data.cp2, cp=2)
    dp2 = _case("dp2", data.yaml, gbs=2)
    cp2["batches"] = dp2["batches"] = 4
    return run_bridge([cp2, dp2, _case("cp-mismatch", data.yaml, cp=2)], tmp_path_factory.mktemp("two_ranks"),
                      world=2)


def test_context_parallel_ranks_read_the_same_batches(two_ranks):
    r0, r1 = (r["cp2"] for r in two_ranks)
    assert r0["stage"] is r1["stage"] is None, (r0.get("traceback"), r1.get("traceback"))
    assert r0["ranks"] == {"dp": [0, 1], "cp": [0, 2]} and r1["ranks"] == {"dp": [0, 1], "cp": [1, 2]}
    assert [b["sample_keys"] for b in r0["batches"]] == [b["sample_keys"] for b in r1["batches"]]
    assert all(b["total_tokens"] == SEQ for b in r0["batches"])


def test_data_parallel_ranks_read_their_own_samples(two_ranks):
    r0, r1 = (r["dp2"] for r in two_ranks)
    assert r0["stage"] is r1["stage"] is None, (r0.get("traceback"), r1.get("traceback"))
    assert r0["ranks"]["dp"] == [0, 2] and r1["ranks"]["dp"] == [1, 2]
    k0, k1 = ({k for b in r["batches"] for k in b["sample_keys"]} for r in (r0, r1))
    assert k0 and k1 and not k0 & k1


def test_context_parallel_size_must_be_the_runs(two_ranks):
    for r in (ranks["cp-mismatch"] for ranks in two_ranks):
        assert r["stage"] == "setup" and r["error"].startswith("ConfigError: "), r
        assert "the run's context-parallel size is 2 but task_encoder.options.context_parallel_size is 1" in r["error"]


# -- without Bridge ---------------------------------------------------------------------------------
def test_validate_without_bridge(data):
    p = NemotronEnergonProvider(loader_config=data.yaml, seq_length=SEQ, packing_buffer_size=8, num_workers=0)
    p.finalize()
    assert p.persistent_workers is False                        # Bridge's DataloaderConfig.finalize rule
    assert p._dataset_path(p._config()) == str(data.root / "im")
    with pytest.raises(ConfigError, match="packing_buffer_size=8"):
        NemotronEnergonProvider(loader_config=data.yaml, seq_length=SEQ).validate()
    with pytest.raises(ConfigError, match="loader_config must be a YAML path or a dict"):
        NemotronEnergonProvider(loader_config=3, seq_length=SEQ).validate()


def _group(size: int):
    return types.SimpleNamespace(size=lambda: size, rank=lambda: 0)


@pytest.mark.parametrize("pgs, message", [
    (dict(dp=_group(1), cp=_group(1), tp=_group(1), pp=_group(3)), "pipeline_model_parallel_size 3"),
    (dict(dp=_group(2), cp=_group(4), tp=_group(1), pp=_group(1)), "context-parallel size is 4"),
])
def test_run_checks(data, pgs, message):
    p = NemotronEnergonProvider(loader_config=data.yaml, seq_length=SEQ, packing_buffer_size=8)
    context = types.SimpleNamespace(pg_collection=types.SimpleNamespace(**pgs), train_samples=1, valid_samples=0)
    with pytest.raises(ConfigError, match=message):
        p._check_run(context, p.validate())


def test_importing_it_imports_neither_bridge_nor_megatron_core():
    code = ("import sys, energon_nemotron.integrations.bridge_recipe; "
            "print(sorted(m for m in sys.modules if m.startswith(('megatron.bridge', 'megatron.core'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]", out.stdout
