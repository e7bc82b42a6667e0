"""energon-nemotron: raw multimodal SFT data to packed Megatron batches for Nemotron models.

The public names of the package, importable from here. They are loaded on first use (PEP 562):
importing any submodule imports this package first, so an eager façade would load the whole
library, Energon's loaders included, for ``import energon_nemotron.errors``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from energon_nemotron.version import __version__

#: public name -> the module that defines it
_EXPORTS = {
    # loading
    "build_train_loader": "energon_nemotron.loading", "build_val_loader": "energon_nemotron.loading",
    "build_task_encoder": "energon_nemotron.loading", "Loader": "energon_nemotron.loading",
    # configuration and registries
    "load_config": "energon_nemotron.config", "LoaderConfig": "energon_nemotron.config",
    "COOKERS": "energon_nemotron.registry", "PACKERS": "energon_nemotron.registry",
    "PROMPT_FORMATS": "energon_nemotron.registry", "TASK_ENCODERS": "energon_nemotron.registry",
    "MEGATRON_PROMPT_FORMATS": "energon_nemotron.registry", "MODEL_PRESETS": "energon_nemotron.registry",
    # the output type and its data
    "PackedBatch": "energon_nemotron.batch", "IGNORE_INDEX": "energon_nemotron.batch",
    "PackedTensor": "energon_nemotron.tensors", "DedupPackedTensor": "energon_nemotron.tensors",
    "Conversation": "energon_nemotron.types", "Message": "energon_nemotron.types", "MediaRef": "energon_nemotron.types",
    # errors
    "DataError": "energon_nemotron.errors", "ConfigError": "energon_nemotron.errors",
    "DatasetError": "energon_nemotron.errors", "MediaError": "energon_nemotron.errors",
    "SkipLimitError": "energon_nemotron.errors",
    "LoaderError": "energon_nemotron.errors",
    # resume
    "save_state_file": "energon_nemotron.resume", "load_state_file": "energon_nemotron.resume",
    "merge_rank_states": "energon_nemotron.resume",
    # the Megatron-LM prepacked path
    "MegatronSFTPackedEncoder": "energon_nemotron.megatron_packed",
    "MegatronSFTPackedDataset": "energon_nemotron.megatron_packed",
}

# what a type checker sees (the names above, with their real types); at run time they are loaded
# on first use by __getattr__ below
if TYPE_CHECKING:
    from energon_nemotron.loading import build_train_loader, build_val_loader, build_task_encoder, Loader
    from energon_nemotron.config import load_config, LoaderConfig
    from energon_nemotron.registry import (COOKERS, MEGATRON_PROMPT_FORMATS, MODEL_PRESETS, PACKERS, PROMPT_FORMATS,
                                           TASK_ENCODERS)
    from energon_nemotron.batch import PackedBatch, IGNORE_INDEX
    from energon_nemotron.tensors import PackedTensor, DedupPackedTensor
    from energon_nemotron.types import Conversation, Message, MediaRef
    from energon_nemotron.errors import DataError, ConfigError, DatasetError, MediaError, SkipLimitError, LoaderError
    from energon_nemotron.resume import save_state_file, load_state_file, merge_rank_states
    from energon_nemotron.megatron_packed import MegatronSFTPackedEncoder, MegatronSFTPackedDataset

#: written out (not derived from _EXPORTS) so that linters and type checkers read it; tests/test_typing.py
#: checks that it lists exactly the exports
__all__ = [
    "__version__", "build_train_loader", "build_val_loader", "build_task_encoder", "Loader", "load_config",
    "LoaderConfig", "COOKERS", "PACKERS", "PROMPT_FORMATS", "TASK_ENCODERS", "MEGATRON_PROMPT_FORMATS",
    "MODEL_PRESETS", "PackedBatch", "IGNORE_INDEX", "PackedTensor", "DedupPackedTensor", "Conversation",
    "Message", "MediaRef", "DataError", "ConfigError", "DatasetError", "MediaError", "SkipLimitError",
    "LoaderError", "save_state_file", "load_state_file", "merge_rank_states", "MegatronSFTPackedEncoder",
    "MegatronSFTPackedDataset",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'energon_nemotron' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
