"""Loader state files: JSON (never pickle), fingerprinted, written atomically.

A state holds the loader's own state (Energon's ``SavableDataLoaderState``, or the rows consumed
on the Megatron-LM path) and a fingerprint of everything that changes the stream. Restoring under
a different fingerprint fails with a per-key diff.

Energon's state is a tree of dataclasses, dicts, tuples, bytes, numpy arrays and torch tensors; it
is written as tagged JSON and read back constructing only classes of ``megatron.energon`` (no
arbitrary imports, no code execution on load).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import importlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from energon_nemotron.errors import ConfigError

FORMAT = "energon-nemotron-loader-state"
VERSION = 1
ALLOWED_MODULES = ("megatron.energon.",)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def encode_state(obj: Any) -> Any:
    """A JSON-able form of ``obj`` (see the module docstring)."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, tuple):
        return {"__tuple__": [encode_state(x) for x in obj]}
    if isinstance(obj, list):
        return [encode_state(x) for x in obj]
    if isinstance(obj, (bytes, bytearray)):
        return {"__bytes__": _b64(bytes(obj))}
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": {"dtype": obj.dtype.str, "shape": list(obj.shape),
                                "data": _b64(np.ascontiguousarray(obj).tobytes())}}
    if isinstance(obj, np.generic):
        return encode_state(obj.item())
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        return {"__tensor__": {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                               "data": _b64(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")}}
    cls = type(obj)
    name = f"{cls.__module__}.{cls.__qualname__}"
    if dataclasses.is_dataclass(obj):
        _check_allowed(name)
        return {"__dataclass__": name,
                "fields": {f.name: encode_state(getattr(obj, f.name)) for f in dataclasses.fields(obj)}}
    if isinstance(obj, dict):
        items = [[encode_state(k), encode_state(v)] for k, v in obj.items()]
        if cls is dict:
            return {"__dict__": items}
        _check_allowed(name)
        return {"__dict__": items, "class": name}
    raise TypeError(f"cannot store a {name} in a loader state")


def _check_allowed(name: str) -> None:
    if not name.startswith(ALLOWED_MODULES):
        raise TypeError(f"class {name} is not allowed in a loader state")


def _load_class(name: str) -> type:
    _check_allowed(name)
    module, _, qual = name.rpartition(".")
    obj = importlib.import_module(module)
    for part in qual.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, type):
        raise TypeError(f"{name} is not a class")
    return obj


def decode_state(data: Any) -> Any:
    """Inverse of :func:`encode_state`."""
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if isinstance(data, list):
        return [decode_state(x) for x in data]
    if not isinstance(data, dict) or len(data) > 2:
        raise ValueError(f"malformed loader state entry: {str(data)[:80]}")
    if "__tuple__" in data:
        return tuple(decode_state(x) for x in data["__tuple__"])
    if "__bytes__" in data:
        return base64.b64decode(data["__bytes__"])
    if "__ndarray__" in data:
        spec = data["__ndarray__"]
        arr = np.frombuffer(base64.b64decode(spec["data"]), dtype=np.dtype(spec["dtype"]))
        return arr.reshape(spec["shape"]).copy()
    if "__tensor__" in data:
        spec = data["__tensor__"]
        dtype = getattr(torch, spec["dtype"])
        raw = torch.frombuffer(bytearray(base64.b64decode(spec["data"])), dtype=torch.uint8) if spec["data"] else \
            torch.zeros(0, dtype=torch.uint8)
        return raw.view(dtype).reshape(spec["shape"]).clone()
    if "__dataclass__" in data:
        cls = _load_class(data["__dataclass__"])
        values = {k: decode_state(v) for k, v in data["fields"].items()}
        init = {f.name for f in dataclasses.fields(cls) if f.init}
        obj = cls(**{k: v for k, v in values.items() if k in init})
        for k, v in values.items():
            if k not in init:
                object.__setattr__(obj, k, v)
        return obj
    if "__dict__" in data:
        cls = _load_class(data["class"]) if "class" in data else dict
        out = cls()
        for k, v in data["__dict__"]:
            out[decode_state(k)] = decode_state(v)
        return out
    raise ValueError(f"malformed loader state entry: {str(data)[:80]}")


def file_digest(*paths: Path) -> str:
    """sha256 over the given files (missing ones skipped), e.g. a tokenizer's files."""
    h = hashlib.sha256()
    for p in sorted(paths):
        if p.is_file():
            h.update(p.name.encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def fingerprint_diff(saved: dict, current: dict) -> list[str]:
    """Human-readable lines for every key whose value differs."""
    lines = []
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key, "<missing>"), current.get(key, "<missing>")
        if a != b:
            lines.append(f"  {key}: saved {json.dumps(a, sort_keys=True)} != now {json.dumps(b, sort_keys=True)}")
    return lines


def check_fingerprint(saved: dict, current: dict) -> None:
    diff = fingerprint_diff(saved, current)
    if diff:
        raise ConfigError("the loader state was saved under a different configuration; restoring it would "
                          "change the data stream:\n" + "\n".join(diff))


def save_state_file(path: str | os.PathLike, state: dict) -> None:
    """Write ``state`` as JSON atomically: a temporary file in the same folder, fsync, rename."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    payload = json.dumps({"format": FORMAT, "version": VERSION, **state}, sort_keys=True)
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load_state_file(path: str | os.PathLike) -> dict:
    """Read a state file written by :func:`save_state_file` (``ConfigError`` when it is not one)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"cannot read loader state {str(path)!r}: {e}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != VERSION:
        raise ConfigError(f"{path}: not an energon-nemotron loader state (version {VERSION})")
    return data
