"""Packs of even work: inside a buffer (``minimum_bin_slack``'s ``work``: the bins' work near the
buffer's mean, as full as without it) and across buffers (``CarryRule.density``: whole packs
carried so that a buffer's emitted work per token comes nearer the running mean)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from energon_nemotron.config import PackingConfig
from energon_nemotron.encoders.pre_pack import BufferPacker
from energon_nemotron.packing import minimum_bin_slack
from energon_nemotron.packing.balance import CarryRule, CostModel, plan_buffer
from energon_nemotron.packing.spec import makes_even_bins
from energon_nemotron.registry import PACKERS

L = 16384
MODEL = CostModel()


def media_buffer(n: int, seed: int) -> tuple[list[int], list[float]]:
    """``n`` items (tokens, extra work) of a media-heavy mix: 60 % text (lognormal, median 600),
    25 % images (1-4 of 64-1024 tokens, 4 patches a token) with text, 15 % video (1,000-8,000
    tokens, 4 patches a token)."""
    rng = np.random.default_rng(seed)
    tokens, work = [], []
    for _ in range(n):
        kind = rng.choice(3, p=[0.6, 0.25, 0.15])
        text = max(16, int(rng.lognormal(math.log(600), 1.0)))
        visual = 0 if kind == 0 else int(rng.integers(64, 1025, size=int(rng.integers(1, 5))).sum()) if kind == 1 \
            else int(rng.integers(1000, 8001))
        t = min(text + visual, L)
        tokens.append(t)
        work.append(MODEL.extra([t], patches=4 * visual))
    return tokens, work


def work_of(bins: list[list[int]], work: list[float]) -> np.ndarray:
    return np.array([sum(work[i] for i in b) for b in bins])


def fill_of(bins: list[list[int]], tokens: list[int]) -> float:
    return sum(tokens[i] for b in bins for i in b) / (len(bins) * L)


def test_even_bins_are_as_many_as_the_plain_ones_and_far_narrower_in_work():
    assert makes_even_bins(PACKERS.get("minimum_bin_slack"))
    assert not makes_even_bins(PACKERS.get("best_fit_decreasing"))
    spread_plain, spread_even = [], []
    for seed in range(12):
        tokens, work = media_buffer(256, seed)
        plain = minimum_bin_slack(tokens, L)
        even = minimum_bin_slack(tokens, L, work=work)
        assert sorted(i for b in even for i in b) == list(range(len(tokens)))
        assert all(sum(tokens[i] for i in b) <= L for b in even)
        # as many bins as the plain packer, so the same fill: the slack is spread, not left at the end
        assert len(even) == len(plain) and fill_of(even, tokens) == fill_of(plain, tokens)
        # the work of all bins but the last two (what is left at the end)
        spread_plain.append(np.std(work_of(plain[:-2], work)) / np.mean(work_of(plain[:-2], work)))
        spread_even.append(np.std(work_of(even[:-2], work)) / np.mean(work_of(even[:-2], work)))
    assert np.mean(spread_even) < 0.5 * np.mean(spread_plain), (np.mean(spread_even), np.mean(spread_plain))


def test_even_bins_keep_the_count_and_second_budgets_and_are_deterministic():
    tokens, work = media_buffer(200, 3)
    patches = [int(w / MODEL.vision_patch) for w in work]
    bins = minimum_bin_slack(tokens, L, work=work, max_sequences_per_bin=12, secondary=patches,
                             secondary_capacity=40000)
    assert sorted(i for b in bins for i in b) == list(range(len(tokens)))
    assert all(len(b) <= 12 for b in bins)
    assert all(sum(patches[i] for i in b) <= 40000 or len(b) == 1 for b in bins)
    assert bins == minimum_bin_slack(tokens, L, work=work, max_sequences_per_bin=12, secondary=patches,
                                     secondary_capacity=40000)


@pytest.mark.parametrize("work", [[1.0, 2.0], [1.0, -1.0, 0.0]])
def test_work_must_be_one_non_negative_figure_per_item(work):
    with pytest.raises(ValueError, match="work"):
        minimum_bin_slack([5, 6, 7], 10, work=work)


def given(bins: list[list[int]]):
    """A packer that returns ``bins`` (the carry rule is then tested alone)."""
    return lambda lengths, capacity, **_: [list(b) for b in bins]


def test_a_dear_buffer_carries_its_dearest_pack_and_a_cheap_one_its_cheapest():
    lengths = [10] * 8                                   # four full packs of two
    bins = [[0, 1], [2, 3], [4, 5], [6, 7]]
    extras = [1, 1, 2, 2, 3, 3, 9, 9]                    # work per token of the packs: 0.1, 0.2, 0.3, 0.9
    dear = plan_buffer(given(bins), lengths, 20, extras=extras,
                       carry=CarryRule(max_times=4, min_fill=0.5, density=0.2))
    assert dear.carry == [6, 7] and [6, 7] not in dear.bins    # 0.375 -> 0.2: the 0.9 pack waits
    cheap = plan_buffer(given(bins), lengths, 20, extras=extras,
                        carry=CarryRule(max_times=4, min_fill=0.5, density=0.47))
    assert cheap.carry == [0, 1]                           # 0.375 -> 0.467; then without the 0.2 pack: 0.6
    near = plan_buffer(given(bins), lengths, 20, extras=extras,
                       carry=CarryRule(max_times=4, min_fill=0.5, density=0.375))
    assert near.carry == []                                # already at the running mean
    plain = plan_buffer(given(bins), lengths, 20, extras=extras, carry=CarryRule(max_times=4, min_fill=0.5))
    assert plain.carry == []                               # no density: only under-filled packs


def test_the_density_carry_keeps_the_carry_bounds_and_one_pack():
    lengths = [10] * 8
    bins = [[0, 1], [2, 3], [4, 5], [6, 7]]
    extras = [1, 1, 2, 2, 3, 3, 9, 9]
    worn = plan_buffer(given(bins), lengths, 20, extras=extras, carried=[0, 0, 0, 0, 0, 0, 4, 0],
                       carry=CarryRule(max_times=4, min_fill=0.5, density=0.2))
    assert [6, 7] in worn.bins and worn.carry == []        # carried 4 times already: packed; any other pack
    #                                                        carried would take the buffer farther from 0.2
    tight = plan_buffer(given(bins), lengths, 20, extras=extras,
                        carry=CarryRule(max_times=4, min_fill=0.5, density=0.0, max_carried=2))
    assert tight.carry == [6, 7]                           # at most 2 samples carried
    alone = plan_buffer(given(bins), lengths, 20, extras=extras,
                        carry=CarryRule(max_times=4, min_fill=0.5, density=0.0, max_carried=8))
    assert len(alone.bins) == 1 and alone.bins == [[0, 1]]    # one pack always stays


def test_the_pre_packer_evens_by_default_and_packs_by_tokens_with_both_off():
    """The defaults give the packer the samples' work and carry by density (only with a context);
    ``even_packs: false`` packs as the packer does on tokens alone."""
    from types import SimpleNamespace

    tokens, work = media_buffer(256, 7)
    samples = [SimpleNamespace(__key__=f"s{i}", cost=t, sources=[SimpleNamespace(tokens=range(t))],
                               media_patches=int(round((w - MODEL.attention * t * t) / MODEL.vision_patch)),
                               media_plans=[]) for i, (t, w) in enumerate(zip(tokens, work))]
    off = PackingConfig(balance={"schedule": False, "even_packs": False, "even_buffers": False}, carry=None)
    on = PackingConfig(balance={"schedule": False}, carry=None)
    packer = PACKERS.get("minimum_bin_slack")
    plain = BufferPacker(off, packer, L)(samples, [0] * len(samples), None, seed=0)
    assert [[s.__key__ for s in p] for p in plain] == \
        [[f"s{i}" for i in b] for b in minimum_bin_slack(tokens, L)]
    even = BufferPacker(on, packer, L)(samples, [0] * len(samples), None, seed=0)
    assert sorted(s.__key__ for p in even for s in p) == sorted(s.__key__ for s in samples)
    cost = [sum(MODEL.extra([s.cost], s.media_patches) for s in p) for p in even[:-2]]
    base = [sum(MODEL.extra([s.cost], s.media_patches) for s in p) for p in plain[:-2]]
    assert np.std(cost) < 0.5 * np.std(base)
