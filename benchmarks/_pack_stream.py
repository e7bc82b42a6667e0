"""The loader's per-buffer packing, run as a stream of buffers on synthetic samples.

What the task encoder's pre-packer does for every buffer (``encoders.pre_pack.BufferPacker``, the
very code, with the packing stage's ``BufferContext``: carried samples back at the buffer's front,
the running cost sums, the worker's pack count), without Energon's reader or any media: samples
are stand-ins holding what the pre-packer reads (token cost, segment length, vision patches, audio
mel frames). Used by ``dp_balance.py`` (straggler ratios) and ``packing.py`` (tail fill).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Iterator, Optional

import numpy as np

from energon_nemotron._energon import BufferContext
from energon_nemotron.config import PackingConfig
from energon_nemotron.encoders.pre_pack import BufferPacker, cost_model, sample_extra
from energon_nemotron.registry import PACKERS


@dataclass
class Item:
    """A stand-in for a tokenized sample (what ``BufferPacker`` reads of an ``EncodedSample``)."""

    __key__: str
    cost: int
    sources: list
    media_patches: int
    media_plans: list


def make_item(key: str, tokens: int, patches: int = 0, mel_frames: int = 0) -> Item:
    plans = [SimpleNamespace(modality="audio", plan=SimpleNamespace(frames=(int(mel_frames),)))] if mel_frames else []
    return Item(key, int(tokens), [SimpleNamespace(tokens=range(int(tokens)))], int(patches), plans)


def omni_mix(n: int, rng, seq_length: int) -> list[tuple[int, int, int]]:
    """``n`` samples ``(tokens, vision patches, audio mel frames)`` of a Nemotron Omni SFT mix: 55 %
    text (lognormal, median 600, sigma 1.0), 25 % 1-12 images (geometric count, 64-1024 tokens
    each, 4 patches a token) with text, 10 % temporal video (1,000-8,000 visual tokens), 10 % audio
    of 1 s to 10 min (log-uniform; 12.5 tokens and 100 mel frames a second) with text; capped at
    ``seq_length``."""
    kind = rng.choice(4, size=n, p=[0.55, 0.25, 0.10, 0.10])
    text = np.maximum(np.rint(rng.lognormal(math.log(600), 1.0, size=n)), 16).astype(np.int64)
    images = np.minimum(rng.geometric(0.45, size=n), 12)
    image_tokens = np.array([int(rng.integers(64, 1025, size=k).sum()) for k in images])
    video_tokens = rng.integers(1000, 8001, size=n)
    seconds = np.exp(rng.uniform(0.0, math.log(600.0), size=n))
    audio_tokens = np.where(kind == 3, np.ceil(seconds * 12.5).astype(np.int64), 0)
    visual = np.where(kind == 1, image_tokens, np.where(kind == 2, video_tokens, 0))
    tokens = np.minimum(text + visual + audio_tokens, seq_length)
    mel = np.where(kind == 3, np.ceil(seconds * 100).astype(np.int64), 0)
    return list(zip(tokens.tolist(), (4 * visual).tolist(), mel.tolist()))


@dataclass
class Pack:
    tokens: int
    cost: float


class Worker:
    """One worker's packing stage over a stream of samples: ``draw(n)`` gives up to ``n`` more
    ``(tokens, patches, mel frames)`` and whether the stream has ended with them."""

    def __init__(self, packing: PackingConfig, seq_length: int, draw, worker: int = 0, num_workers: int = 1,
                 batch_size: int = 1) -> None:
        self.packing, self.L, self.draw = packing, seq_length, draw
        self.packer = BufferPacker(packing, PACKERS.get(packing.algorithm), seq_length)
        self.model = cost_model(packing)
        self.where = (worker, num_workers, batch_size)
        self.buffer: list[Item] = []
        self.carried: list[int] = []
        self.density: list = [0.0, 0]
        self.planned = 0
        self.count = 0

    def buffers(self) -> Iterator[list[Pack]]:
        """The packs of each next buffer, in emission order, until the stream has ended and every
        sample is in a pack (the last buffer carries nothing)."""
        while True:
            drawn, ended = self.draw(self.packing.buffer_size - len(self.buffer))
            fresh = [make_item(f"s{self.count + i}", *x) for i, x in enumerate(drawn)]
            if not fresh and not self.buffer:
                return
            self.count += len(fresh)
            samples = self.buffer + fresh
            carried = self.carried + [0] * len(fresh)
            context = BufferContext(list(carried), ended, self.planned, *self.where, self.density)
            packs = self.packer(samples, carried, context, seed=0)
            self.buffer = [s for s, _ in context.carry]
            self.carried = [t for _, t in context.carry]
            self.planned += len(packs)
            yield [Pack(sum(s.cost for s in p), self.model.pack_cost(self.L, sum(sample_extra(self.model, s) for s in p)))
                   for p in packs]


def rank_steps(packing: PackingConfig, seq_length: int, steps: int, rng, num_workers: int = 1,
               warmup: int = 0, mix=omni_mix) -> np.ndarray:
    """float [steps] cost of one rank's batches (batch size 1), its workers taking turns, after
    ``warmup`` steps."""
    workers = [Worker(packing, seq_length, lambda n: (mix(n, rng, seq_length), False), w, num_workers)
               for w in range(num_workers)]
    streams = [_flat(w.buffers()) for w in workers]
    out = [next(streams[j % num_workers]) for j in range(warmup + steps)][warmup:]
    return np.array([p.cost for p in out])


def _flat(buffers: Iterator[list[Pack]]) -> Iterator[Pack]:
    for packs in buffers:
        yield from packs


def fill_of(packing: PackingConfig, seq_length: int, samples: list[tuple[int, int, int]]) -> float:
    """Token fill of one worker packing ``samples`` (``(tokens, vision patches, audio mel frames)``
    each) as a stream of buffers (:class:`Worker`), until every sample is in a pack."""
    at = 0

    def draw(n: int) -> tuple[list, bool]:
        nonlocal at
        out = samples[at:at + n]
        at += len(out)
        return out, at >= len(samples)

    packs = [p for buffer in Worker(packing, seq_length, draw).buffers() for p in buffer]
    return sum(p.tokens for p in packs) / (len(packs) * seq_length)
