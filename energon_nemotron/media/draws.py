"""Random draws that are pure functions of where they are used: the loader seed, the dataset, the
sample key, the pass over the data (epoch, repetition), the media item and what the draw is for.

A draw never depends on which worker or rank reads the sample, on the order samples arrive in, or
on what was drawn before: the same sample gets the same draw for any ``num_workers`` and any
data-parallel size, a resumed loader draws what the first run drew, and the next pass draws anew.

The parts are hashed (BLAKE2b, 128 bits) into the key of a counter-based generator (numpy's
Philox), whose stream gives the values.
"""

from __future__ import annotations

import hashlib
from typing import Union

import numpy as np

__all__ = ["Part", "uniforms", "uniforms_f32"]

#: a part of what identifies a draw: (seed, dataset, sample key, pass, media index, purpose)
Part = Union[int, str]


def _generator(parts: tuple[Part, ...]) -> np.random.Generator:
    text = "\x1f".join(f"{type(p).__name__}:{p}" for p in parts)
    key = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=16).digest(), "little")
    return np.random.Generator(np.random.Philox(key=key))


def uniforms(key: tuple[Part, ...], n: int) -> np.ndarray:
    """``float64 [n]`` in ``[0, 1)``: the draws of ``key`` (53 random bits each)."""
    return _generator(tuple(key)).random(n)


def uniforms_f32(key: tuple[Part, ...], n: int) -> np.ndarray:
    """``float32 [n]`` in ``[0, 1)``, multiples of ``2**-24``: the values ``torch.rand(n)`` gives
    (24 random bits each), drawn from ``key``."""
    bits = _generator(tuple(key)).integers(0, 1 << 24, size=n, dtype=np.int64)
    return (bits.astype(np.float64) * 2.0 ** -24).astype(np.float32)
