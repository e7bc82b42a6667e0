"""Named registries: components are chosen by name (from YAML or the CLI), never imported by path.

A registry maps a name to a component (a function, a class or a spec object). Lookups of an
unknown name fail with the list of known names, so a typo in a config is a clear error.
"""

from __future__ import annotations

import importlib
from typing import Callable, Generic, Iterator, Sequence, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """A name → component map for one kind of component (e.g. "packer").

    ``builtins`` are the modules that register the library's own components; they are imported
    on first lookup, so a registry is complete however it is reached.
    """

    def __init__(self, kind: str, builtins: Sequence[str] = ()) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._builtins = list(builtins)

    def _load(self) -> None:
        while self._builtins:
            importlib.import_module(self._builtins.pop(0))

    def register(self, name: str, item: T | None = None):
        """Register ``item`` under ``name``; without ``item``, return a decorator."""

        def add(obj: T) -> T:
            if name in self._items:
                raise KeyError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj

        if item is None:
            return add
        return add(item)

    def get(self, name: str) -> T:
        self._load()
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items)) or "(none)"
            raise KeyError(f"unknown {self.kind} {name!r}; known: {known}") from None

    def names(self) -> list[str]:
        self._load()
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


#: Packing algorithms: ``fn(lengths, capacity, *, max_sequences_per_bin=None, seed=0) -> list[list[int]]``.
PACKERS: Registry[Callable] = Registry("packer", ["energon_nemotron.packing.algorithms",
                                                   "energon_nemotron.packing.refine"])
#: Energon-path prompt formats: ``cls(tokenizer)`` with ``render(messages, key)`` (``tokenization.formats``).
PROMPT_FORMATS: Registry = Registry("prompt format", ["energon_nemotron.tokenization.formats"])
#: Cookers: ``name -> cook function`` (``@stateless``; ``cookers/``).
COOKERS: Registry[Callable] = Registry("cooker", ["energon_nemotron.cookers.conversations",
                                                   "energon_nemotron.cookers.asr"])
#: Task encoders: ``name -> class`` with an ``Options`` pydantic model (``encoders/``).
TASK_ENCODERS: Registry = Registry("task encoder", ["energon_nemotron.encoders.nemotron_multimodal"])
#: Megatron-LM ``SFTTokenizer`` prompt formats (see ``megatron_packed.prompt_formats``).
MEGATRON_PROMPT_FORMATS: Registry = Registry("Megatron-LM SFT prompt format",
                                              ["energon_nemotron.megatron_packed.prompt_formats"])

#: Model presets: ``name -> integrations.presets.ModelPreset`` (the media layout a consumer model needs).
MODEL_PRESETS: Registry = Registry("model preset", ["energon_nemotron.integrations.presets"])
