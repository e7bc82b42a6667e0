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
import binascii
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
        raise TypeError(f"class {name} is not allowed in a loader state (only {', '.join(ALLOWED_MODULES)}*)")


def _load_class(name: str) -> type:
    _check_allowed(name)
    module, _, qual = name.rpartition(".")
    try:
        obj = importlib.import_module(module)
        for part in qual.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise TypeError(f"no class {name} ({type(e).__name__}: {e})") from None
    if not isinstance(obj, type):
        raise TypeError(f"{name} is not a class")
    return obj


def _b64decode(text: Any, path: str) -> bytes:
    if not isinstance(text, str):
        raise ValueError(f"{path}: expected base64 text, got {type(text).__name__}")
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error as e:
        raise ValueError(f"{path}: invalid base64 ({e})") from None


def _array(spec: Any, path: str, tensor: bool) -> Any:
    if not isinstance(spec, dict) or set(spec) != {"dtype", "shape", "data"}:
        raise ValueError(f"{path}: expected {{dtype, shape, data}}, got {str(spec)[:80]}")
    raw = _b64decode(spec["data"], f"{path}.data")
    try:
        if tensor:
            dtype = getattr(torch, spec["dtype"])
            if not isinstance(dtype, torch.dtype):
                raise TypeError(f"{spec['dtype']!r} is not a torch dtype")
            flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.zeros(0, dtype=torch.uint8)
            return flat.view(dtype).reshape(spec["shape"]).clone()
        return np.frombuffer(raw, dtype=np.dtype(spec["dtype"])).reshape(spec["shape"]).copy()
    except (TypeError, ValueError, AttributeError, RuntimeError) as e:
        kind = "tensor" if tensor else "array"
        raise ValueError(f"{path}: damaged {kind} (dtype {spec['dtype']!r}, shape {spec['shape']!r}, "
                         f"{len(raw)} bytes): {e}") from None


def decode_state(data: Any, path: str = "state") -> Any:
    """Inverse of :func:`encode_state`. A malformed entry raises ``ValueError`` naming its ``path``
    in the tree (a class outside ``megatron.energon``, or one that does not exist: ``TypeError``)."""
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if isinstance(data, list):
        return [decode_state(x, f"{path}[{i}]") for i, x in enumerate(data)]
    if not isinstance(data, dict) or len(data) > 2:
        raise ValueError(f"{path}: malformed loader state entry: {str(data)[:80]}")
    if "__tuple__" in data and isinstance(data["__tuple__"], list):
        return tuple(decode_state(x, f"{path}[{i}]") for i, x in enumerate(data["__tuple__"]))
    if "__bytes__" in data:
        return _b64decode(data["__bytes__"], path)
    if "__ndarray__" in data:
        return _array(data["__ndarray__"], path, tensor=False)
    if "__tensor__" in data:
        return _array(data["__tensor__"], path, tensor=True)
    if "__dataclass__" in data and isinstance(data.get("fields"), dict):
        try:
            cls = _load_class(str(data["__dataclass__"]))
        except TypeError as e:
            raise TypeError(f"{path}: {e}") from None
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"{path}: {cls.__qualname__} is not a dataclass")
        values = {k: decode_state(v, f"{path}.{k}") for k, v in data["fields"].items()}
        init = {f.name for f in dataclasses.fields(cls) if f.init}
        try:
            obj = cls(**{k: v for k, v in values.items() if k in init})
        except TypeError as e:
            raise TypeError(f"{path}: {cls.__qualname__} cannot be built from the saved fields ({e})") from None
        for k, v in values.items():
            if k not in init:
                object.__setattr__(obj, k, v)
        return obj
    if "__dict__" in data and isinstance(data["__dict__"], list):
        try:
            cls = _load_class(str(data["class"])) if "class" in data else dict
        except TypeError as e:
            raise TypeError(f"{path}: {e}") from None
        if not issubclass(cls, dict):
            raise TypeError(f"{path}: {cls.__qualname__} is not a mapping")
        out = cls()
        for i, item in enumerate(data["__dict__"]):
            if not isinstance(item, list) or len(item) != 2:
                raise ValueError(f"{path}: item {i} is not a [key, value] pair: {str(item)[:80]}")
            key = decode_state(item[0], f"{path}[{i}].key")
            try:
                hash(key)
            except TypeError:
                raise ValueError(f"{path}: item {i} has an unhashable key {str(key)[:80]}") from None
            out[key] = decode_state(item[1], f"{path}.{key}" if isinstance(key, str) and key.isidentifier()
                                    else f"{path}[{key!r}]")
        return out
    raise ValueError(f"{path}: malformed loader state entry: {str(data)[:80]}")


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
    for key in sorted(set(saved) | set(current), key=str):
        a, b = saved.get(key, "<missing>"), current.get(key, "<missing>")
        if a != b:
            lines.append(f"  {key}: saved {json.dumps(a, sort_keys=True, default=str)} "
                         f"!= now {json.dumps(b, sort_keys=True, default=str)}")
    return lines


def check_fingerprint(saved: dict, current: dict, origin: str = "the loader state") -> None:
    if not isinstance(saved, dict):
        raise ConfigError(f"{origin}: fingerprint is {_kind(saved)}, not a mapping; {DAMAGED}")
    diff = fingerprint_diff(saved, current)
    if diff:
        raise ConfigError(f"{origin} was saved under a different configuration; restoring it would "
                          "change the data stream:\n" + "\n".join(diff))


#: the end of every message about a state that cannot be restored
DAMAGED = ("the state is damaged or belongs to another configuration: resume from a state this configuration "
           "saved, or start without one")


def _shorter(text: str, limit: int = 300) -> str:
    """``text`` with its middle elided past ``limit`` characters (deep state paths)."""
    return text if len(text) <= limit else f"{text[:limit // 3]}...{text[-2 * limit // 3:]}"


def _kind(value: Any) -> str:
    from energon_nemotron.config import describe_value

    return describe_value(value)


def state_parts(state: Any, origin: str = "the loader state") -> tuple[dict, dict]:
    """The ``fingerprint`` and ``position`` of a loader state (a ``ConfigError`` naming the key
    when one is missing or not a mapping)."""
    if not isinstance(state, dict):
        raise ConfigError(f"{origin}: expected a mapping with fingerprint and position, got {_kind(state)}; {DAMAGED}")
    for key in ("fingerprint", "position"):
        if key not in state:
            raise ConfigError(f"{origin}: no {key!r} key; {DAMAGED}")
        if not isinstance(state[key], dict):
            raise ConfigError(f"{origin}: {key} is {_kind(state[key])}, not a mapping; {DAMAGED}")
    return state["fingerprint"], state["position"]


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def rows_position(position: dict, num_workers: int, origin: str = "the loader state") -> tuple[dict[int, int], int]:
    """``({worker: rows consumed}, next worker)`` of a Megatron-LM rows loader's ``position``, checked
    against the loader's ``num_workers`` (a ``ConfigError`` naming the key otherwise)."""
    if "workers" not in position:
        other = " (it is the position of an Energon loader)" if "energon" in position else ""
        raise ConfigError(f"{origin}: position has no 'workers' key{other}; {DAMAGED}")
    workers, nxt, streams = position["workers"], position.get("next_worker", 0), max(num_workers, 1)
    if not isinstance(workers, dict):
        raise ConfigError(f"{origin}: position.workers is {_kind(workers)}, not a mapping; {DAMAGED}")
    out = {}
    for key, rows in workers.items():
        worker = int(key) if isinstance(key, str) and key.isdigit() else None
        if worker is None or worker >= streams:
            raise ConfigError(f"{origin}: position.workers has worker {key!r}; this loader has {streams} worker "
                              f"stream(s) (loader.num_workers {num_workers}); {DAMAGED}")
        if not _count(rows):
            raise ConfigError(f"{origin}: position.workers.{key} is {_kind(rows)}, not a row count; {DAMAGED}")
        out[worker] = rows
    if not _count(nxt) or nxt >= streams:
        raise ConfigError(f"{origin}: position.next_worker is {_kind(nxt)}, not a worker below {streams}; {DAMAGED}")
    return out, nxt


def energon_position(position: dict, num_workers: int, origin: str = "the loader state") -> Any:
    """The decoded Energon ``SavableDataLoaderState`` (or None: saved before any worker started) of
    an Energon loader's ``position``: a ``ConfigError`` naming the entry when it does not decode or
    holds the states of another number of workers."""
    from megatron.energon.savable_loader import SavableDataLoaderState

    if "energon" not in position:
        other = " (it is the position of a Megatron-LM rows loader)" if "workers" in position else ""
        raise ConfigError(f"{origin}: position has no 'energon' key{other}; {DAMAGED}")
    try:
        state = decode_state(position["energon"], "position.energon")
    except (ValueError, TypeError, RecursionError) as e:
        raise ConfigError(f"{origin}: {_shorter(str(e))}; {DAMAGED}") from None
    if state is None:
        return None
    if not isinstance(state, SavableDataLoaderState):
        raise ConfigError(f"{origin}: position.energon is {_kind(state)}, not an Energon loader state; {DAMAGED}")
    states, streams = state.worker_states, max(num_workers, 1)
    if not isinstance(states, list) or len(states) != streams:
        n = len(states) if isinstance(states, list) else _kind(states)
        raise ConfigError(f"{origin}: position.energon holds the states of {n} worker stream(s); this loader has "
                          f"{streams} (loader.num_workers {num_workers}); {DAMAGED}")
    return state


def check_state_tree(dataset: Any, state: Any, path: str, origin: str = "the loader state") -> None:
    """What Energon asserts when a worker restores ``state`` into ``dataset`` (there, inside the
    worker, as a bare ``AssertionError``), checked here first: at every level the class name, the
    savable fields, and the number of inner datasets."""
    from megatron.energon.wrappers.base import BaseWrapperDataset

    name = type(dataset).__name__
    if not isinstance(state, dict) or state.get("__class__") != name:
        found = state.get("__class__") if isinstance(state, dict) else _kind(state)
        raise ConfigError(f"{origin}: {_shorter(path)} is the state of {found}, and the loader has a {name} "
                          f"there; {DAMAGED}")
    missing = [k for k in getattr(dataset, "_savable_fields", ()) if k not in state]
    if missing:
        raise ConfigError(f"{origin}: {path} ({name}) lacks {', '.join(missing)}; {DAMAGED}")
    if isinstance(dataset, BaseWrapperDataset) and "datasets" in state:
        inner = state["datasets"]
        if not isinstance(inner, list) or len(inner) != len(dataset.datasets):
            raise ConfigError(f"{origin}: {path}.datasets does not match the {len(dataset.datasets)} inner "
                              f"dataset(s) of {name}; {DAMAGED}")
        for i, (ds, sub) in enumerate(zip(dataset.datasets, inner)):
            check_state_tree(ds, sub, f"{path}.datasets[{i}]", origin)


def restore_energon(loader: Any, position: dict, origin: str = "the loader state") -> None:
    """Restore an Energon ``SavableDataLoader`` (before iterating) from ``position``; every failure
    (decoding, the structure Energon expects, ``restore_state_rank`` itself) is a ``ConfigError``."""
    import traceback

    from megatron.energon.savable_loader import SavableDatasetCheckpoint

    state = energon_position(position, loader.num_workers, origin)
    if state is not None and not loader.num_workers:      # the main process's whole tree
        check_state_tree(loader.dataset, state.worker_states[0], "position.energon.worker_states[0]", origin)
    elif state is not None:                                # per worker, restored in the worker
        for w, ckpt in enumerate(state.worker_states):
            if not isinstance(ckpt, SavableDatasetCheckpoint):
                raise ConfigError(f"{origin}: position.energon.worker_states[{w}] is {_kind(ckpt)}; {DAMAGED}")
            inner = getattr(ckpt.state, "dataset_state", None)
            if inner is not None:
                where = f"position.energon.worker_states[{w}].state.dataset_state"
                check_state_tree(loader.dataset.dataset, inner, where, origin)
    try:
        loader.restore_state_rank(state)
    except Exception as e:      # noqa: BLE001 - Energon asserts (often without a message) on a foreign state
        frame = traceback.extract_tb(e.__traceback__)[-1]
        raise ConfigError(f"{origin}: position.energon: Energon cannot restore it ({type(e).__name__} "
                          f"{str(e)[:200] or 'without a message'} at {Path(frame.filename).name}:{frame.lineno}); "
                          f"{DAMAGED}") from None


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
    except OSError as e:
        raise ConfigError(f"cannot read loader state {str(path)!r}: {e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ConfigError(f"loader state {path}: not valid JSON ({type(e).__name__}: {e}); the file is truncated "
                          "or damaged: restore it, or start without a state") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != VERSION:
        raise ConfigError(f"{path}: not an energon-nemotron loader state (version {VERSION})")
    return data


def merge_rank_states(states: list) -> dict:
    """One state from the states of all data-parallel ranks, to resume on another shape with
    ``Loader.load_state_dict(merged, elastic=True)`` (see :mod:`energon_nemotron.elastic`)."""
    from energon_nemotron.elastic import merge_rank_states as merge

    return merge(states)
