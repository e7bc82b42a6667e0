"""The Energon releases this surface is written against, checked when it is imported."""

from __future__ import annotations

import megatron.energon

from energon_nemotron.errors import ConfigError

#: the Energon releases this surface was written against and is tested with (``major.minor.patch``
#: lower bound inclusive, upper bound exclusive)
SUPPORTED = ((7, 4, 1), (7, 5, 0))

def _release(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts + [0] * (3 - len(parts)))


def check_version(version: str) -> None:
    """``ConfigError`` unless ``version`` (``megatron.energon.__version__``) is in :data:`SUPPORTED`."""
    low, high = SUPPORTED
    if version == "unknown" or not low <= _release(version) < high:
        shown = ".".join(map(str, low)), ".".join(map(str, high))
        raise ConfigError(f"megatron-energon {version} is installed; energon-nemotron relies on Energon internals "
                          f"tested with >={shown[0]},<{shown[1]} (docs/energon_surface.md): install "
                          f"'megatron-energon[av-decode]>={shown[0]},<{shown[1]}'")


check_version(megatron.energon.__version__)
