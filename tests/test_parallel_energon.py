"""Parallelism on the Energon path: CP padding and slicing, MTP targets, DP sharding, validation
evening, determinism, and the torchrun example (real processes over gloo)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from conftest import REPO, free_port
from energon_data import loader_yaml, text_dataset
from energon_nemotron.loading import build_train_loader, build_val_loader
from energon_nemotron.parallel import mtp_targets, packed_seq_params, partition_indices, roll_targets, slice_for_cp_rank
from energon_nemotron.inspection import run_preview
from energon_nemotron.inspection.preview import PreviewOptions

PACKING = {"algorithm": "best_fit_decreasing", "buffer_size": 8, "pad_multiple": 1, "max_sequences_per_bin": None}


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("par")
    _, keys = text_dataset(root / "ds", "openai_messages", n=26, per_shard=3)
    return root, keys


def cfg(root, name, **options):
    return loader_yaml(root / name, {"path": "ds"}, packing=PACKING, seq_length=1024,
                       prompt_format="nemotron6", extra_options=options)


def keys_of(batches):
    return [k for b in batches for row, pad in zip(b.sample_keys, b.is_padding) if not pad for k in row]


@pytest.mark.parametrize("cp, tp, sp, multiple", [(2, 1, False, 4), (4, 1, False, 8), (2, 2, True, 8), (1, 4, True, 4)])
def test_sources_padded_for_context_parallelism(ds, cp, tp, sp, multiple):
    root, keys = ds
    c = cfg(root, f"cp{cp}{tp}{sp}.yaml", context_parallel_size=cp, tensor_parallel_size=tp, sequence_parallel=sp)
    batches = list(build_train_loader(c, repeat=False))
    assert sorted(keys_of(batches)) == sorted(keys)
    for b in batches:
        b.validate()
        for padded in b.cu_seqlens_padded:
            assert all(int(x) % multiple == 0 for x in padded), padded
        if cp > 1:
            shards = [slice_for_cp_rank(b, None, cp, r) for r in range(cp)]
            for r, shard in enumerate(shards):
                assert shard.tokens.shape == (b.batch_size, b.seq_length // cp)
                index = partition_indices(b.cu_seqlens_padded[0], cp, r)
                assert torch.equal(shard.tokens[0], b.tokens[0, index])
                assert torch.equal(shard.loss_mask[0], b.loss_mask[0, index])
            assert sum(int(s.loss_mask.sum()) for s in shards) == int(b.loss_mask.sum())


def test_cp_requires_aligned_seq_length(ds):
    from energon_nemotron.errors import ConfigError
    from energon_nemotron.loading import build_task_encoder

    root, _ = ds
    bad = loader_yaml(root / "bad.yaml", {"path": "ds"}, packing=PACKING, seq_length=1020,
                      extra_options={"context_parallel_size": 4})
    with pytest.raises(ConfigError, match=r"seq_length 1020 is not a multiple of 8"):
        build_task_encoder(bad)


def test_mtp_targets_stay_inside_segments(ds):
    root, _ = ds
    c = cfg(root, "mtp.yaml", mtp_num_layers=2, context_parallel_size=2)
    for b in build_train_loader(c, repeat=False):
        for depth in (1, 2):
            labels, mask = mtp_targets(b, depth)
            for i in range(b.batch_size):
                padded = b.cu_seqlens_padded[i].tolist()
                seg = torch.bucketize(torch.arange(b.seq_length), torch.tensor(padded[1:]), right=True)
                trained = mask[i].nonzero().flatten()
                assert torch.equal(seg[trained], seg[trained + depth])          # same segment
                assert torch.equal(labels[i, trained], b.labels[i, trained + depth])
                want_l, want_m = roll_targets(b.labels[i], b.loss_mask[i], padded, depth)
                assert torch.equal(labels[i], want_l) and torch.equal(mask[i], want_m)
        with pytest.raises(ValueError, match="MTP depth must be in 1..2"):
            mtp_targets(b, 3)


def test_mtp_equals_megatron_core_roll_over_padded_boundaries(ds):
    from megatron.core.transformer.multi_token_prediction import roll_tensor

    from energon_nemotron.parallel import to_packed_seq_params

    root, _ = ds
    b = next(iter(build_train_loader(cfg(root, "mtp2.yaml", mtp_num_layers=1, context_parallel_size=2), repeat=False)))
    # Megatron-LM's SFT forward passes the padded boundaries as cu_seqlens_q when there are any
    params = to_packed_seq_params(b.cu_seqlens_padded[0], b.max_seqlen[0])
    rolled, _ = roll_tensor(b.labels[:1], shifts=-1, dims=-1, packed_seq_params=params)
    rolled_mask, _ = roll_tensor(b.loss_mask[:1], shifts=-1, dims=-1, packed_seq_params=params)
    labels, mask = mtp_targets(b, 1)
    assert torch.equal(labels[0], rolled[0]) and torch.equal(mask[0], rolled_mask[0])


def _mtp_violations(b, params, depth: int) -> int:
    """Trained MTP targets of megatron-core's own roll (depth times over ``params``) that sit on a
    pad or come from another segment."""
    from megatron.core.transformer.multi_token_prediction import roll_tensor

    labels, mask = b.labels[:1], b.loss_mask[:1]
    for _ in range(depth):
        labels, _ = roll_tensor(labels, shifts=-1, dims=-1, packed_seq_params=params)
        mask, _ = roll_tensor(mask, shifts=-1, dims=-1, packed_seq_params=params)
    padded, real = b.cu_seqlens_padded[0].to(torch.int64), b.cu_seqlens[0].to(torch.int64)
    positions = torch.arange(b.seq_length)
    seg = torch.bucketize(positions, padded[1:], right=True)
    # cu_seqlens are cumulative real lengths (TE's logical offsets): segment i's real tokens are
    # padded[i] .. padded[i] + (real[i+1] - real[i])
    is_pad = positions >= (padded[:-1] + real[1:] - real[:-1])[seg]
    trained = mask[0].nonzero().flatten()
    target = trained + depth
    bad = is_pad[trained] | (target >= b.seq_length)
    ok = ~bad
    bad[ok] |= (seg[trained[ok]] != seg[target[ok]]) | (labels[0][trained[ok]] != b.labels[0][target[ok]])
    return int(bad.sum())


def test_packed_seq_params_helper_is_safe_for_megatron_core_mtp(ds):
    """``PackedBatch.packed_seq_params`` with padding (CP 2): megatron-core's MTP roll over the
    helper's params never puts a trained target on a pad or across segments; over the real
    lengths (``exact_lengths=True``, what the helper gave before) it does."""
    root, _ = ds
    unsafe = 0
    for b in build_train_loader(cfg(root, "mtp3.yaml", mtp_num_layers=2, context_parallel_size=2), repeat=False):
        assert not torch.equal(b.cu_seqlens[0], b.cu_seqlens_padded[0])
        for depth in (1, 2):
            assert _mtp_violations(b, packed_seq_params(b, 0), depth) == 0
            unsafe += _mtp_violations(b, packed_seq_params(b, 0, exact_lengths=True), depth)
    assert unsafe > 0


@pytest.mark.parametrize("dp_size", [2, 3])
def test_train_ranks_read_disjoint_parts(ds, dp_size):
    root, keys = ds
    c = cfg(root, f"dp{dp_size}.yaml")
    parts = [keys_of(build_train_loader(c, repeat=False, dp_rank=r, dp_size=dp_size)) for r in range(dp_size)]
    assert sorted(k for p in parts for k in p) == sorted(keys)
    assert all(p for p in parts)


@pytest.mark.parametrize("dp_size", [1, 2, 3, 4])
def test_validation_every_sample_once_and_ranks_even(ds, dp_size, capsys):
    root, keys = ds
    c = loader_yaml(root / f"val{dp_size}.yaml", {"path": "ds"}, packing=PACKING, seq_length=1024,
                    prompt_format="nemotron6")
    raw = json.loads(json.dumps(__import__("yaml").safe_load(c.read_text())))
    raw["data"]["validation"] = {"path": "ds", "split": "train"}
    c.write_text(json.dumps(raw))
    counts, seen = [], []
    for r in range(dp_size):
        view = PreviewOptions(split="validation", dp_rank=r, dp_size=dp_size)
        assert run_preview(str(c), as_json=True, options=view) == 0
        lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
        batches, summary = lines[:-1], lines[-1]["summary"]
        counts.append(len(batches))
        for b in batches:
            for row, pad, mask in zip(b["sample_keys"], b["is_padding"], b["loss_mask"]):
                if pad:
                    assert not any(mask)
                else:
                    seen += row
        assert summary["split"] == "validation" and summary["dp_rank"] == r
    assert len(set(counts)) == 1, counts
    assert sorted(seen) == sorted(keys)


def test_same_seed_same_stream(ds):
    root, _ = ds

    def stream(name, seed):
        c = loader_yaml(root / name, {"path": "ds"}, packing=PACKING, seq_length=1024)
        raw = __import__("yaml").safe_load(c.read_text())
        raw["loader"]["seed"] = seed
        raw["loader"]["shuffle_buffer_size"] = 20
        c.write_text(json.dumps(raw))
        return [(b.sample_keys, b.tokens) for b in build_train_loader(c, repeat=False)]

    a, b, other = stream("s1.yaml", 5), stream("s2.yaml", 5), stream("s3.yaml", 6)
    assert [k for k, _ in a] == [k for k, _ in b] and all(torch.equal(x, y) for (_, x), (_, y) in zip(a, b))
    assert [k for k, _ in a] != [k for k, _ in other]


@pytest.mark.slow
@pytest.mark.parametrize("tp, cp", [(2, 1), (1, 2)])
def test_torchrun_example(ds, tp, cp):
    root, _ = ds
    c = cfg(root, f"run{tp}{cp}.yaml", context_parallel_size=cp)
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                          "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                          str(REPO / "examples" / "torchrun_preview.py"), str(c), "--tp", str(tp), "--cp", str(cp)],
                         capture_output=True, text=True, timeout=300, env={**__import__("os").environ,
                                                                            "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    lines = sorted((json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")), key=lambda d: d["rank"])
    assert [d["rank"] for d in lines] == [0, 1]
    a, b = lines
    assert a["keys_checksum"] == b["keys_checksum"] and a["boundaries_checksum"] == b["boundaries_checksum"]
    assert a["samples"] > 0
    if tp == 2:       # tensor-parallel peers hold the identical batch
        assert a["local_tokens_checksum"] == b["local_tokens_checksum"] and a["local_tokens"] == 1024
    else:             # context-parallel ranks hold complementary halves
        assert a["local_tokens"] == b["local_tokens"] == 512 and a["local_index_head"] != b["local_index_head"]


def _bshd_worker(rank: int, world: int, port: int, batch_tensors: dict, expected: list) -> None:
    import os

    import torch.distributed as dist

    os.environ["OMP_NUM_THREADS"] = "1"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        from megatron.core.utils import get_batch_on_this_cp_rank

        theirs = get_batch_on_this_cp_rank(dict(batch_tensors), cp_group=dist.group.WORLD)
        for key, value in expected[rank].items():
            assert torch.equal(theirs[key], value), (rank, key)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_unpacked_rows_match_megatron_core_bshd_cp_split(ds):
    """Without packing a row is one sequence: our THD slice equals megatron-core's bshd CP split."""
    import torch.multiprocessing as mp

    root, _ = ds
    c = loader_yaml(root / "bshd.yaml", {"path": "ds"}, packing=None, seq_length=1024, prompt_format="nemotron6",
                    extra_options={"context_parallel_size": 2})
    batch = next(iter(build_train_loader(c, repeat=False)))
    assert [len(p) for p in batch.cu_seqlens_padded] == [2]          # one segment (+ its tail padding)
    tensors = {k: getattr(batch, k) for k in ("tokens", "labels", "loss_mask", "position_ids")}
    expected = [{k: getattr(slice_for_cp_rank(batch, None, 2, r), k) for k in tensors} for r in range(2)]
    mp.spawn(_bshd_worker, args=(2, free_port(), tensors, expected), nprocs=2, join=True)
