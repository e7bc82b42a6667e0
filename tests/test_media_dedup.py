"""Media sent once: provenance keys of the media handlers, deduplicated ``pixel_values`` /
``sound_features`` built by the real Energon loader (one image file named by several samples and
twice in one conversation, a video named twice whose last tubelet repeats a frame, an audio named
twice), and a 2-process gloo broadcast that sends the distinct bytes once (counted)."""

from __future__ import annotations

import json
import os
import pickle

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from energon_data import energon, loader_yaml
from test_broadcast import join_gloo
from energon_nemotron.demo.media import make_audio, make_image, make_video
from energon_nemotron.loading import build_train_loader
from energon_nemotron.media.handlers import payload_digest, provenance_key
from energon_nemotron.media import plan_image
from energon_nemotron.tensors import PackedTensor
from energon_nemotron.media.video import VideoOptions, VideoPlan, plan_video, video_metadata
from energon_nemotron.media.video_frames import process_video, process_video_frames
from energon_nemotron.parallel.broadcast import (BroadcastStats, _plan, batches_equal, broadcast_packed_batch,
                                                 packed_batch_to_wire)
from conftest import free_port

ROW_BYTES = 768 * 4                       # one float32 patch row of pixel_values
VIDEO = {"target_patches": 64, "num_frames": 3, "min_frames": 1, "max_frames": 4, "temporal_patch": 2}
OPTIONS = {"image": {"min_patches": 64, "max_patches": 256}, "video": VIDEO}
PACKING = {"algorithm": "best_fit_decreasing", "buffer_size": 16, "pad_multiple": 4, "max_sequences_per_bin": None}


# -- provenance keys ------------------------------------------------------------------------------
def test_keys_follow_the_bytes_and_the_plan(tmp_path):
    data = make_image(64, 48, seed=1)
    (tmp_path / "a.jpg").write_bytes(data)
    small, large = plan_image(64, 48), plan_image(640, 480)
    digest = payload_digest(data)
    assert payload_digest(tmp_path / "a.jpg") == payload_digest(str(tmp_path / "a.jpg")) == digest  # content, not name
    assert payload_digest(make_image(64, 48, seed=2)) != digest
    key = provenance_key("image", digest, small)
    assert key == provenance_key("image", payload_digest(tmp_path / "a.jpg"), plan_image(64, 48))
    assert key != provenance_key("image", digest, large)                     # same image, other plan
    assert key != provenance_key("video", digest, small)
    assert key != provenance_key("image", digest, small, VideoOptions())     # options that shape it count


def test_video_frames_name_their_repeats():
    """Per logical frame, the distinct decoded frame it shows: the last tubelet's padding and a
    source frame chosen twice repeat one; the rows agree with ``process_video``."""
    data = make_video(64, 48, seconds=1.0, fps=8)
    options = VideoOptions(**VIDEO)
    plan = plan_video(video_metadata(data), options)
    rows, frames = process_video_frames(data, plan, options)
    assert plan.num_frames == 3 and frames == (0, 1, 2, 2)                  # padded last tubelet
    assert torch.equal(rows, process_video(data, plan, options))
    twice = VideoPlan(**{**plan.__dict__, "frame_indices": (0, 0, 5, 5, 2), "frame_times": (0.0,) * 5})
    rows, frames = process_video_frames(data, twice, options)
    assert frames == (0, 0, 1, 1, 2, 2)
    per = plan.grid_h * plan.grid_w
    for f, src in enumerate(frames):
        first = frames.index(src)
        assert torch.equal(rows[f * per:(f + 1) * per], rows[first * per:(first + 1) * per])
    assert not torch.equal(rows[:per], rows[2 * per:3 * per])


# -- through the real loader ------------------------------------------------------------------------
def chat(question: str, **media) -> dict:
    return {"conversations": [{"from": "human", "value": question}, {"from": "gpt", "value": "Fine."}], **media}


def config(folder, path, workers: int = 0):
    return loader_yaml(folder / f"loader{workers}.yaml", {"path": str(path)}, packing=PACKING, seq_length=4096,
                       prompt_format="nemotron6", extra_options=OPTIONS, default_cooker="general_conversations",
                       workers=workers)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A prepared JSONL dataset: ``pics/cat.jpg`` named by three samples and twice by a fourth,
    ``clips/v.mp4`` (3 frames, so its second tubelet repeats the third) by two samples, and
    ``sounds/s.wav`` by two; one batch of the loader holds them all. (folder, path, n samples)"""
    root = tmp_path_factory.mktemp("dedup")
    for name, data in (("pics/cat.jpg", make_image(96, 64, seed=3)), ("clips/v.mp4", make_video(64, 48, 1.0, fps=8)),
                       ("sounds/s.wav", make_audio(1.0, 16000, 1, seed=4))):
        (root / "ds" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "ds" / name).write_bytes(data)
    lines = [chat("<image> What is it?", image="pics/cat.jpg"), chat("<image> Which colour?", image="pics/cat.jpg"),
             chat("<image> How big?", image="pics/cat.jpg"),
             chat("Compare <image> with <image>.", images=["pics/cat.jpg", "pics/cat.jpg"]),
             chat("<video> What happens?", video="clips/v.mp4"), chat("<video> Again?", video="clips/v.mp4"),
             chat("<audio> What is it?", audio="sounds/s.wav"), chat("<audio> Loud?", audio="sounds/s.wav")]
    path = root / "ds" / "data.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    energon("prepare", str(path))
    return root, path, len(lines)


@pytest.fixture(scope="module")
def shared_media(dataset):
    root, path, n = dataset
    batches = list(build_train_loader(config(root, path), repeat=False))
    assert len(batches) == 1 and len(batches[0].sample_keys[0]) == n
    return batches[0]


def test_loader_stores_each_media_segment_once(shared_media):
    batch = shared_media
    batch.validate()
    pv, sound = batch.media["pixel_values"], batch.media["sound_features"]
    assert pv.is_deduplicated and sound.is_deduplicated and not batch.media["image_sizes"].is_deduplicated
    kinds = [s.kind for row in batch.media_spans for s in row if s.kind != "audio"]
    images = [pv[k] for k, kind in enumerate(kinds) if kind == "image"]
    videos = [pv[k] for k, kind in enumerate(kinds) if kind == "video"]
    assert len(images) == 5 and len(videos) == 2 and len(sound) == 2
    assert all(torch.equal(i, images[0]) for i in images) and torch.equal(videos[0], videos[1])
    per = videos[0].shape[0] // 4                                     # 4 logical frames, rows each
    assert torch.equal(videos[0][3 * per:], videos[0][2 * per:3 * per])  # padding repeats frame 3
    image_bytes, frame_bytes = images[0].shape[0] * ROW_BYTES, per * ROW_BYTES
    # stored: one image, 3 distinct frames; logical: 5 images, 2 x 4 frames
    assert pv.physical_nbytes == image_bytes + 3 * frame_bytes
    assert pv.logical_nbytes == 5 * image_bytes + 8 * frame_bytes
    assert pv.num_segments == 4 and len(pv.segment_ids) == 5 + 8
    assert sound.logical_nbytes == 2 * sound.physical_nbytes
    # the logical view is what the plain layout held: every item, the concatenation, the consumer's path
    plain = PackedTensor.from_list(list(pv))
    assert pv.equal(plain) and torch.equal(pv.as_tensor(), plain.as_tensor())
    assert torch.equal(torch.cat([pv[k] for k in range(len(pv))]), plain.data)


def test_loader_workers_pass_the_store_through_shared_memory(dataset, shared_media):
    """With a DataLoader worker the batch crosses processes by pickling: the same items, still
    deduplicated (the store, not the logical data, is what travels)."""
    root, path, _ = dataset
    (got,) = list(build_train_loader(config(root, path, workers=1), repeat=False))
    for name in ("pixel_values", "sound_features"):
        assert got.media[name].is_deduplicated and got.media[name].same_structure(shared_media.media[name])
        assert got.media[name].equal(shared_media.media[name]) and got.media[name].store.is_shared()
        assert got.media[name]._logical is None                    # nothing materialized on the way


# -- the TP broadcast ----------------------------------------------------------------------------------
def _plain(batch):
    """The batch with its media in the plain layout (every use stored and sent)."""
    return batch.replace(media=batch.media.map(
        lambda v: PackedTensor.from_list(list(v), feature_shape=v.feature_shape, dtype=v.dtype)
        if isinstance(v, PackedTensor) else v))


def _broadcast_worker(rank: int, port: int, folder: str) -> None:
    join_gloo(rank, port)
    try:
        with open(os.path.join(folder, "batch.pkl"), "rb") as f:
            batch = pickle.load(f)
        counted = {}
        for name, sent in (("dedup", batch), ("plain", _plain(batch))):
            stats = BroadcastStats()
            got = broadcast_packed_batch(sent if rank == 0 else None, 0, max_chunk_bytes=1 << 16, stats=stats)
            assert batches_equal(got, sent), (rank, name)
            if name == "dedup" and rank == 1:
                pv = got.media["pixel_values"]
                assert pv.is_deduplicated and pv.keys == batch.media["pixel_values"].keys
                assert pv.equal(batch.media["pixel_values"]) and pv.physical_nbytes < pv.logical_nbytes
            counted[name] = [stats.header_bytes, stats.payload_bytes]
        with open(os.path.join(folder, f"stats.{rank}.json"), "w") as f:
            json.dump(counted, f)
    finally:
        dist.destroy_process_group()


def test_broadcast_sends_distinct_bytes_once(shared_media, tmp_path):
    batch = shared_media
    with open(tmp_path / "batch.pkl", "wb") as f:
        pickle.dump(batch, f)
    mp.spawn(_broadcast_worker, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    sender, receiver = (json.loads((tmp_path / f"stats.{r}.json").read_text()) for r in (0, 1))
    assert sender == receiver                                    # what one sent, the other received
    tensors = [batch.tokens, batch.labels, batch.loss_mask, batch.position_ids, batch.padding_mask, *batch.cu_seqlens,
               *batch.cu_seqlens_padded, batch.media["num_frames"], batch.media["num_units"]]
    distinct = sum(t.numel() * t.element_size() for t in tensors)
    distinct += sum(v.physical_nbytes for v in batch.media.values() if isinstance(v, PackedTensor))
    header = len(json.dumps(_plan(batch, 1 << 16)[0], separators=(",", ":")).encode())
    assert sender["dedup"] == [8 + header, distinct]             # header + the distinct bytes, once
    assert sum(b.numel() for b in packed_batch_to_wire(batch)[1].values()) == distinct
    saved = sum(v.logical_nbytes - v.physical_nbytes for v in batch.media.values() if isinstance(v, PackedTensor))
    assert saved > 4 * 64 * ROW_BYTES                            # at least the 4 repeated images
    assert sender["plain"][1] - sender["dedup"][1] == saved     # the plain layout sends every use
