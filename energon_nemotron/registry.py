"""Named registries: components are chosen by name (from YAML or the CLI), never imported by path.

A registry maps a name to a component (a function, a class or a spec object). Lookups of an
unknown name fail with the list of known names, so a typo in a config is a clear error.

Other installed packages may add components through an entry-point group (``COOKERS``:
``energon_nemotron.cookers``). Each entry point names a module, or a callable without required
arguments, that registers its components when loaded (importing the module; calling the callable
unless it is itself a registered component). The group is read once, lazily, on the first lookup;
a broken entry point is a ``ConfigError`` naming its distribution. Nothing is imported from a path
written in a config.

The library's own components are registered by the modules each registry lists by name (its
``builtins``), imported on the first lookup: a registry knows the whole package at run time
although no import statement says so, and the import graph (``make lint``) does not see these
links. That is how the core reaches the consumer adapters' batch outputs (``BATCH_OUTPUTS``)
while ``integrations/`` stays a leaf.
"""

from __future__ import annotations

import importlib
import inspect
import types
from typing import Any, Callable, Generic, Iterator, Optional, Sequence, TypeVar

from energon_nemotron.errors import ConfigError

T = TypeVar("T")
#: the origin of a component that the library itself registers
BUILT_IN = "built-in"


class Registry(Generic[T]):
    """A name → component map for one kind of component (e.g. "packer").

    ``builtins`` are the modules that register the library's own components; they are imported
    on first lookup, so a registry is complete however it is reached. ``entry_points`` names an
    entry-point group of other distributions (see the module docstring), loaded after the builtins
    on the same first lookup; each component remembers where it came from (:meth:`origin`).
    """

    def __init__(self, kind: str, builtins: Sequence[str] = (), entry_points: Optional[str] = None) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._origins: dict[str, str] = {}
        self._builtins = list(builtins)
        self.entry_point_group = entry_points
        self._pending_group = entry_points
        self._loading: Optional[str] = None          # the origin being loaded (re-entrant lookups see a partial view)
        self._failure: Optional[ConfigError] = None  # a broken entry point: raised again by every lookup

    def _load(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._loading is not None:
            return
        try:
            self._loading = BUILT_IN
            while self._builtins:
                importlib.import_module(self._builtins.pop(0))
            if self._pending_group is not None:
                group, self._pending_group = self._pending_group, None
                from importlib.metadata import entry_points

                for ep in sorted(entry_points(group=group), key=lambda e: (_dist_name(e), e.name)):
                    self._load_entry_point(ep, group)
        finally:
            self._loading = None

    def _load_entry_point(self, ep, group: str) -> None:
        """Import one entry point of ``group``; whatever it registers is attributed to its distribution."""
        dist = _dist_name(ep)
        self._loading = dist
        try:
            obj = ep.load()
            if not isinstance(obj, types.ModuleType) and not any(obj is v for v in self._items.values()):
                if not callable(obj) or _required_args(obj):
                    raise TypeError(f"{ep.value} is neither a module nor a callable without arguments "
                                    f"that registers the {self.kind}(s)")
                obj()
        except Exception as e:
            reason = e.args[0] if isinstance(e, KeyError) and e.args else e      # a KeyError's str() is quoted
            self._failure = ConfigError(
                f"{self.kind} entry point {ep.name!r} = {ep.value!r} (group {group}) of the distribution {dist} "
                f"failed to load: {type(e).__name__}: {reason}; fix or uninstall {dist}")
            raise self._failure from e
        finally:
            self._loading = BUILT_IN

    def register(self, name: str, item: T | None = None):
        """Register ``item`` under ``name``; without ``item``, return a decorator."""

        def add(obj: T) -> T:
            if name in self._items:
                raise KeyError(f"{self.kind} {name!r} is already registered (by {self._origins[name]})")
            self._items[name] = obj
            self._origins[name] = self._loading or _module_origin(obj)
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

    def origin(self, name: str) -> str:
        """Where ``name`` comes from: ``built-in``, the distribution of its entry point, or
        ``module M`` (registered by importing ``M`` outside both)."""
        self.get(name)
        return self._origins[name]

    def names(self) -> list[str]:
        self._load()
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


def _dist_name(ep) -> str:
    dist = getattr(ep, "dist", None)
    return dist.name if dist is not None else "(unknown distribution)"


def _required_args(fn: Callable) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
               for p in params)


def _module_origin(obj: object) -> str:
    module = getattr(obj, "__module__", None) or ""
    return BUILT_IN if module.split(".")[0] == "energon_nemotron" else f"module {module or '?'}"


#: Packing algorithms: ``fn(lengths, capacity, *, max_sequences_per_bin=None, seed=0) -> list[list[int]]``
#: (the protocol and the second budget: ``packing.spec``).
PACKERS: Registry[Callable[..., Any]] = Registry("packer", ["energon_nemotron.packing.algorithms",
                                                   "energon_nemotron.packing.refine",
                                                   "energon_nemotron.packing.knapsack",
                                                   "energon_nemotron.packing.concatenative",
                                                   "energon_nemotron.packing.modified_ffd"])
#: Energon-path prompt formats: ``cls(tokenizer)`` with ``render(messages, key)`` (``tokenization.formats``).
PROMPT_FORMATS: Registry[Any] = Registry("prompt format", ["energon_nemotron.tokenization.formats",
                                                     "energon_nemotron.tokenization.nemo_rl_formats"])
#: Cookers: ``name -> cook function`` (``@stateless``; ``cookers/``), plus those of other
#: distributions' ``energon_nemotron.cookers`` entry points (registered via ``cookers.base.register``).
COOKERS: Registry[Callable[..., Any]] = Registry("cooker", ["energon_nemotron.cookers.conversations",
                                                   "energon_nemotron.cookers.openai_messages",
                                                   "energon_nemotron.cookers.asr",
                                                   "energon_nemotron.cookers.nemotron_general",
                                                   "energon_nemotron.cookers.nano_messages",
                                                   "energon_nemotron.cookers.generic_conversation",
                                                   "energon_nemotron.cookers.legacy_conversations"],
                                       entry_points="energon_nemotron.cookers")
#: Task encoders: ``name -> class`` with an ``Options`` pydantic model (``encoders/``).
TASK_ENCODERS: Registry[Any] = Registry("task encoder", ["energon_nemotron.encoders.nemotron_multimodal"])
#: Megatron-LM ``SFTTokenizer`` prompt formats (see ``megatron_packed.prompt_formats``).
MEGATRON_PROMPT_FORMATS: Registry[Any] = Registry("Megatron-LM SFT prompt format",
                                              ["energon_nemotron.megatron_packed.prompt_formats"])

#: Model presets: ``name -> encoders.presets.ModelPreset`` (the media layout a consumer model needs).
MODEL_PRESETS: Registry[Any] = Registry("model preset", ["energon_nemotron.encoders.presets"])
#: What the task encoder's ``batch`` yields besides a ``PackedBatch`` (``task_encoder.options.output``):
#: ``name -> encoders.outputs.BatchOutput``. The built-in ones are the consumer adapters'
#: (``integrations/``), registered by module name: the one link from the core to ``integrations/``,
#: made at run time on the first lookup, never by an import.
BATCH_OUTPUTS: Registry = Registry("batch output", ["energon_nemotron.integrations.bridge_outputs", "energon_nemotron.integrations.nemo_rl.outputs"])
#: Other stacks' configuration files read as a ``LoaderConfig`` (the command line's ``--nemo-rl``):
#: ``name -> fn(path, tokenizer, dp_rank, dp_size) -> LoaderConfig``, registered by the consumer
#: adapters (``integrations/``) by module name, as ``BATCH_OUTPUTS``.
CONFIG_READERS: Registry = Registry("config reader", ["energon_nemotron.integrations.nemo_rl.config"])
