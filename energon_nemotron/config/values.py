"""The value-type vocabulary of every config message: how a value and its YAML kind are shown
(:func:`describe_value`), a predicate per annotation (:func:`type_check`), the check of a mapping
against a dataclass's fields (:func:`check_dataclass_values`), used by the loader config, the task
encoder's options and the cookers' subflavors alike, and a count of bytes (:func:`byte_count`)."""

from __future__ import annotations

import dataclasses
import math
import re
import types
from fractions import Fraction
import typing
from typing import Any, Callable, Literal, Union

from energon_nemotron.errors import ConfigError

__all__ = ["describe_value", "type_check", "check_dataclass_values", "byte_count"]


def describe_value(value: Any) -> str:
    """How errors show a value and its YAML kind: ``'2' (a string)``, ``[2] (a list)``, ``null``."""
    if value is None:
        return "null"
    kinds = ((bool, "a boolean"), (int, "an integer"), (float, "a number"), (str, "a string"),
             ((list, tuple), "a list"), (dict, "a mapping"))
    kind = next((k for t, k in kinds if isinstance(value, t)), f"a {type(value).__name__}")
    shown = repr(value)
    return f"{shown if len(shown) <= 60 else shown[:57] + '...'} ({kind})"


def type_check(tp: Any, classes: bool = False) -> tuple[Callable[[Any], bool], str]:
    """A predicate for values of the annotation ``tp`` and how to say it ("a number"): the one
    vocabulary of value types that config, option and subflavor messages use (no coercion: ``"2"``
    is not a number; an int is one). Annotations other than bool/int/float/str, Literal and
    Optional/Union of them are not checked, except a plain class with ``classes`` (``isinstance``)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return (lambda v: any(type(v) is type(a) and v == a for a in args)), "one of " + ", ".join(map(repr, args))
    if origin is Union or origin is types.UnionType:
        arms = [type_check(a, classes) for a in args if a is not type(None)]
        none_ok = type(None) in args
        text = " or ".join(t for _, t in arms) + (" or null" if none_ok else "")
        return (lambda v: (none_ok and v is None) or any(ok(v) for ok, _ in arms)), text
    plain = {bool: (lambda v: isinstance(v, bool), "true or false"),
             int: (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
             float: (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
             str: (lambda v: isinstance(v, str), "a string")}
    if tp in plain:
        return plain[tp]
    if classes and isinstance(tp, type):
        return (lambda v: isinstance(v, tp)), tp.__name__
    return (lambda v: True), "anything"


def check_dataclass_values(cls: type, values: dict, where: str) -> None:
    """``ConfigError`` unless ``values`` suit the dataclass ``cls``: known keys only, each value of
    its annotated type (no coercion: ``"2"`` is not a number; an int is a float), and every number
    finite and > 0, or >= the field's ``metadata["min"]`` when it has one. ``where`` names the
    mapping (``task_encoder.options.video``)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = [k for k in values if k not in fields]
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; valid keys: {', '.join(fields)}")
    hints = typing.get_type_hints(cls)
    for name, value in values.items():
        ok, expected = type_check(hints[name])
        if not ok(value):
            raise ConfigError(f"{where}.{name}: expected {expected}, got {describe_value(value)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{where}.{name}: expected a finite number, got {value}")
        low = fields[name].metadata.get("min")
        if low is None and not value > 0:
            raise ConfigError(f"{where}.{name}: must be > 0, got {value}")
        if low is not None and value < low:
            raise ConfigError(f"{where}.{name}: must be >= {low}, got {value}")


#: units of a size string, case-insensitive: decimal (kB = 1000 B) and binary (KiB = 1024 B), as
#: pydantic's ByteSize reads them (a config that parsed before still parses to the same count)
_UNITS = {"b": 1, **{f"{p}b": 1000 ** i for i, p in enumerate("kmgtpe", 1)},
          **{f"{p}ib": 1024 ** i for i, p in enumerate("kmgtpe", 1)},
          **{p: 1000 ** i for i, p in enumerate("kmgtpe", 1)}}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*", re.IGNORECASE)
BYTES_WANTED = 'a whole number of bytes >= 0, or a size such as "2GiB" or "500MB"'


def byte_count(value: Any) -> int:
    """A count of bytes from a config value: an int >= 0, a whole float (YAML's ``1e9``), or a size
    string (``"2GiB"``, ``"1.5 MiB"``, ``"500MB"``, ``"4096"``) whose value is a whole number of bytes.
    ``ValueError`` names what was expected and what came for a negative or fractional count
    (``-1``, ``1.5``, ``"1.5"``, ``"0.3KiB"``), a boolean, an unknown unit or other text."""
    got = f"got {describe_value(value)}"
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"expected {BYTES_WANTED}; {got}")
    if isinstance(value, str):
        m = _SIZE.fullmatch(value)
        if not m or m.group(2).lower() not in _UNITS | {"": 1}:
            raise ValueError(f"expected {BYTES_WANTED}; {got}")
        exact = Fraction(m.group(1)) * (_UNITS.get(m.group(2).lower(), 1))
    elif isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"must be {BYTES_WANTED}; {got}")
    else:
        exact = Fraction(value)
    if exact < 0 or exact.denominator != 1:
        raise ValueError(f"must be {BYTES_WANTED}; {got}, which is "
                         f"{'negative' if exact < 0 else f'not a whole number of bytes ({float(exact):g})'}")
    return int(exact)
