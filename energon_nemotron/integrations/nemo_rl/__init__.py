"""NeMo-RL adapters: a NeMo-RL SFT v2 master config as the library's loader config (``config``,
with ``interpolation``, ``walk`` and ``options``; registered for ``--nemo-rl`` in
``registry.CONFIG_READERS``), its train loader with NeMo-RL's checkpoint envelope (``loader``),
``PackedBatch`` as the batch dicts NeMo-RL's SFT policy reads (``batches``) and the
``nemo_rl_packed`` task-encoder output (``outputs``, registered by module name in
``registry.BATCH_OUTPUTS``).

Lazy (PEP 562): importing this package loads nothing; each name imports its module on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> the module of this package that defines it
_EXPORTS = {
    "to_nemo_rl_packed": "batches",
    "to_nemo_rl_megatron_rows": "batches",
    "token_aligned_mask": "batches",
    "from_nemo_rl": "config",
    "NemoRLConfig": "config",
    "build_nemo_rl_loader": "loader",
    "NemoRLLoader": "loader",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
