"""Real megatron-core under a real gloo process group (several local processes).

- ``get_batch_on_this_cp_rank`` (megatron-core's bshd CP split) equals our partition of a single
  segment;
- megatron-core's packed ``roll_tensor`` on each CP rank's shard (with its neighbour exchange)
  equals our global MTP roll followed by the per-document partition, on the Megatron-LM fixtures.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from conftest import FIXTURE_TOKENIZER, fixture_rows, free_port

pytestmark = pytest.mark.slow


def _worker(rank: int, world: int, port: int, fmt: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        from megatron.core.transformer.multi_token_prediction import roll_tensor
        from megatron.core.utils import get_batch_on_this_cp_rank

        from energon_nemotron.megatron_packed import MegatronSFTPackedEncoder
        from energon_nemotron.parallel import partition_indices, roll_targets, slice_for_cp_rank, to_packed_seq_params

        group = dist.group.WORLD
        total = 96
        batch = {"tokens": torch.arange(total).unsqueeze(0) * 7, "labels": torch.arange(total).unsqueeze(0)}
        theirs = get_batch_on_this_cp_rank(dict(batch), cp_group=group)
        ours = slice_for_cp_rank(batch, [0, total], world, rank)
        for key in batch:
            assert torch.equal(theirs[key], ours[key]), key

        enc = MegatronSFTPackedEncoder(FIXTURE_TOKENIZER, 96, fmt, context_parallel_size=world,
                                       allow_eos_pad=fmt == "default")
        for row in fixture_rows():
            out = enc.encode(row)
            cu = out["cu_seqlens"]
            params = to_packed_seq_params(cu, out["max_seqlen"])
            local = slice_for_cp_rank({"labels": out["labels"], "loss_mask": out["loss_mask"]}, cu, world, rank)
            lab, msk = local["labels"].unsqueeze(0), local["loss_mask"].unsqueeze(0)
            for depth in (1, 2):
                lab, _ = roll_tensor(lab, shifts=-1, dims=-1, cp_group=group, packed_seq_params=params)
                msk, _ = roll_tensor(msk, shifts=-1, dims=-1, cp_group=group, packed_seq_params=params)
                want_l, want_m = roll_targets(out["labels"], out["loss_mask"], cu, depth)
                index = partition_indices(cu, world, rank)
                assert torch.equal(lab[0], want_l[index]), (rank, depth)
                assert torch.equal(msk[0], want_m[index]), (rank, depth)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world, fmt", [(2, "identity"), (4, "nemotron-h-aligned")])
def test_megatron_core_cp_split_and_packed_roll_match(world, fmt):
    mp.spawn(_worker, args=(world, free_port(), fmt), nprocs=world, join=True)
