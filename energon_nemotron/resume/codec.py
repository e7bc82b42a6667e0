"""Tagged JSON: values JSON has no type for, written as one-key objects (``{"__tuple__": [...]}``).

Two encodings share the tags. :func:`encode_state` / :func:`decode_state` write a loader state:
Energon's state is a tree of dataclasses, dicts, tuples, bytes, numpy arrays and torch tensors,
read back constructing only classes of ``megatron.energon`` (no arbitrary imports, no code
execution on load); every dict is a list of ``[key, value]`` pairs. :func:`encode_json` /
:func:`decode_json` write plain values (the TP broadcast's batch header, ``parallel.broadcast``):
only tuples and dicts whose keys are not plain strings are tagged.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import importlib
from typing import Any

import numpy as np
import torch

#: the classes a loader state may construct
ALLOWED_MODULES = ("megatron.energon.",)
#: the tags of a tuple and of a dict written as ``[key, value]`` pairs
TUPLE, DICT = "__tuple__", "__dict__"

__all__ = ["encode_state", "decode_state", "encode_json", "decode_json", "ALLOWED_MODULES", "TUPLE", "DICT"]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def encode_state(obj: Any) -> Any:
    """A JSON-able form of ``obj`` (see the module docstring)."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, tuple):
        return {TUPLE: [encode_state(x) for x in obj]}
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
            return {DICT: items}
        _check_allowed(name)
        return {DICT: items, "class": name}
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
    if TUPLE in data and isinstance(data[TUPLE], list):
        return tuple(decode_state(x, f"{path}[{i}]") for i, x in enumerate(data[TUPLE]))
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
    if DICT in data and isinstance(data[DICT], list):
        try:
            cls = _load_class(str(data["class"])) if "class" in data else dict
        except TypeError as e:
            raise TypeError(f"{path}: {e}") from None
        if not issubclass(cls, dict):
            raise TypeError(f"{path}: {cls.__qualname__} is not a mapping")
        out = cls()
        for i, item in enumerate(data[DICT]):
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


def encode_json(v: Any) -> Any:
    """A JSON value for plain ``v`` (tuples and dicts with other than plain string keys tagged,
    numpy scalars made Python); TypeError for anything else."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, list):
        return [encode_json(x) for x in v]
    if isinstance(v, tuple):
        return {TUPLE: [encode_json(x) for x in v]}
    if isinstance(v, dict):
        if all(isinstance(k, str) and k not in (TUPLE, DICT) for k in v):
            return {k: encode_json(x) for k, x in v.items()}
        return {DICT: [[encode_json(k), encode_json(x)] for k, x in v.items()]}
    raise TypeError(f"cannot write a {type(v).__name__} as tagged JSON (JSON values, tuples and dicts only)")


def decode_json(v: Any) -> Any:
    """Inverse of :func:`encode_json` (TypeError or ValueError when a tagged entry is malformed)."""
    if isinstance(v, list):
        return [decode_json(x) for x in v]
    if isinstance(v, dict):
        if len(v) == 1 and isinstance(v.get(TUPLE), list):
            return tuple(decode_json(x) for x in v[TUPLE])
        if len(v) == 1 and isinstance(v.get(DICT), list):
            return {decode_json(k): decode_json(x) for k, x in v[DICT]}
        return {k: decode_json(x) for k, x in v.items()}
    return v
