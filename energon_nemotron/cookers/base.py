"""Shared cooker machinery: Energon ``Cooker``s by name, reading the JSON payload, subflavor flags."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from megatron.energon import Cooker

from energon_nemotron.cookers.selection import CookerSelection
from energon_nemotron.errors import ConfigError, DataError, sample_where  # noqa: F401  (re-exported)
from energon_nemotron.guards.json_safety import check_strings, parse_json
from energon_nemotron.registry import COOKERS
from energon_nemotron.types import MODALITIES, Message


def build_cookers(default_cooker: Optional[str] = None, rules: Optional[Sequence[dict]] = None) -> list[Cooker]:
    """Energon ``Cooker``s for the loader's cooker rules (``cookers.selection``): ``rules`` (the
    ``data.cookers`` list) in order, or one per registered name selected by ``subflavors.cooker``
    plus ``default_cooker`` (if given) for datasets whose subflavors name none."""
    return CookerSelection(rules, default_cooker).energon_cookers()


def payload(sample: dict, where: str) -> dict:
    """The JSON object of a crude sample: the ``json`` member of a WebDataset sample or the line
    of a JSONL dataset (decoded by Energon, or raw bytes/str when no decoder runs), checked by
    ``guards.json_safety`` (nesting limit before parsing; no NUL or lone surrogate in any string)."""
    keys = [k for k in sample if not k.startswith("__") and (k == "json" or k.endswith(".json"))]
    if not keys:
        members = sorted(k for k in sample if not k.startswith("__"))
        raise DataError(where, f"no .json member (members: {members})")
    value = sample[keys[0]]
    if isinstance(value, (bytes, bytearray, str)):
        value = parse_json(value, where, keys[0])
    else:
        check_strings(value, where)         # parsed by Energon (a JSONL line): its strings unchecked
    if not isinstance(value, dict):
        raise DataError(where, f"{keys[0]} must hold a JSON object, got {type(value).__name__}")
    return value


def subflavor_flag(sample: dict, name: str, where: str) -> bool:
    """A boolean subflavor (absent: False); anything but a real bool is an error."""
    value = (sample.get("__subflavors__") or {}).get(name, False)
    if not isinstance(value, bool):
        raise DataError(where, f"subflavor {name!r} must be true or false, got {value!r}")
    return value


def field_list(obj: dict, name: str, where: str) -> list:
    if name not in obj:
        raise DataError(where, f"missing {name!r} (keys: {sorted(obj)})")
    value = obj[name]
    if not isinstance(value, list) or not value:
        raise DataError(where, f"{name!r} must be a non-empty list, got {type(value).__name__}")
    return value


def text_of(value: Any, where: str, what: str) -> str:
    if not isinstance(value, str):
        raise DataError(where, f"{what} must be a string, got {type(value).__name__}")
    return value


def check_messages(messages: list[Message], where: str) -> list[Message]:
    """Every conversation needs an assistant turn, and assistant turns must not be empty (text,
    media, reasoning or tool calls)."""
    for i, m in enumerate(messages):
        if m.role == "assistant" and not m.text.strip() and not m.media_parts and not m.reasoning and not m.tool_calls:
            raise DataError(where, f"message {i} is an empty assistant turn", "empty_assistant")
    if not any(m.role == "assistant" for m in messages):
        raise DataError(where, "the conversation has no assistant turn", "no_assistant")
    return messages


def apply_last_turn_only(messages: list[Message]) -> None:
    """``train_only_on_last_assistant_turn``: only the last assistant turn keeps its loss (unless the
    data marks it untrained, e.g. OpenAI ``weight: 0``)."""
    last = max(i for i, m in enumerate(messages) if m.role == "assistant")
    for i, m in enumerate(messages):
        if m.role == "assistant":
            m.train = i == last and m.train is not False


#: Subflavor keys that every cooker reads: name -> type. Keys of the form ``__name__`` are Energon's
#: own (e.g. ``__subflavor__``) and always allowed.
#: ``media_source`` names the aux source holding a dataset's media, ``aux_data_prefixes`` maps path
#: prefixes to aux sources (``cookers.media_sources``).
COMMON_SUBFLAVORS: dict[str, type] = {"cooker": str, "skip_chat_template": bool, "media_source": str,
                                      "aux_data_prefixes": dict, "data_augment": bool}
#: subflavor values that are refused at start although of the right type: key -> (value, why)
REFUSED_SUBFLAVOR_VALUES: dict[str, tuple] = {}
#: The subflavor keys each registered cooker reads (``COMMON_SUBFLAVORS`` included), by cooker name;
#: filled by :func:`register`. The loader rejects any other key, and values of another type, at start.
COOKER_SUBFLAVORS: dict[str, dict[str, type]] = {}


@dataclass(frozen=True)
class CookerInfo:
    """What a registered cooker declares: the subflavor keys it reads (``COMMON_SUBFLAVORS``
    included), a text describing its sample schema, the media kinds its samples may hold
    (``modalities``) and those every one of its samples holds (``requires``; the loader checks the
    tokenizer's placeholder tokens for them at start)."""

    name: str
    subflavors: dict = field(default_factory=lambda: dict(COMMON_SUBFLAVORS))
    schema: str = ""
    modalities: tuple = MODALITIES
    requires: tuple = ()


#: What each cooker declared to :func:`register`, by name.
COOKER_INFO: dict[str, CookerInfo] = {}


def register(name: str, subflavors: Optional[dict[str, type]] = None, *, schema: str = "",
             modalities: Sequence[str] = MODALITIES, requires: Sequence[str] = ()) -> Callable:
    """Register a cook function (already ``@stateless``) under ``name`` (a decorator).

    ``subflavors`` declares the subflavor keys it reads beyond ``COMMON_SUBFLAVORS`` (name ->
    ``bool``/``str``/``int``/...); ``schema`` describes one sample (``energon-nemotron cookers``
    shows it; empty: the first paragraph of the cook function's docstring); ``modalities``: the
    media kinds (of ``types.MODALITIES``) its samples may hold; ``requires``: those every sample
    holds (a subset of ``modalities``). Other distributions call this from a module their
    ``energon_nemotron.cookers`` entry point names (see ``registry``)."""
    modalities, requires = tuple(modalities), tuple(requires)
    unknown = [m for m in modalities + requires if m not in MODALITIES]
    if unknown:
        raise ConfigError(f"cooker {name!r}: unknown modality {unknown[0]!r}; modalities are {', '.join(MODALITIES)}")
    if not set(requires) <= set(modalities):
        raise ConfigError(f"cooker {name!r}: requires {list(requires)} must be among its modalities {list(modalities)}")

    def add(fn: Callable) -> Callable:
        COOKERS.register(name, fn)                    # first: a duplicate name changes nothing below
        keys = {**COMMON_SUBFLAVORS, **(subflavors or {})}
        COOKER_SUBFLAVORS[name] = keys
        COOKER_INFO[name] = CookerInfo(name, keys, schema, modalities, requires)
        return fn

    return add


def cooker_info(name: str) -> CookerInfo:
    """The declarations of cooker ``name`` (``KeyError`` when unknown); a cooker put into
    ``COOKERS`` without :func:`register` declares the defaults (any modality, none required)."""
    COOKERS.get(name)
    return COOKER_INFO.get(name) or CookerInfo(name, dict(subflavor_keys(name)))


def describe_cooker(name: str) -> dict:
    """A cooker as ``energon-nemotron cookers`` lists it: name, origin (``built-in`` or the
    distribution of its entry point), schema text, subflavor keys with their types, modalities
    and requires."""
    info = cooker_info(name)
    schema = info.schema or (inspect.getdoc(COOKERS.get(name)) or "").split("\n\n")[0]
    return {"name": name, "origin": COOKERS.origin(name), "schema": " ".join(schema.split()),
            "subflavors": {k: getattr(t, "__name__", str(t)) for k, t in info.subflavors.items()},
            "modalities": list(info.modalities), "requires": list(info.requires)}


def subflavor_keys(cooker: str) -> dict[str, type]:
    """The subflavor keys (name -> type) that ``cooker`` reads; a cooker registered in ``COOKERS``
    without :func:`register` reads ``COMMON_SUBFLAVORS`` only."""
    COOKERS.names()                                    # imports the built-in cookers
    return COOKER_SUBFLAVORS.get(cooker, COMMON_SUBFLAVORS)
