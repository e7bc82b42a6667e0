"""Balanced packs and carried tails: what one packing buffer becomes, as pure functions.

What makes data-parallel ranks wait for each other, and what wastes rows, is decided when a buffer
is packed (docs/packing.md has the figures):

- **Cost.** Every rank waits at each step for the slowest one. Packs of the same token count differ
  in cost: the vision encoder works per patch, the audio encoder per mel frame, attention grows with
  the square of each segment. :class:`CostModel` prices a sample's work beyond the row's LLM work
  (its *extra*, in units of one LLM token position); with a cap on every pack's extra, set at
  ``slack`` times the running mean extra per full pack (:class:`CostDensity`, the same on every rank
  once a few buffers have been read, since ranks read the same mix), no rank's pack is much dearer
  than the others', without any communication between ranks.
- **Order.** Packs still differ (a text-only pack against a pack of images, capped or not), so every
  rank emits each buffer's packs in an order set by one schedule that all ranks share: the data step a
  pack will be trained at (known from the worker's pack count: :func:`pack_step`) draws a quantile
  ``q = frac(step * 0.618...)`` (a low-discrepancy sequence), and the buffer's packs go to its slots
  by rank of cost against rank of ``q`` (:func:`schedule_order`). At one step every rank trains a
  pack of about the same quantile of its own buffer: dear packs meet dear packs.
- **Tails.** A buffer packed on its own ends in packs filled with whatever is left. The samples of
  such packs (token fill under ``min_fill``) are *carried* into the next buffer instead, at most
  ``max_times`` times each, then packed wherever they fall (:class:`CarryRule`, :func:`plan_buffer`).
- **Buffers.** A buffer's mean work per token differs across ranks (its few hundred samples' media
  share), and nothing done inside one buffer evens that out. So whole packs are carried too while
  that brings the buffer's emitted work per token nearer the running mean (``CarryRule.density``):
  a dear buffer holds some of its dearest packs back, a cheap one some of its cheapest, for the
  next buffer to pack with its own samples. Every token is still trained, a few buffers later.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np

__all__ = ["CostModel", "CostDensity", "CarryRule", "plan_buffer", "BufferPlan", "pack_step", "schedule_order"]

#: the golden ratio's fractional part: ``frac(k * GOLDEN)`` fills [0, 1) evenly for any run of k
GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


@dataclass(frozen=True)
class CostModel:
    """Training FLOPs of a pack's work beyond its LLM positions, in units of one LLM token position.

    The defaults are those of a Nemotron 3 Nano Omni-like model, forward and backward (6 FLOPs per
    parameter and token): an LLM of 3.2 B active parameters (1.92e10 FLOPs per position, every
    position of a row: padding goes through the layers too), of which 6 layers are attention with
    32 heads of 128 (2.95e5 FLOPs per causal query-key pair, s²/2 pairs in a segment of s tokens);
    a 0.63 B vision encoder (3.8e9 FLOPs per 16x16 patch); a 0.6 B audio encoder run on mel frames
    8x subsampled (3.6e9 FLOPs per encoder frame, 0.45e9 per 10 ms mel frame).

    - ``attention``: per squared segment length (tokens²).
    - ``vision_patch``: per vision patch (images and video frames).
    - ``audio_frame``: per audio mel frame.
    """

    attention: float = 7.68e-6
    vision_patch: float = 0.197
    audio_frame: float = 0.0234

    def extra(self, segment_lengths: Sequence[int], patches: int = 0, audio_frames: int = 0) -> float:
        """A sample's (or a pack's) extra work: its segments' attention, its vision patches and audio
        frames (float, token positions)."""
        squares = float(sum(int(s) * int(s) for s in segment_lengths))
        return self.attention * squares + self.vision_patch * patches + self.audio_frame * audio_frames

    def pack_cost(self, capacity: int, extra: float) -> float:
        """A pack's cost: the row's ``capacity`` LLM positions plus its ``extra`` (float)."""
        return float(capacity) + float(extra)


class CostDensity:
    """Running mean extra work per token of the samples packed so far (a savable pair of sums).

    ``cap(capacity, slack)`` is the extra-work budget of a pack: ``slack`` times the mean extra of a
    full pack of ``capacity`` tokens."""

    def __init__(self, extra: float = 0.0, tokens: int = 0) -> None:
        self.extra, self.tokens = float(extra), int(tokens)

    def add(self, extras: Sequence[float], lengths: Sequence[int]) -> None:
        self.extra += float(sum(extras))
        self.tokens += int(sum(int(n) for n in lengths))

    def per_token(self) -> Optional[float]:
        """The running mean extra work per token (float; None before any token was seen)."""
        return self.extra / self.tokens if self.tokens > 0 else None

    def cap(self, capacity: int, slack: float) -> Optional[int]:
        """int budget of extra work per pack (None before any token was seen, or with no extra work)."""
        mean = self.per_token()
        if mean is None or self.extra <= 0:
            return None
        return max(1, math.ceil(mean * capacity * slack))

    def state(self) -> list:
        return [self.extra, self.tokens]


@dataclass
class BufferPlan:
    """What :func:`plan_buffer` makes of a buffer: ``bins`` (item indices per pack, in emission
    order), ``carry`` (item indices carried into the next buffer, in buffer order) and the extra
    budget ``cap`` it packed under (None: none)."""

    bins: list[list[int]]
    carry: list[int]
    cap: Optional[int]


@dataclass(frozen=True)
class CarryRule:
    """Which samples leave a buffer for the next one: those of packs whose token fill is under
    ``min_fill`` (a fraction of the capacity), each at most ``max_times`` times, at most
    ``max_carried`` of a buffer (None: half of it)."""

    max_times: int
    min_fill: float
    max_carried: Optional[int] = None
    #: the work per token to even the buffer's emitted packs to (the running mean), or None: none
    density: Optional[float] = None


def plan_buffer(packer: Callable[..., list[list[int]]], lengths: Sequence[int], capacity: int, *,
                extras: Optional[Sequence[int]] = None, cap: Optional[int] = None,
                carried: Optional[Sequence[int]] = None, carry: Optional[CarryRule] = None,
                **options: Any) -> BufferPlan:
    """The packs of one buffer, and the samples carried out of it.

    Args:
        packer: a packer with a second budget (``packing.spec.TwoBudgetPacker``) when ``cap`` is set.
        lengths: int [N] packing costs (tokens) of the buffer's items.
        capacity: tokens per pack.
        extras: int [N] extra work of each item (``CostModel.extra``, rounded up); with ``cap``, the
            packer's second budget (an item over it alone gets a pack of its own); with
            ``carry.density``, what the emitted packs' work per token is evened by.
        cap: int extra-work budget per pack, or None (no cost balance).
        carried: int [N] times each item was carried already (None: all 0).
        carry: the :class:`CarryRule`, or None: nothing is carried (also for the last buffer of a
            source: there is no next buffer).
        options: further packer keyword arguments (``max_sequences_per_bin``, ``seed``, ...).

    Returns:
        :class:`BufferPlan`: every index in exactly one of ``bins`` and ``carry``; at least one bin
        when the buffer is not empty. Carried are whole packs, as the packer made them: the least
        filled first, then (``carry.density``) those that even the buffer's work per token out.
    """
    n = len(lengths)
    if cap is not None:
        options = dict(options, secondary=[int(e) for e in extras], secondary_capacity=int(cap))
    bins = packer(lengths, capacity, **options) if n else []
    if carry is None or carry.max_times <= 0 or len(bins) < 2:
        return BufferPlan(bins, [], cap)
    times = np.zeros(n, dtype=np.int64) if carried is None else np.asarray(carried, dtype=np.int64)
    sizes = np.asarray(lengths, dtype=np.int64)
    limit = n // 2 if carry.max_carried is None else carry.max_carried
    fills = [(int(sizes[b].sum()) / capacity, k) for k, b in enumerate(bins)]
    chosen: set[int] = set()
    count = 0
    for fill, k in sorted(fills):
        if fill >= carry.min_fill or len(chosen) == len(bins) - 1:
            break
        b = bins[k]
        if int(times[b].max()) >= carry.max_times or count + len(b) > limit:
            continue
        chosen.add(k)
        count += len(b)
    if carry.density is not None and extras is not None:
        chosen |= _even_density(bins, chosen, sizes, np.asarray(extras, dtype=np.float64), times, carry,
                                limit - count)
    out = sorted(i for k in chosen for i in bins[k])
    return BufferPlan([b for k, b in enumerate(bins) if k not in chosen], out, cap)


def _even_density(bins: list[list[int]], chosen: set[int], sizes: np.ndarray, extras: np.ndarray,
                  times: np.ndarray, carry: CarryRule, room: int) -> set[int]:
    """More packs (indices into ``bins``, not in ``chosen``) to carry: one at a time, the pack whose
    removal brings the work per token of the packs left nearest ``carry.density``, while that is
    nearer than before; within ``room`` samples, none carried ``max_times`` already, one pack left."""
    left = [k for k in range(len(bins)) if k not in chosen]
    tokens = [float(sizes[bins[k]].sum()) for k in left]
    work = [float(extras[bins[k]].sum()) for k in left]
    total, extra, goal = sum(tokens), sum(work), float(carry.density)
    more: set[int] = set()
    while len(left) - len(more) > 1:
        gap, best = abs(extra / total - goal), None
        for j, k in enumerate(left):
            b = bins[k]
            if k in more or len(b) > room or int(times[b].max()) >= carry.max_times:
                continue
            after = abs((extra - work[j]) / (total - tokens[j]) - goal)
            if after < gap:
                gap, best = after, j
        if best is None:
            break
        more.add(left[best])
        room -= len(bins[left[best]])
        total, extra = total - tokens[best], extra - work[best]
    return more


def pack_step(pack_index: int, worker: int, num_workers: int, batch_size: int) -> int:
    """The rank's data step (batch number) of a worker's ``pack_index``-th pack: Energon's loader
    yields the batches of its ``num_workers`` workers in turn (logical worker ids, kept across a
    restore), each batch ``batch_size`` consecutive packs of one worker."""
    return (pack_index // batch_size) * max(num_workers, 1) + worker


def schedule_order(costs: Sequence[float], first_pack: int, worker: int, num_workers: int,
                   batch_size: int) -> list[int]:
    """The order in which to emit a buffer's packs (indices into ``costs``, float [P]: each pack's
    cost) so that the ``i``-th emitted, the worker's pack number ``first_pack + i``, has the cost
    rank within the buffer that its step's quantile ``frac(step * GOLDEN)`` has among the buffer's
    slots (ties: the earlier slot, the earlier pack). Every rank, with the same schedule, emits
    packs of about the same quantile of its buffer at the same step."""
    n = len(costs)
    steps = [pack_step(first_pack + i, worker, num_workers, batch_size) for i in range(n)]
    slots = sorted(range(n), key=lambda i: ((steps[i] * GOLDEN) % 1.0, i))
    packs = sorted(range(n), key=lambda k: (float(costs[k]), k))
    order = [0] * n
    for slot, pack in zip(slots, packs):
        order[slot] = pack
    return order
