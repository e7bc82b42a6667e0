"""Megatron-Bridge 0.6.2 on megatron-core 0.19.2 inside a Python 3.11 process, with the smallest shims.

Both need Python 3.12 and newer packages than the project's ``.venv`` holds; their wheels are pure
Python where the checked code runs. ``make references`` fetches them (``fetch_wheel.sh``) into
``.cache/references``. :func:`activate` must run first in a fresh
process (never inside the pytest process, which has the ``.venv``'s megatron-core 0.16.1 loaded):

- megatron-core 0.19.2's folder goes first on ``sys.path``, so ``megatron.core`` (and
  ``megatron.training``) come from it; ``megatron`` stays a namespace package;
- ``typing.override`` is backported (Python 3.12; used as a decorator only);
- ``megatron.core.transformer.moe.ops.paged_stash``, a Triton kernel module that megatron-core
  imports unconditionally, is a stand-in whose kernels raise if called (none is, on this path);
- type-only stand-ins for four modules the checked steps import for annotations and for code paths
  that never run here: ``megatron.bridge.training.config`` (``ConfigContainer``; the real one
  imports ``datasets`` and Transformer Engine through Bridge's data builders),
  ``megatron.bridge.training.state`` (``GlobalState``; imports tensorboard),
  ``megatron.bridge.training.utils.flop_utils`` (FLOP accounting in ``gpt_step``'s forward, which
  imports Transformer Engine through Bridge's LoRA layers) and ``modelopt.torch.distill``
  (knowledge distillation, ``gpt_step.forward_step_modelopt`` only).
  Each raises if instantiated or called.

Bridge's own modules are imported without running their package ``__init__``s
(``references.bridge.import_bridge_module``). A missing cache raises ``RuntimeError``.
"""

from __future__ import annotations

import sys
import types
import typing
from pathlib import Path

from references.bridge import references_dir

MCORE_VERSION = "0.19.2"


def mcore_root() -> Path:
    root = references_dir() / f"megatron_core-{MCORE_VERSION}"
    if not (root / ".fetched").is_file() or not (root / "megatron" / "core").is_dir():
        raise RuntimeError(f"megatron-core {MCORE_VERSION} reference code is missing from {root}; "
                           "run `make references` (tests/references/fetch_wheel.sh) to fetch it")
    return root


class _TypeOnly:
    """A class that exists for annotations only."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError(f"{type(self).__qualname__} is a type-only stand-in (tests/references/bridge_runtime.py)")


def _never(name: str):
    def call(*args, **kwargs):
        raise RuntimeError(f"{name} is a stand-in and must not be called (tests/references/bridge_runtime.py)")
    return call


def _lazy_never(prefix: str):
    """A module ``__getattr__``: every public name is a type-only class (it may be subclassed;
    instantiating or calling it raises)."""
    def getattr_(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (_TypeOnly,), {"__module__": prefix})
    return getattr_


def _module(name: str, **attrs) -> None:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    module.__stand_in__ = True
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent in sys.modules:
        setattr(sys.modules[parent], child, module)


def activate() -> None:
    """Make ``import megatron.core`` give megatron-core 0.19.2 and install the shims (see module docs)."""
    if "megatron.core" in sys.modules:
        loaded = Path(sys.modules["megatron.core"].__file__).resolve()
        if mcore_root().resolve() not in loaded.parents:
            raise RuntimeError(f"megatron.core is already imported from {loaded}; activate() must run first")
        return
    sys.path.insert(0, str(mcore_root()))
    if not hasattr(typing, "override"):
        typing.override = lambda f: f
    _module("megatron.core.transformer.moe.ops.paged_stash", GLOBAL_BLOCK_SIZE=0,
            paged_stash_copy_kernel=_never("paged_stash_copy_kernel"),
            paged_stash_pop_kernel=_never("paged_stash_pop_kernel"))
    config = type("ConfigContainer", (_TypeOnly,), {})
    state = type("GlobalState", (_TypeOnly,), {})
    _module("megatron.bridge.training.config", ConfigContainer=config)
    _module("megatron.bridge.training.state", GlobalState=state)
    _module("megatron.bridge.training.utils.flop_utils", accumulate_flops_metadata=_never("accumulate_flops_metadata"),
            get_model_chunk_vp_stage=_never("get_model_chunk_vp_stage"))
    _module("modelopt")
    _module("modelopt.torch")
    _module("modelopt.torch.distill", __getattr__=_lazy_never("modelopt.torch.distill"))
    _module("modelopt.torch.distill.plugins")
    _module("modelopt.torch.distill.plugins.megatron", __getattr__=_lazy_never("modelopt.torch.distill.plugins.megatron"))
    import megatron.core

    if megatron.core.__version__.split("+")[0] != MCORE_VERSION:
        raise RuntimeError(f"megatron.core {megatron.core.__version__} imported, expected {MCORE_VERSION}")
