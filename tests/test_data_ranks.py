"""Under model parallelism the TP/CP ranks of one replica must read the same data: a loader whose
WorkerConfig has a data rank per process (Megatron-Bridge's data module without ``pg_collection``)
is refused at start (issue 28, item 5). Two real gloo processes, as two CP ranks of one replica."""

from __future__ import annotations

import json
import os

import torch.multiprocessing as mp

from energon_data import loader_yaml, text_dataset
from conftest import free_port


def _rank(rank: int, world: int, port: int, folder: str) -> None:
    import torch.distributed as dist
    from megatron.energon import WorkerConfig, get_train_dataset

    from energon_nemotron.errors import ConfigError
    from energon_nemotron.loading import build_task_encoder

    os.environ["OMP_NUM_THREADS"] = "1"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    out = {}
    try:
        for name, wc in (("per_process", WorkerConfig(rank=rank, world_size=world, num_workers=0)),
                         ("pure_dp", WorkerConfig(rank=0, world_size=1, num_workers=0))):
            try:
                get_train_dataset(os.path.join(folder, "t"), worker_config=wc, batch_size=1, shuffle_buffer_size=None,
                                  max_samples_per_sequence=None, packing_buffer_size=8,
                                  task_encoder=build_task_encoder(os.path.join(folder, "c.yaml")))
                out[name] = "ok"
            except ConfigError as e:
                out[name] = str(e)
    finally:
        dist.destroy_process_group()
    with open(os.path.join(folder, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)


def test_cp_ranks_reading_as_separate_data_ranks_are_refused(tmp_path):
    text_dataset(tmp_path / "t", "general_conversations", 12)
    loader_yaml(tmp_path / "c.yaml", {"path": str(tmp_path / "t")}, seq_length=4096,
                packing={"algorithm": "first_fit_decreasing", "buffer_size": 8},
                extra_options={"context_parallel_size": 2})
    mp.spawn(_rank, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got["pure_dp"] == "ok"
        assert got["per_process"].startswith("the loader reads with a data rank per process (WorkerConfig "
                                              "world_size 2, every process) under tensor_parallel_size 1 x "
                                              "context_parallel_size 2: the TP/CP ranks of one replica would read "
                                              "different batches"), got["per_process"]
        assert "pg_collection=ProcessGroupCollection.use_mpu_process_groups()" in got["per_process"]
