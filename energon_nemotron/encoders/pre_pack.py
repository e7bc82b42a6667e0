"""The encoder's pre-packer: one packing buffer → its packs, in emission order, and the samples
carried into the next buffer (``packing.balance``, ``packing.carry``; the pure parts are
``packing.balance``; docs/packing.md).

Given the buffer's tokenized samples and, in this library's packing stage, its
``_energon.BufferContext``: each sample's extra work (``CostModel``: attention over its segments,
vision patches, audio mel frames); the cap on a pack's extra work from the running cost sums the
context keeps (``packing.balance.cost_cap``); the registered packer under the token, count and cap
budgets, given the samples' work when it makes even bins (``packing.balance.even_packs``), with
under-filled packs carried (``packing.carry``; not from the last buffer) and whole packs carried
while that brings the buffer's work per token nearer the running mean (``even_buffers``); repeated
reads kept apart (``packing.distinct``); and the packs ordered by the step schedule
(``packing.balance.schedule``). Called without a context (another host of the encoder), nothing is
carried, the cap comes from the buffer alone and the schedule starts at the worker's first pack.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

from energon_nemotron.config import PackingConfig
from energon_nemotron.errors import ConfigError
from energon_nemotron.packing.balance import CarryRule, CostDensity, CostModel, plan_buffer, schedule_order
from energon_nemotron.packing.distinct import separate_repeats, source_id
from energon_nemotron.packing.spec import has_second_budget, makes_even_bins, packer_options
from energon_nemotron.types import EncodedSample

__all__ = ["BufferPacker", "sample_extra", "cost_model"]


def cost_model(packing: PackingConfig) -> CostModel:
    """The ``CostModel`` of ``packing.balance`` (the defaults without one)."""
    b = packing.balance
    return CostModel() if b is None else CostModel(b.attention, b.vision_patch, b.audio_frame)


def sample_extra(model: CostModel, sample: EncodedSample) -> float:
    """A tokenized sample's extra work (float, LLM token positions): its segments' attention, its
    vision patches, its audio items' mel frames."""
    frames = sum(sum(p.plan.frames) for p in sample.media_plans if p.modality == "audio")
    return model.extra([len(s.tokens) for s in sample.sources], sample.media_patches, frames)


def uses_cap(packing: PackingConfig, packer: Callable) -> bool:
    """Whether packs are capped by extra work: ``balance.cost_cap`` set, a packer with a second
    budget, and no ``max_media_patches_per_pack`` (then the patches are the second budget). A cap
    set explicitly that cannot apply is a ``ConfigError``."""
    b = packing.balance
    if b is None or b.cost_cap is None:
        return False
    why = None
    if packing.max_media_patches_per_pack:
        why = "max_media_patches_per_pack is the second budget"
    elif not has_second_budget(packer):
        why = f"packing.algorithm {packing.algorithm!r} has no second budget"
    if why is None:
        return True
    if "cost_cap" in b.model_fields_set:
        raise ConfigError(f"packing.balance.cost_cap: {why}; remove cost_cap (or set it null), or use a packer "
                          "with a second budget and no max_media_patches_per_pack")
    return False


class BufferPacker:
    """``(samples, context) -> packs`` for one buffer (see the module docstring)."""

    def __init__(self, packing: PackingConfig, packer: Callable, seq_length: int, carried_counter: Any = None) -> None:
        self.packing, self.packer, self.seq_length = packing, packer, seq_length
        self.model = cost_model(packing)
        self.capped = uses_cap(packing, packer)
        b = packing.balance
        self.even_packs = b is not None and b.even_packs and makes_even_bins(packer)
        self.even_buffers = b is not None and b.even_buffers
        self.carried_counter = carried_counter

    def __call__(self, samples: Sequence[EncodedSample], carried: Sequence[int], context: Optional[Any],
                 seed: int) -> list[list[EncodedSample]]:
        """The packs of the buffer ``samples`` (tokenized), in emission order; ``carried``: int per
        sample, times carried already; ``context``: the packing stage's ``BufferContext`` (its
        ``carry`` and ``density`` are set here) or None; ``seed``: the packer's."""
        p, L = self.packing, self.seq_length
        costs = [s.cost for s in samples]
        extras = [sample_extra(self.model, s) for s in samples]
        density = CostDensity(*context.density) if context is not None else CostDensity()
        density.add([e for e, t in zip(extras, carried) if t == 0], [c for c, t in zip(costs, carried) if t == 0])
        if context is not None:
            context.density[:] = density.state()
        options = packer_options(p, [s.media_patches for s in samples])
        cap = density.cap(L, p.balance.cost_cap) if self.capped else None
        whole = [math.ceil(e) for e in extras]
        if self.even_packs:
            options["work"] = extras
        rule = CarryRule(p.carry.max_times, p.carry.min_fill, density=density.per_token() if self.even_buffers else None) \
            if p.carry is not None and context is not None and not context.final else None
        plan = plan_buffer(self.packer, costs, L, extras=whole, cap=cap, carried=carried, carry=rule, seed=seed,
                           **options)
        if sorted([i for b in plan.bins for i in b] + plan.carry) != list(range(len(samples))):
            raise RuntimeError(f"packer {p.algorithm!r} did not place every sample exactly once")
        budget = {k: options[k] for k in ("secondary", "secondary_capacity") if k in options}
        if cap is not None:
            budget = {"secondary": whole, "secondary_capacity": cap}
        bins = separate_repeats(plan.bins, [source_id(s) for s in samples], costs, L, p.max_sequences_per_bin,
                                **budget)
        if p.balance is not None and p.balance.schedule and len(bins) > 1:
            where = (context.first_pack, context.worker, context.num_workers, context.batch_size) \
                if context is not None else (0, 0, 1, 1)
            order = schedule_order([sum(extras[i] for i in b) for b in bins], *where)
            bins = [bins[k] for k in order]
        if context is not None:
            context.carry = [(samples[i], carried[i] + 1) for i in plan.carry]
        if plan.carry and self.carried_counter is not None:
            self.carried_counter.add("carried", len(plan.carry))
        return [[samples[i] for i in b] for b in bins]
