"""Megatron-Bridge 0.6.2's *training setup* code (its real ``ConfigContainer``, data loaders and
``training.setup``) on megatron-core 0.19.2 in a Python 3.11 process: ``bridge_runtime.activate()``
plus what those modules need beyond the steps.

:func:`activate_setup` must run first in a fresh process. On top of ``activate()`` it:

- drops ``activate()``'s type-only stand-ins for ``megatron.bridge.training.config`` and
  ``...training.state``, so Bridge's real ``ConfigContainer`` / ``TrainState`` are imported;
- answers five third-party packages with *import-only* stand-ins (every attribute a placeholder
  class, nothing callable that does work): ``datasets`` (Hugging Face datasets: Bridge's HF SFT
  builders, imported by ``training.config``, never run on the Energon path), ``omegaconf``
  (YAML round-trips of configs, not used by ``validate()``), ``tensorboard`` and
  ``torch.utils.tensorboard`` (``training.state``'s logger writers, not created here) and
  ``modelopt`` (``training.checkpointing``'s ModelOpt state, imported by ``training.setup``);
  they replace ``activate()``'s ``modelopt`` stand-ins, which ``setup`` needs more of;
- runs the real ``__init__`` of two Bridge packages whose re-exports ``training.config`` and
  ``data.loaders`` import (``data.packing``, ``data.builders``) — ``import_bridge_module`` runs no
  package ``__init__`` — and sets ``megatron.bridge.models.GPTModelProvider`` / ``T5ModelProvider``
  from their own modules (the models package ``__init__`` imports every model and Transformer
  Engine).

Every other module is Bridge's and megatron-core's own, unchanged. A missing cache raises ``RuntimeError``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from pathlib import Path

from references.bridge import bridge_root, import_bridge_module
from references.bridge_runtime import activate

#: third-party packages answered with import-only stand-ins (see the module docs)
STAND_INS = ("datasets", "omegaconf", "tensorboard", "torch.utils.tensorboard", "modelopt")
#: Bridge packages whose own ``__init__`` is run for their re-exports
PACKAGE_INITS = ("megatron.bridge.data.packing", "megatron.bridge.data.builders")
#: names of ``megatron.bridge.models`` that ``training.config`` imports, and their modules
MODEL_EXPORTS = {"GPTModelProvider": "megatron.bridge.models.gpt_provider",
                 "T5ModelProvider": "megatron.bridge.models.t5_provider"}


class _ImportOnly(types.ModuleType):
    """A stand-in package: any attribute is a placeholder class named after it."""

    __stand_in__ = True

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (), {"__module__": self.__name__})
        setattr(self, name, value)
        return value


class _ImportOnlyLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return _ImportOnly(spec.name)

    def exec_module(self, module):
        module.__path__ = []


class _StandInFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if any(fullname == name or fullname.startswith(name + ".") for name in STAND_INS):
            return importlib.machinery.ModuleSpec(fullname, _ImportOnlyLoader(), is_package=True)
        return None


def _run_package_init(name: str) -> None:
    module = importlib.import_module(name)
    init = bridge_root().joinpath(*name.split("."), "__init__.py")
    exec(compile(init.read_text(), str(init), "exec"), module.__dict__)


def activate_setup() -> types.ModuleType:
    """Install the above; returns Bridge's real ``megatron.bridge.training.config``."""
    if getattr(sys.modules.get("megatron.bridge.training.config"), "ConfigContainer", None) is not None and \
            not getattr(sys.modules["megatron.bridge.training.config"], "__stand_in__", False):
        return sys.modules["megatron.bridge.training.config"]
    activate()
    for name in list(sys.modules):
        if name in ("megatron.bridge.training.config", "megatron.bridge.training.state") or \
                name.split(".")[0] == "modelopt":
            del sys.modules[name]
    if not any(isinstance(f, _StandInFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _StandInFinder())
    import_bridge_module("megatron.bridge.data.base")           # installs the bare-package finder
    for name in PACKAGE_INITS:
        _run_package_init(name)
    models = importlib.import_module("megatron.bridge.models")
    for attr, module in MODEL_EXPORTS.items():
        setattr(models, attr, getattr(import_bridge_module(module), attr))
    config = import_bridge_module("megatron.bridge.training.config")
    if Path(config.__file__).resolve().parent != (bridge_root() / "megatron" / "bridge" / "training").resolve():
        raise RuntimeError(f"megatron.bridge.training.config came from {config.__file__}")
    return config
