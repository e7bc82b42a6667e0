"""``broadcast_packed_batch``: pure wire round trips, header validation, and real gloo process groups
(2 processes in the default run, 4 in the slow one)."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import json
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from energon_nemotron import tensors
from energon_nemotron.tensors import PackedTensor
from energon_nemotron.parallel.broadcast import (
    WIRE_VERSION, _decode_header, batches_equal, broadcast_packed_batch, packed_batch_from_wire, packed_batch_to_wire)
from energon_nemotron.batch import BatchMedia, MediaSpan, PackedBatch
from conftest import free_port


def text_batch() -> PackedBatch:
    """B=2, S=8, built by hand; every metadata field set."""
    tokens = torch.arange(16, dtype=torch.int64).reshape(2, 8) + 100
    tokens[0, 2:5] = 7                                 # the image's embedding run
    labels = torch.full((2, 8), -100, dtype=torch.int64)
    labels[0, 2:5] = tokens[0, 3:6]
    loss_mask = (labels != -100).to(torch.float32)
    position_ids = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2], [0, 1, 2, 3, 4, 5, 6, 7]])
    batch = PackedBatch(
        tokens=tokens, labels=labels, loss_mask=loss_mask, position_ids=position_ids,
        cu_seqlens=[torch.tensor([0, 5, 7], dtype=torch.int32), torch.tensor([0, 8], dtype=torch.int32)],
        cu_seqlens_padded=[torch.tensor([0, 5, 8], dtype=torch.int32), torch.tensor([0, 8], dtype=torch.int32)],
        max_seqlen=[5, 8], sample_keys=[["ds/a#0", "ds/b#3"], ["pad"]], is_padding=[False, True],
        skipped={"too_long": 2, "bad_media": 1},
        media_spans=[[MediaSpan(kind="image", sample_key="ds/a#0", token_start=1, num_tokens=3,
                                placeholder_len=4, runs=((1, 3),), grid=(2, 3))], []],
        media=BatchMedia(pixel_values=PackedTensor.from_list([torch.arange(72, dtype=torch.float32).reshape(6, 12)]),
                         image_sizes=PackedTensor.from_list([torch.tensor([[2, 3]], dtype=torch.int32)]),
                         num_frames=torch.tensor([1], dtype=torch.int32),
                         num_units=torch.tensor([1], dtype=torch.int32), patch_size=2))
    batch.__restore_key__ = ("Encoded", ("Webdataset", "shard-0.tar", 3), ("Webdataset", "shard-1.tar", 7), 1.5)
    if hasattr(batch, "mtp_num_layers"):  # a field added later travels too (the header lists every field)
        batch.mtp_num_layers = 2
    return batch


def media_batch(seed: int) -> PackedBatch:
    """A deterministic batch (from ``seed``) with ragged media of several dtypes, NaN and -0.0."""
    g = torch.Generator().manual_seed(seed)
    b, s = 2, 24

    def randint(hi, shape, dtype=torch.int64):
        return torch.randint(0, hi, shape, generator=g, dtype=dtype)

    n_img = [int(x) + 1 for x in randint(4, (3,))]
    pixel_values = PackedTensor.from_list([torch.randn(n, 12, generator=g) for n in n_img])
    pixel_values.data[0, 0] = float("nan")
    pixel_values.data[0, 1] = -0.0
    sound = PackedTensor.from_list([torch.randn(int(c) + 1, 5, 128, generator=g) for c in randint(3, (2,))])
    batch = PackedBatch(
        tokens=randint(1000, (b, s)), labels=randint(1000, (b, s)),
        loss_mask=randint(2, (b, s)).to(torch.float32), position_ids=randint(s, (b, s)),
        cu_seqlens=[torch.tensor([0, 10, 20], dtype=torch.int32), torch.tensor([0, 24], dtype=torch.int32)],
        cu_seqlens_padded=[torch.tensor([0, 12, 24], dtype=torch.int32), torch.tensor([0, 24], dtype=torch.int32)],
        max_seqlen=[12, 24], sample_keys=[[f"k{seed}", "k2"], ["k3"]], skipped={},
        media=BatchMedia(
            pixel_values=pixel_values,
            image_sizes=PackedTensor.from_list([randint(64, (n, 2), torch.int32) for n in n_img]),
            num_frames=randint(9, (3,), torch.int32),
            patch_size=2,
            sound_features=sound,
            sound_lengths=randint(3000, (2,)),
        ))
    batch.__restore_key__ = ("Encoded", ("Webdataset", f"s{seed}.tar", seed))
    return batch


def dtype_batch(seed: int) -> PackedBatch:
    """``media_batch(seed)`` with media slots holding what the wire must carry bit-exact whatever a
    slot holds: bfloat16 with an empty item, bool, an empty float16 PackedTensor, a non-contiguous
    tensor, an int16 scalar."""
    g = torch.Generator().manual_seed(seed)
    return media_batch(seed).replace(media=BatchMedia(
        pixel_values=PackedTensor.from_list([torch.randn(2, 3, 4, generator=g).to(torch.bfloat16),
                                             torch.randn(0, 3, 4).to(torch.bfloat16)]),
        image_sizes=PackedTensor.empty((7,), torch.float16),
        num_frames=torch.randint(0, 2, (5, 7), generator=g).bool(),
        sound_features=torch.randn(4, 6, generator=g).t(),  # not contiguous
        sound_lengths=torch.tensor(seed, dtype=torch.int16),
    ))


def test_text_round_trip():
    batch = text_batch()
    header, buffers = packed_batch_to_wire(batch)
    assert sorted(buffers) == ["bool", "float32", "int32", "int64"]      # bool: padding_mask
    assert all(b.dtype == torch.uint8 and b.dim() == 1 for b in buffers.values())
    header = json.loads(json.dumps(header))  # it is JSON
    tensor_fields = set(header["tensors"]) | {"cu_seqlens", "cu_seqlens_padded", "media"}
    assert set(header["meta"]) | tensor_fields == {f.name for f in dataclasses.fields(PackedBatch)}
    out = packed_batch_from_wire(header, buffers)
    assert batches_equal(out, batch)
    assert out.__restore_key__ == batch.__restore_key__ and isinstance(out.__restore_key__[1], tuple)
    assert out.cu_seqlens[0].dtype == torch.int32 and out.is_padding == [False, True]
    out.validate()


def _round_trip(batch: PackedBatch) -> PackedBatch:
    """``batch`` through the wire (its header through JSON), checked equal, media types and dtypes kept."""
    header, buffers = packed_batch_to_wire(batch)
    out = packed_batch_from_wire(json.loads(json.dumps(header)), buffers)
    assert batches_equal(out, batch)
    for name, value in batch.media.items():
        got = out.media[name]
        assert type(got) is type(value) and got.dtype == value.dtype, name
    return out


def test_media_round_trip_is_bit_exact():
    batch = media_batch(3)
    out = _round_trip(batch)
    assert torch.isnan(out.media["pixel_values"].data[0, 0])
    assert torch.signbit(out.media["pixel_values"].data[0, 1])
    assert out.media["sound_lengths"].dtype == torch.int64
    assert out.media["sound_features"].feature_shape == (5, 128)
    assert out.media.patch_size == 2
    assert not batches_equal(out, media_batch(4))
    out = _round_trip(dtype_batch(3))
    assert out.media.pixel_values.offsets.tolist() == [0, 2, 2]
    assert not batches_equal(out, dtype_batch(4))


def test_deduplicated_media_round_trip_once():
    """A ``DedupPackedTensor`` travels as its segment table (header) and its store (buffers): the
    receiver rebuilds the same structure, and the buffers hold each shared segment once."""
    batch = media_batch(6)
    g = torch.Generator().manual_seed(6)
    img, frame = torch.randn(5, 12, generator=g), torch.randn(2, 12, generator=g)
    plain = PackedTensor.from_list([img, torch.cat([frame, frame]), img])
    batch.media = dataclasses.replace(batch.media, pixel_values=tensors.from_keyed([img, [frame, frame], img],
                                                                              ["i", ["f", "f"], "i"]))
    header, buffers = packed_batch_to_wire(batch)
    out = packed_batch_from_wire(json.loads(json.dumps(header)), buffers)
    assert batches_equal(out, batch)
    got = out.media["pixel_values"]
    assert got.is_deduplicated and got.same_structure(batch.media["pixel_values"]) and got.equal(plain)
    assert got.keys == ("i", "f")
    as_plain = dataclasses.replace(batch, media=dataclasses.replace(batch.media, pixel_values=plain))
    nbytes = lambda bufs: sum(b.numel() for b in bufs.values())  # noqa: E731
    saved = nbytes(packed_batch_to_wire(as_plain)[1]) - nbytes(buffers)
    assert saved == plain.physical_nbytes - (5 + 2) * 12 * 4 == (5 + 2) * 12 * 4
    assert not batches_equal(as_plain, batch)                 # same items, another layout: not the same batch
    wire = next(e for n, e in header["media"] if n == "pixel_values")["wire"]
    wire["dedup"]["segment_ids"] = [0, 1, 0, 0]               # a table the offsets disagree with
    with pytest.raises(ValueError, match="disagree"):
        packed_batch_from_wire(header, buffers)


def test_batches_equal_is_strict():
    a = text_batch()
    b = copy.deepcopy(a)
    assert batches_equal(a, b)
    b.__restore_key__ = ("Encoded", ["Webdataset", "shard-0.tar", 3])
    assert not batches_equal(a, b)
    b = copy.deepcopy(a)
    b.is_padding = [0, 1]
    assert not batches_equal(a, b)
    b = copy.deepcopy(a)
    b.cu_seqlens[0] = b.cu_seqlens[0].long()
    assert not batches_equal(a, b)
    b = copy.deepcopy(a)
    b.loss_mask[0, 0] = -0.0
    assert not batches_equal(a, b)


def test_misaligned_buffers_are_copied():
    for batch in (media_batch(5), dtype_batch(5)):
        header, buffers = packed_batch_to_wire(batch)
        shifted = {k: torch.cat([torch.zeros(1, dtype=torch.uint8), v])[1:] for k, v in buffers.items()}
        assert batches_equal(packed_batch_from_wire(header, shifted), batch)


def test_tagged_metadata_round_trips():
    batch = text_batch()
    batch.skipped = {"__tuple__": 1, 3: "int key", (1, "a"): [(), {}], "x": {"__dict__": None}}
    header, buffers = packed_batch_to_wire(batch)
    assert batches_equal(packed_batch_from_wire(json.loads(json.dumps(header)), buffers), batch)


def test_header_metadata_must_be_json():
    batch = text_batch()
    batch.skipped = {"x": object()}
    with pytest.raises(TypeError, match="JSON"):
        packed_batch_to_wire(batch)


def _corrupt(path, value):
    def apply(header):
        node = header
        for key in path[:-1]:
            node = node[key]
        if value is _DELETE:
            del node[path[-1]]
        else:
            node[path[-1]] = value
    return apply


_DELETE = object()


@pytest.mark.parametrize("corrupt, match", [
    (_corrupt(["meta"], _DELETE), "lacks"),
    (_corrupt(["meta", "sample_keys"], _DELETE), "lacks"),
    (_corrupt(["tensors", "labels"], _DELETE), "lacks"),
    (_corrupt(["version"], 99), "version"),
    (_corrupt(["buffers", "int64"], 8), "buffer"),
    (_corrupt(["buffers", "float8"], 4), "dtype"),
    (_corrupt(["tensors", "tokens", "dtype"], "nonsense"), "dtype"),
    (_corrupt(["tensors", "tokens", "shape"], [2, 9]), "bytes|fit"),
    (_corrupt(["tensors", "tokens", "shape"], [2, 3]), "bytes"),
    (_corrupt(["tensors", "tokens", "offset"], 10**9), "fit"),
    (_corrupt(["tensors", "tokens", "offset"], -8), "non-negative"),
    (_corrupt(["tensors", "tokens", "shape"], "xx"), "malformed"),
    (_corrupt(["cu_seqlens"], []), "rows"),
    (_corrupt(["meta", "max_seqlen"], [1]), "rows"),
    (_corrupt(["meta", "__restore_key__"], ["a"]), "tuple"),
    (_corrupt(["meta", "__restore_key__"], {"__dict__": [[[1], 2]]}), "malformed"),
    (_corrupt(["media"], [["x", {"kind": "mystery"}]]), "kind"),
    (_corrupt(["media", 0, 0], "video_bf16"), "not a BatchMedia field"),
    (_corrupt(["meta", "media_spans"], [[{"kind": "image"}], []]), "malformed"),
    (_corrupt(["media"], [["x", {"kind": "packed", "offset": 0,
                                 "wire": {"dtype": "float32", "feature_shape": ["a"], "offsets": [0, 1]}}]]),
     "malformed"),
    (_corrupt(["media"], [["x", {"kind": "packed", "offset": 0,
                                 "wire": {"dtype": "int32", "feature_shape": [], "offsets": [0, 2, 1]}}]]),
     "non-decreasing"),
])
def test_corrupted_header_is_rejected(corrupt, match):
    header, buffers = packed_batch_to_wire(text_batch())
    header = json.loads(json.dumps(header))
    corrupt(header)
    with pytest.raises(ValueError, match=match):
        packed_batch_from_wire(header, buffers)


def test_wrong_buffers_are_rejected():
    header, buffers = packed_batch_to_wire(text_batch())
    with pytest.raises(ValueError, match="buffers"):
        packed_batch_from_wire(header, {k: v for k, v in buffers.items() if k != "int32"})
    with pytest.raises(ValueError, match="uint8"):
        packed_batch_from_wire(header, {**buffers, "int32": buffers["int32"][:-4]})
    with pytest.raises(ValueError, match="JSON object"):
        packed_batch_from_wire([header], buffers)


@pytest.mark.parametrize("raw, match", [(b"\xff\xfe", "UTF-8 JSON"), (b"{not json", "UTF-8 JSON"),
                                        (b"[1, 2]", "JSON object"),
                                        (json.dumps({"version": WIRE_VERSION}).encode(), "lacks")])
def test_header_bytes_are_checked(raw, match):
    with pytest.raises(ValueError, match=match):
        _decode_header(raw)


# -- real processes ------------------------------------------------------------------------------


def _worker(rank: int, world: int, port: int) -> None:
    join_gloo(rank, port, world)
    try:
        # (src, seed, max_chunk_bytes): default chunk, many small chunks, the last rank as source
        for src, seed, chunk in ((0, 11, 64 * 2**20), (1, 12, 1000), (world - 1, 13, 7)):
            for expected in (media_batch(seed), dtype_batch(seed)):
                got = broadcast_packed_batch(expected if rank == src else None, src, max_chunk_bytes=chunk)
                assert batches_equal(got, expected), (rank, src, seed)
                assert (got is expected) == (rank == src)
        expected = text_batch()
        got = broadcast_packed_batch(expected if rank == 1 else None, 1, max_chunk_bytes=16)
        assert batches_equal(got, expected) and got.__restore_key__ == expected.__restore_key__
        # a source that passes None fails on every rank, and the group stays usable
        with pytest.raises(ValueError if rank == 0 else RuntimeError):
            broadcast_packed_batch(None, 0)
        if world >= 4:  # a sub-group: src is a global rank
            sub = dist.new_group([1, 3])
            if rank in (1, 3):
                for expected in (media_batch(14), dtype_batch(14)):
                    got = broadcast_packed_batch(expected if rank == 3 else None, 3, group=sub, max_chunk_bytes=333)
                    assert batches_equal(got, expected), rank
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_broadcast_two_processes():
    mp.spawn(_worker, args=(2, free_port()), nprocs=2, join=True)


@pytest.mark.slow
def test_broadcast_four_processes():
    mp.spawn(_worker, args=(4, free_port()), nprocs=4, join=True)


# -- memory ------------------------------------------------------------------------------------------
MiB = 2**20


def _proc_status(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))


def big_media_batch() -> PackedBatch:
    """A batch whose float32 media payload is 131.8 MiB (three images' patches)."""
    g = torch.Generator().manual_seed(0)
    pv = PackedTensor.from_list([torch.randn(n, 768, generator=g) for n in (20000, 15000, 10000)])
    t = torch.arange(64, dtype=torch.int64).reshape(1, 64)
    return PackedBatch(tokens=t, labels=t.clone(), loss_mask=torch.ones(1, 64), position_ids=t.clone(),
                       cu_seqlens=[torch.tensor([0, 64], dtype=torch.int32)],
                       cu_seqlens_padded=[torch.tensor([0, 64], dtype=torch.int32)],
                       max_seqlen=[64], sample_keys=[["a"]], media=BatchMedia(pixel_values=pv))


def join_gloo(rank: int, port: int, world: int = 2) -> None:
    """Join a gloo group of ``world`` local processes (one thread each)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))


def _memory_worker(rank: int, port: int, out: str) -> None:
    join_gloo(rank, port)
    try:
        expected = big_media_batch()                      # both ranks build it: the receiver compares
        results = {}
        for chunk in (4 * MiB, 64 * MiB):
            dist.barrier()
            with open("/proc/self/clear_refs", "w") as f:  # reset this process's peak RSS (VmHWM)
                f.write("5")
            before = _proc_status("VmRSS:")
            got = broadcast_packed_batch(expected if rank == 0 else None, 0, max_chunk_bytes=chunk)
            results[chunk] = _proc_status("VmHWM:") - before
            assert batches_equal(got, expected)
            del got
        with open(f"{out}.{rank}", "w") as f:
            json.dump({str(k): v for k, v in results.items()}, f)
    finally:
        dist.destroy_process_group()


def test_broadcast_memory_is_bounded(tmp_path):
    """Over a 131.8 MiB payload, the sender's peak RSS grows by at most one chunk plus the header
    (it used to flatten each dtype group: +133 MiB whatever the chunk), each receiver's by at most
    the rebuilt batch plus one chunk (2 MiB allowed for the interpreter and gloo)."""
    out = str(tmp_path / "rss")
    mp.spawn(_memory_worker, args=(free_port(), out), nprocs=2, join=True)
    sender, receiver = (json.loads(open(f"{out}.{r}").read()) for r in (0, 1))
    payload = sum(t.numel() * t.element_size() for t in (big_media_batch().media["pixel_values"].data,))
    assert payload > 100 * MiB
    for chunk in (4 * MiB, 64 * MiB):
        assert sender[str(chunk)] <= chunk + 2 * MiB, (chunk, sender)
        assert receiver[str(chunk)] <= payload + chunk + 2 * MiB, (chunk, receiver)
    assert sender[str(4 * MiB)] < 8 * MiB


def test_windows_are_the_flat_buffer_in_chunks_and_staged_on_the_device():
    """``_windows`` yields exactly the bytes of the flat group buffer, chunk by chunk: views of a
    tensor where a chunk lies inside one on the target device, else one reused staging buffer on
    that device (host segments joined on the device, never flattened on the host)."""
    from energon_nemotron.parallel.broadcast import _flatten, _windows

    g = torch.Generator().manual_seed(3)
    tensors = [torch.randn(n, generator=g) for n in (0, 5, 64, 3, 0, 40)] + [torch.randn(6, 4, generator=g).t()]
    flat = _flatten(tensors)
    for chunk in (1, 7, 16, 100, 10**6):
        windows = [(w.clone(), w.data_ptr(), s) for w, s in _windows(tensors, chunk, torch.device("cpu"))]
        assert b"".join(w.numpy().tobytes() for w, _, _ in windows) == flat.numpy().tobytes()
        assert all(w.numel() == chunk for w, _, _ in windows[:-1])
        stagings = {id(s) for _, _, s in windows if s is not None}
        assert len(stagings) <= 1                                 # one staging buffer, reused
        views = [p for w, p, _ in windows if any(t.data_ptr() <= p < t.data_ptr() + t.numel() * 4
                                                 for t in tensors if t.is_contiguous() and t.numel())]
        if chunk == 16:
            assert len(views) >= 2                                # chunks inside a tensor are not copied
    meta = list(_windows(tensors, 16, torch.device("meta")))      # a device group: every chunk staged there
    assert all(w.device.type == "meta" for w, _ in meta) and sum(w.numel() for w, _ in meta) == flat.numel()
    assert max(s.numel() for _, s in meta) == 16


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="NCCL device-side coalescing needs two CUDA devices; this machine has "
                           f"{torch.cuda.device_count() if torch.cuda.is_available() else 0}")
def test_broadcast_nccl_two_devices():
    mp.spawn(_nccl_worker, args=(free_port(),), nprocs=2, join=True)


def _nccl_worker(rank: int, port: int) -> None:
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=120))
    try:
        for expected in (media_batch(21), dtype_batch(21)):        # host tensors on the source
            got = broadcast_packed_batch(expected if rank == 0 else None, 0, max_chunk_bytes=333)
            if rank == 1:
                assert got.tokens.device.type == "cuda"
                on_host = dataclasses.replace(got, **{k: getattr(got, k).cpu() for k in
                                                      ("tokens", "labels", "loss_mask", "position_ids")})
                on_host.cu_seqlens = [c.cpu() for c in got.cu_seqlens]
                on_host.cu_seqlens_padded = [c.cpu() for c in got.cu_seqlens_padded]
                on_host.media = got.media.map(lambda v: v.to("cpu"))
                on_host.__restore_key__ = got.__restore_key__
                assert batches_equal(on_host, expected)
        dist.barrier()
    finally:
        dist.destroy_process_group()
