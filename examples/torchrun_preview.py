"""What every rank receives, under data, tensor and context parallelism (CPU, gloo).

    torchrun --nproc-per-node 4 examples/torchrun_preview.py LOADER.yaml --tp 2 --cp 2 [--batches 1]

World = DP × CP × TP processes, laid out as Megatron does (TP fastest, then CP, then DP). The
TP-rank-0 of each (DP, CP) position reads its DP rank's batches from the loader config; the batch
is broadcast to its tensor-parallel peers (``broadcast_packed_batch``); every rank then keeps its
context-parallel shard of each row (``slice_for_cp_rank``: per-document zig-zag; boundaries stay
global). CP ranks of one DP rank see the same batch, so every CP rank reads it here (or a real
setup would broadcast over the CP group too). Each rank prints one JSON line per batch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import zlib

import torch
import torch.distributed as dist


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--cp", type=int, default=1)
    ap.add_argument("--batches", type=int, default=1)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    tp, cp = args.tp, args.cp
    if world % (tp * cp):
        raise SystemExit(f"world size {world} is not a multiple of tp*cp = {tp * cp}")
    dp = world // (tp * cp)
    tp_rank, cp_rank, dp_rank = rank % tp, (rank // tp) % cp, rank // (tp * cp)

    # one tensor-parallel group per (dp, cp) position; every rank creates every group, in order
    tp_group = None
    for start in range(0, world, tp):
        ranks = list(range(start, start + tp))
        group = dist.new_group(ranks)
        if rank in ranks:
            tp_group = group

    from energon_nemotron.loading import build_train_loader
    from energon_nemotron.parallel import partition_indices, slice_for_cp_rank
    from energon_nemotron.parallel import broadcast_packed_batch

    loader = iter(build_train_loader(args.config, dp_rank=dp_rank, dp_size=dp)) if tp_rank == 0 else None
    src = rank - tp_rank
    for step in range(args.batches):
        batch = next(loader) if loader is not None else None
        batch = broadcast_packed_batch(batch, src=src, group=tp_group)
        local = slice_for_cp_rank(batch, None, cp, cp_rank) if cp > 1 else batch
        index = partition_indices(batch.cu_seqlens_padded[0], cp, cp_rank)
        # one write() of a short line (< 4 KiB, PIPE_BUF) so that the ranks' lines never interleave on a
        # shared pipe, even unbuffered (PYTHONUNBUFFERED makes print() write the text and its newline apart)
        keys = [k for row in batch.sample_keys for k in row]
        line = json.dumps({
            "rank": rank, "dp_rank": dp_rank, "cp_rank": cp_rank, "tp_rank": tp_rank, "step": step,
            "samples": len(keys), "first_key": keys[0] if keys else None,
            "keys_checksum": zlib.crc32("\0".join(keys).encode()),
            "segments": len(batch.cu_seqlens_padded[0]) - 1,
            "boundaries_checksum": zlib.crc32(batch.cu_seqlens_padded[0].numpy().tobytes()),
            "global_tokens": batch.seq_length, "local_tokens": local.seq_length,
            "local_index_head": index[:4].tolist(), "local_tokens_checksum": int(local.tokens.sum()),
            "trained_labels_local": int(local.loss_mask.sum()),
        })
        os.write(sys.stdout.fileno(), (line + "\n").encode())
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    sys.exit(main())
