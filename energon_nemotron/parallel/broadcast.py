"""Broadcast a ``PackedBatch`` from one rank to all ranks of a process group (tensor parallelism).

Protocol of :func:`broadcast_packed_batch` (no pickle: receivers parse JSON and reinterpret bytes):

1. the source builds a JSON header (:func:`packed_batch_to_wire`) and broadcasts its length as
   int64 [1] (-1 when the source failed: every rank then raises), then its UTF-8 bytes as uint8;
2. for each dtype group, sorted by dtype name: one flat uint8 buffer holding the raw bytes of all
   tensors of that dtype, in chunks of at most ``chunk_bytes``. The source never builds the buffer:
   each chunk is a view of the tensor it lies in, or is assembled in one reused staging buffer of
   ``chunk_bytes`` (on the group's device: over NCCL host tensors are copied to the device chunk by
   chunk and joined there), so it holds at most one chunk more than the batch (:func:`_windows`);
   receivers allocate each buffer once and receive into slice views (the rebuilt batch shares them);
3. receivers check the header and rebuild bit-identical tensors with ``.view(dtype)`` (uint8 on the
   wire since gloo lacks bool/bfloat16; copied when misaligned): :func:`packed_batch_from_wire`.
   Over gloo buffers are on the CPU, over NCCL on the current CUDA device (so are received tensors).

A deduplicated ``PackedTensor`` (``DedupPackedTensor``: media used several times in the batch)
sends its segment table in the header and its physical store once in the buffers; receivers
rebuild the same segment table (``batches_equal`` compares it). ``stats`` (a
:class:`BroadcastStats`) counts the bytes each call moves: ``8 + len(header)`` + the buffers.

Header::

    {"version": 3, "chunk_bytes": int, "buffers": {dtype_name: nbytes},
     "tensors": {"tokens": T, "labels": T, "loss_mask": T, "position_ids": T},
     "cu_seqlens": [T, ...], "cu_seqlens_padded": [T, ...],    # one int32 T per row
     "media": [[name, M], ...],         # the BatchMedia fields that are set, in field order
     "meta": {field: V, ...}}  # every other PackedBatch field: max_seqlen, ..., "__restore_key__";
                               # media_spans as rows of MediaSpan.as_dict()
    T = {"dtype": str, "shape": [int], "offset": int}          # offset: bytes into buffers[dtype]
    M = {"kind": "packed", "wire": PackedTensor.wire_header(), "offset": int}  # wire["dedup"]: segment table
      | {"kind": "tensor", **T} | {"kind": "value", "value": V}             # value: patch_size
    V = JSON; a tuple is {"__tuple__": [...]}, a dict with non-str (or tag) keys {"__dict__": [[k, v]]}
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import operator
from typing import Any, Callable, Iterator, Optional

import torch
import torch.distributed as dist

from energon_nemotron.resume.codec import decode_json, encode_json
from energon_nemotron.tensors import PackedTensor, from_wire
from energon_nemotron.tensors.common import dtype_from_name, dtype_name, typed_view
from energon_nemotron.batch import BatchMedia, MediaSpan, PackedBatch

__all__ = ["broadcast_packed_batch", "packed_batch_to_wire", "packed_batch_from_wire", "batches_equal",
           "BroadcastStats"]

#: 2: deduplicated PackedTensors (a ``dedup`` segment table in the wire header, physical bytes only);
#: 3: ``padding_mask`` (bool) among the row tensors
WIRE_VERSION = 3
_TENSORS = ("tokens", "labels", "loss_mask", "position_ids", "padding_mask")
#: the non-tensor fields (JSON in the header), whatever ``PackedBatch`` holds, ``__restore_key__`` too
_META = tuple(f.name for f in dataclasses.fields(PackedBatch)
              if f.name not in (*_TENSORS, "cu_seqlens", "cu_seqlens_padded", "media"))
#: the names a header's ``media`` entries may have
_MEDIA_FIELDS = frozenset(f.name for f in dataclasses.fields(BatchMedia))


@dataclasses.dataclass
class BroadcastStats:
    """What :func:`broadcast_packed_batch` moved on this rank (sent by the source, received by the
    others), summed over the calls it was passed to: ``header_bytes`` (the int64 length and the JSON
    header), ``payload_bytes`` (the dtype buffers), ``messages`` (``dist.broadcast`` calls)."""

    calls: int = 0
    header_bytes: int = 0
    payload_bytes: int = 0
    messages: int = 0

    @property
    def total_bytes(self) -> int:
        return self.header_bytes + self.payload_bytes


def _plan(batch: PackedBatch, chunk_bytes: int) -> tuple[dict, dict[str, list[torch.Tensor]]]:
    """The header and, per dtype name, the tensors of that group in buffer order (not copied)."""
    if not isinstance(batch, PackedBatch):
        raise TypeError(f"expected a PackedBatch, got {type(batch).__name__}")
    groups: dict[str, list[torch.Tensor]] = {}
    sizes: dict[str, int] = {}

    def add(t: torch.Tensor) -> dict:
        name, offset = dtype_name(t.dtype), sizes.get(dtype_name(t.dtype), 0)
        groups.setdefault(name, []).append(t)
        sizes[name] = offset + t.numel() * t.element_size()
        return {"dtype": name, "shape": list(t.shape), "offset": offset}

    header: dict[str, Any] = {"version": WIRE_VERSION, "chunk_bytes": int(chunk_bytes)}
    header["tensors"] = {k: add(getattr(batch, k)) for k in _TENSORS}
    header |= {k: [add(c) for c in getattr(batch, k)] for k in ("cu_seqlens", "cu_seqlens_padded")}
    header["media"] = []
    for name, value in batch.media.present():
        if isinstance(value, PackedTensor):
            entry = {"kind": "packed", "wire": value.wire_header(), "offset": add(value.physical_data)["offset"]}
        elif isinstance(value, torch.Tensor):
            entry = {"kind": "tensor", **add(value)}
        else:
            entry = {"kind": "value", "value": encode_json(value)}
        header["media"].append([str(name), entry])
    header["meta"] = {k: encode_json(_meta_value(batch, k)) for k in _META}
    header["buffers"] = dict(sorted(sizes.items()))
    return header, groups


def _meta_value(batch: PackedBatch, name: str) -> Any:
    """A metadata field as the header holds it: ``media_spans`` as rows of plain dicts."""
    value = getattr(batch, name)
    return [[s.as_dict() for s in row] for row in value] if name == "media_spans" else value


def _flatten(tensors: list[torch.Tensor], device: Any = None) -> torch.Tensor:
    """One contiguous uint8 buffer with the raw bytes of ``tensors``, in order."""
    return torch.cat([t.detach().to(device).contiguous().reshape(-1).view(torch.uint8) for t in tensors])


def _windows(tensors: list[torch.Tensor], chunk: int, device: Any,
             staging: Optional[torch.Tensor] = None) -> Iterator[tuple[torch.Tensor, Optional[torch.Tensor]]]:
    """The raw bytes of ``tensors`` (their concatenation, as :func:`_flatten` lays it out) as
    consecutive windows of ``chunk`` bytes (the last one shorter): exactly the slices receivers
    receive into. A window that lies inside one contiguous tensor already on ``device`` is a view
    of it; any other (spanning tensors, or host tensors for a device group) is assembled on
    ``device`` in one staging buffer of at most ``chunk`` bytes, reused (and yielded beside each
    window, so the caller can pass it on to the next group). So the sender holds at most one chunk
    more than the batch (plus a contiguous copy of a non-contiguous tensor, one at a time).
    Each window must be consumed (sent) before the next is requested."""
    pieces = [t for t in tensors if t.numel()]
    total = sum(t.numel() * t.element_size() for t in pieces)
    k, at = 0, 0                        # the current tensor and the byte offset inside it
    current: Optional[torch.Tensor] = None
    for start in range(0, total, chunk):
        n = min(chunk, total - start)
        if current is None:
            current = pieces[k].detach().contiguous().reshape(-1).view(torch.uint8)
        if at + n <= current.numel() and current.device == device:
            window = current[at:at + n]
            at += n
        else:
            if staging is None or staging.numel() < n:
                staging = torch.empty(min(chunk, total), dtype=torch.uint8, device=device)
            filled = 0
            while filled < n:
                if current is None:
                    current = pieces[k].detach().contiguous().reshape(-1).view(torch.uint8)
                take = min(n - filled, current.numel() - at)
                staging[filled:filled + take].copy_(current[at:at + take])
                filled, at = filled + take, at + take
                if at == current.numel() and filled < n:
                    k, at, current = k + 1, 0, None
            window = staging[:n]
        yield window, staging
        if current is not None and at == current.numel() and k + 1 < len(pieces):
            k, at, current = k + 1, 0, None


def packed_batch_to_wire(batch: PackedBatch) -> tuple[dict, dict[str, torch.Tensor]]:
    """``(header, buffers)``: the JSON-able header described in the module docstring and, per dtype
    name, one flat contiguous uint8 buffer (a copy) holding all tensors of that dtype. Pure."""
    header, groups = _plan(batch, 0)
    return header, {name: _flatten(ts) for name, ts in sorted(groups.items())}


def _int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"PackedBatch header: {what} must be a non-negative int, got {v!r}")
    return v


def _header_errors(fn: Callable) -> Callable:
    """Turn lookups that fail on a malformed header (KeyError, TypeError, ...) into ValueError."""

    @functools.wraps(fn)
    def checked(*args: Any) -> Any:
        try:
            return fn(*args)
        except KeyError as e:
            raise ValueError(f"PackedBatch header lacks field {e}") from e
        except (IndexError, TypeError, AttributeError) as e:
            raise ValueError(f"malformed PackedBatch header ({type(e).__name__}: {e})") from e

    return checked


@_header_errors
def _buffer_sizes(header: Any) -> dict[str, int]:
    """Check the header's envelope; ``{dtype name: nbytes}`` in wire order."""
    if not isinstance(header, dict):
        raise ValueError(f"PackedBatch header must be a JSON object, got {type(header).__name__}")
    if header.get("version") != WIRE_VERSION:
        raise ValueError(f"PackedBatch header version {header.get('version')!r}, expected {WIRE_VERSION}")
    _int(header["chunk_bytes"], "chunk_bytes")
    sizes = {k: _int(n, f"buffers[{k!r}]") for k, n in sorted(header["buffers"].items())}
    return {k: n for k, n in sizes.items() if dtype_from_name(k)}  # ValueError on an unknown dtype


@_header_errors
def packed_batch_from_wire(header: dict, buffers: dict[str, torch.Tensor]) -> PackedBatch:
    """Inverse of :func:`packed_batch_to_wire`: ``buffers`` maps dtype names to 1-D uint8 tensors.
    Tensors share the buffers' memory where alignment allows. ``ValueError`` when a field is missing
    or malformed, or when sizes disagree (a buffer of the wrong length, a tensor out of bounds)."""
    sizes = _buffer_sizes(header)
    got = {k: (b.dtype, tuple(b.shape)) for k, b in buffers.items()}
    if got != {k: (torch.uint8, (n,)) for k, n in sizes.items()}:
        raise ValueError(f"the header needs 1-D uint8 buffers of {sizes} bytes, got {got}")
    used = dict.fromkeys(sizes, 0)

    def take(spec: dict, what: str) -> torch.Tensor:
        dtype, shape = dtype_from_name(spec["dtype"]), [operator.index(d) for d in spec["shape"]]
        nbytes, offset = math.prod(shape) * dtype.itemsize, _int(spec["offset"], f"{what} offset")
        if min(shape, default=0) < 0 or offset % dtype.itemsize or offset + nbytes > sizes.get(spec["dtype"], -1):
            raise ValueError(f"PackedBatch header: {what} ({spec['dtype']} {shape} at byte {offset}) misfits")
        used[spec["dtype"]] += nbytes
        return typed_view(buffers[spec["dtype"]][offset:offset + nbytes], dtype).view(shape)

    fields = {k: take(header["tensors"][k], k) for k in _TENSORS}
    for k in ("cu_seqlens", "cu_seqlens_padded"):
        fields[k] = [take(c, f"{k}[{i}]") for i, c in enumerate(header[k])]
    values = {k: decode_json(header["meta"][k]) for k in _META}
    rows = fields["tokens"].shape[0] if fields["tokens"].dim() == 2 else -1
    for k in ("cu_seqlens", "cu_seqlens_padded", "max_seqlen", "sample_keys", "is_padding", "media_spans"):
        n = len(fields[k]) if k in fields else len(values[k]) if isinstance(values[k], list) else -1
        if n != rows:
            raise ValueError(f"PackedBatch header: {k} has {n} rows, tokens has {rows}")
    values["media_spans"] = [[MediaSpan.from_dict(d) for d in row] for row in values["media_spans"]]
    media: dict[str, Any] = {}
    for name, entry in header["media"]:
        if not isinstance(name, str) or name in media:
            raise ValueError(f"PackedBatch header: bad or repeated media name {name!r}")
        what, kind = f"media[{name!r}]", entry["kind"]
        if kind == "tensor":
            media[name] = take(entry, what)
        elif kind == "packed":
            wire = entry["wire"]
            shape = [PackedTensor.wire_rows(wire), *wire["feature_shape"]]
            data = take({"dtype": wire["dtype"], "shape": shape, "offset": entry["offset"]}, what)
            media[name] = from_wire(wire, data.reshape(-1).view(torch.uint8))
        elif kind == "value":
            media[name] = decode_json(entry["value"])
        else:
            raise ValueError(f"PackedBatch header: {what} has unknown kind {kind!r}")
        if name not in _MEDIA_FIELDS:
            raise ValueError(f"PackedBatch header: {what} is not a BatchMedia field ({sorted(_MEDIA_FIELDS)})")
    if used != sizes:
        raise ValueError(f"PackedBatch header: tensors take {used} bytes, buffers hold {sizes}")
    if not isinstance(key := values["__restore_key__"], tuple):
        raise ValueError(f"PackedBatch header: __restore_key__ must be a tuple, got {key!r:.80}")
    return PackedBatch(**fields, **values, media=BatchMedia(**media))


def _decode_header(raw: bytes) -> dict:
    """Parse header bytes (JSON, UTF-8); ``ValueError`` when they are not a JSON object."""
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"PackedBatch header is not valid UTF-8 JSON: {e}") from e
    _buffer_sizes(header)
    return header


def broadcast_packed_batch(batch_or_none: Optional[PackedBatch], src: int,
                           group: Optional[dist.ProcessGroup] = None,
                           max_chunk_bytes: int = 64 * 2**20,
                           stats: Optional[BroadcastStats] = None) -> PackedBatch:
    """Collective: every rank of ``group`` (None: the world) calls it; the rank whose global rank is
    ``src`` passes its batch, the others pass None (anything else they pass is ignored). Returns a
    batch bit-identical to the source's (the source gets its own object back; deduplicated media
    come back deduplicated the same way). The source's ``max_chunk_bytes`` rules (it travels in the
    header). ``stats``: add the bytes this rank sends or receives to it. Raises on every rank when
    the source cannot encode its batch; receivers raise ``ValueError`` on a malformed header."""
    nccl = dist.get_backend(group) == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    counted = stats if stats is not None else BroadcastStats()
    counted.calls += 1

    def send(buf: torch.Tensor, header: bool = False) -> None:  # one dist.broadcast, counted
        dist.broadcast(buf, src, group=group)
        counted.messages += 1
        nbytes = buf.numel() * buf.element_size()
        if header:
            counted.header_bytes += nbytes
        else:
            counted.payload_bytes += nbytes

    def bcast(buf: torch.Tensor, chunk: int) -> None:  # in place, one slice view at a time
        for start in range(0, buf.numel(), chunk):
            send(buf[start:start + chunk])

    if dist.get_rank() == src:
        try:
            if (chunk := int(max_chunk_bytes)) < 1:
                raise ValueError(f"max_chunk_bytes must be >= 1, got {max_chunk_bytes}")
            if batch_or_none is None:
                raise ValueError("the source rank must pass a PackedBatch, got None")
            header, groups = _plan(batch_or_none, chunk)
            raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
        except Exception:
            send(torch.tensor([-1], dtype=torch.int64, device=device), header=True)
            raise
        send(torch.tensor([len(raw)], dtype=torch.int64, device=device), header=True)
        send(torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(device), header=True)
        staging: Optional[torch.Tensor] = None
        for name in header["buffers"]:
            for window, staging in _windows(groups[name], chunk, device, staging):
                send(window)
        return batch_or_none
    length = torch.zeros(1, dtype=torch.int64, device=device)
    send(length, header=True)
    if int(length) < 0:
        raise RuntimeError(f"rank {src} failed to encode its PackedBatch (see its error)")
    raw = torch.empty(int(length), dtype=torch.uint8, device=device)
    send(raw, header=True)
    header = _decode_header(raw.cpu().numpy().tobytes())
    if (chunk := header["chunk_bytes"]) < 1:
        raise ValueError("PackedBatch header: chunk_bytes must be >= 1")
    buffers = {name: torch.empty(n, dtype=torch.uint8, device=device) for name, n in _buffer_sizes(header).items()}
    for buf in buffers.values():
        bcast(buf, chunk)
    return packed_batch_from_wire(header, buffers)


def _same(a: Any, b: Any) -> bool:
    """Exact structural equality: same types; tensors with same dtype, shape, device and bytes."""
    if isinstance(a, torch.Tensor):
        raw = lambda t: t.detach().contiguous().reshape(-1).view(torch.uint8)  # noqa: E731
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and a.device == b.device and torch.equal(raw(a), raw(b)))
    if isinstance(a, PackedTensor):
        if type(a) is not type(b) or not _same(a.offsets, b.offsets):
            return False
        if a.is_deduplicated:       # the same segment table and store (so the same logical items)
            return a.same_structure(b) and _same(a.physical_data, b.physical_data)
        return _same(a.data, b.data)
    if type(a) is not type(b):
        return False
    if isinstance(a, BatchMedia):
        return all(_same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(BatchMedia))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


def batches_equal(a: PackedBatch, b: PackedBatch) -> bool:
    """True when every field of ``a`` and ``b`` (``__restore_key__`` included) is exactly equal:
    tensors compared bit by bit (so NaN payloads and -0.0 count), metadata with identical types,
    deduplicated ``PackedTensor``s by segment table and store (so their logical items agree too)."""
    if not (isinstance(a, PackedBatch) and isinstance(b, PackedBatch)):
        return False
    return all(_same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(PackedBatch))
