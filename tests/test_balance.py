"""Packs balanced across ranks and carried buffer tails (``packing.balance``, ``packing.carry``).

The pure parts (``packing.balance``) against independent checks; the real loader over prepared
datasets for the rest: each sample exactly once per epoch with samples carried, exact resume from
every point (carried samples pending), the step schedule's turn against Energon's own, and the
switches that turn each part off.
"""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
import torch

from energon_data import rest_after, text_config
from energon_nemotron._energon import batch_worker
from energon_nemotron.config import PackingConfig
from energon_nemotron.demo.datasets import text_dataset
from energon_nemotron.errors import ConfigError
from energon_nemotron.loading import build_train_loader
from energon_nemotron.packing import first_fit_decreasing, minimum_bin_slack
from energon_nemotron.packing.balance import GOLDEN, CarryRule, CostDensity, CostModel, pack_step, plan_buffer, schedule_order

N = 40


pytestmark = pytest.mark.usefixtures("quick_worker_shutdown")


# -- the pure parts ---------------------------------------------------------------------------------

def test_plan_buffer_places_every_sample_once_and_carries_within_its_bounds():
    rng = random.Random(5)
    carried_any = 0
    for trial in range(300):
        n = rng.randint(0, 40)
        lengths = [rng.randint(1, 900) for _ in range(n)]
        times = [rng.choice([0, 0, 0, 1, 2]) for _ in range(n)]
        max_carry, min_fill = rng.choice([0, 1, 2, 3]), rng.choice([0.5, 0.9, 1.0])
        final = rng.random() < 0.2
        rule = None if final else CarryRule(max_carry, min_fill, rng.choice([None, 3]))
        plan = plan_buffer(first_fit_decreasing, lengths, 1000, carried=times, carry=rule)
        placed = sorted([i for b in plan.bins for i in b] + plan.carry)
        assert placed == list(range(n)), trial
        assert all(b for b in plan.bins) and (bool(plan.bins) or n == 0)
        if final or max_carry == 0:
            assert plan.carry == []
        for i in plan.carry:                           # under its bound, out of an under-filled pack
            assert times[i] < max_carry
        packed = first_fit_decreasing(lengths, 1000) if n else []
        carried_bins = [b for b in packed if set(b) <= set(plan.carry)]
        assert sorted(i for b in carried_bins for i in b) == plan.carry       # whole packs, as the packer made them
        assert all(sum(lengths[i] for i in b) < min_fill * 1000 for b in carried_bins)
        carried_any += len(plan.carry)
    assert carried_any > 0


def test_the_cost_cap_bounds_every_pack_but_a_sample_over_it_alone():
    rng = random.Random(2)
    for _ in range(100):
        n = rng.randint(1, 60)
        lengths = [rng.randint(1, 3000) for _ in range(n)]
        extras = [rng.choice([0, 0, rng.randint(1, 800)]) for _ in range(n)]
        cap = rng.randint(200, 1500)
        plan = plan_buffer(minimum_bin_slack, lengths, 4096, extras=extras, cap=cap)
        for b in plan.bins:
            assert sum(lengths[i] for i in b) <= 4096 or len(b) == 1
            assert sum(extras[i] for i in b) <= cap or len(b) == 1


def test_cost_model_and_density():
    model = CostModel(attention=1e-3, vision_patch=0.5, audio_frame=0.25)
    assert model.extra([10, 20], patches=4, audio_frames=8) == pytest.approx(1e-3 * 500 + 2 + 2)
    assert model.pack_cost(100, 7.5) == 107.5
    density = CostDensity()
    assert density.cap(1000, 1.0) is None
    density.add([10.0, 30.0], [100, 300])
    assert density.cap(1000, 1.0) == 100 and density.cap(1000, 1.5) == 150
    assert CostDensity(*density.state()).cap(1000, 1.0) == 100


@pytest.mark.parametrize("workers,batch", [(1, 1), (2, 1), (3, 2)])
def test_schedule_order_gives_each_step_the_cost_rank_of_its_quantile(workers, batch):
    rng = random.Random(workers * 10 + batch)
    for first in (0, 7, 1000):
        for worker in range(workers):
            costs = [rng.random() for _ in range(rng.randint(1, 30))]
            order = schedule_order(costs, first, worker, workers, batch)
            assert sorted(order) == list(range(len(costs)))
            steps = [(first + i) // batch * workers + worker for i in range(len(costs))]
            q = [math.modf(s * GOLDEN)[0] for s in steps]
            for i, pack in enumerate(order):           # the slot's quantile rank is the pack's cost rank
                slot_rank = sum(1 for j in range(len(q)) if (q[j], j) < (q[i], i))
                cost_rank = sum(1 for k in range(len(costs)) if (costs[k], k) < (costs[pack], pack))
                assert slot_rank == cost_rank
            assert [pack_step(first + i, worker, workers, batch) for i in range(len(costs))] == steps


def test_two_ranks_on_the_schedule_train_packs_of_matching_cost():
    """Two ranks with buffers of the same distribution: at each step the costs they emit are far
    closer than in buffer order."""
    rng = random.Random(9)
    gaps = {"schedule": [], "buffer order": []}
    for start in range(0, 600, 30):
        a, b = sorted(rng.random() for _ in range(30)), sorted(rng.random() for _ in range(30))
        rng.shuffle(a)
        rng.shuffle(b)
        oa, ob = schedule_order(a, start, 0, 1, 1), schedule_order(b, start, 0, 1, 1)
        gaps["schedule"] += [abs(a[i] - b[j]) for i, j in zip(oa, ob)]
        gaps["buffer order"] += [abs(x - y) for x, y in zip(a, b)]
    assert sum(gaps["schedule"]) < 0.25 * sum(gaps["buffer order"])


# -- in the loader ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("balance")
    _, keys = text_dataset(root / "t", "general_conversations", N, seed=4, per_shard=7)
    return root, keys


def config(root, workers=0, **packing):
    p = {"algorithm": "minimum_bin_slack", "buffer_size": 8, "carry": {"min_fill": 0.95, "max_times": 2}, **packing}
    return text_config(root / "t", workers=workers, packing=p, seq_length=1024, shuffle_buffer_size=5)


def keys_of(batch) -> list[str]:
    return [k for row in batch.sample_keys for k in row]


def same(a, b) -> bool:
    return a.sample_keys == b.sample_keys and all(torch.equal(getattr(a, f), getattr(b, f))
                                                  for f in ("tokens", "labels", "loss_mask", "position_ids"))


@pytest.mark.parametrize("workers", [0, 2])
def test_each_sample_once_per_epoch_with_samples_carried(data, workers):
    root, keys = data
    for packing in ({}, {"carry": None}, {"balance": None, "carry": None}):
        loader = build_train_loader(config(root, workers, **packing), repeat=False)
        seen = Counter(k for batch in loader for k in keys_of(batch))
        assert seen == Counter(keys), packing
        carried = loader.telemetry()["carried"]
        assert (carried > 0) == (packing.get("carry", True) is not None), (packing, carried)


@pytest.mark.parametrize("workers", [0, 2])
def test_exact_resume_from_every_point_with_carried_samples_pending(data, workers):
    from energon_nemotron._energon import CarryingPackingDataset

    root, _ = data
    cfg = config(root, workers)
    whole = build_train_loader(cfg, repeat=False)
    states, batches, pending = [whole.state_dict()], [], []
    for batch in whole:
        batches.append(batch)
        states.append(whole.state_dict())
        if workers == 0:                        # the stage lives in this process: is a sample carried now?
            stage = next(n for n in _nodes(whole.dataset) if isinstance(n, CarryingPackingDataset))
            pending.append(bool(stage._carried))
    points = range(len(batches)) if workers == 0 else range(0, len(batches), 3)
    for k in points:
        rest = rest_after(cfg, states[k])
        assert len(rest) == len(batches) - k and all(same(a, b) for a, b in zip(rest, batches[k:])), k
    assert whole.telemetry()["carried"] > 0
    assert workers or sum(pending) >= 2          # several of the states hold carried samples


def test_a_state_holds_carried_samples_by_restore_key(data):
    """A state saved while carried samples wait in the reading buffer names them (restore keys in
    Energon's reading buffer, their carry counts beside)."""
    from energon_nemotron._energon import CarryingPackingDataset, savable_fields

    root, _ = data
    assert {"_carried", "_density", "_packs_planned"} <= set(savable_fields(CarryingPackingDataset))
    loader = build_train_loader(config(root, 0), repeat=False)
    found = False
    for _ in loader:
        stage = next(n for n in _nodes(loader.dataset) if isinstance(n, CarryingPackingDataset))
        if stage._carried:
            state = stage.save_state()
            assert len(state["_carried"]) == len(stage._carried) and all(t >= 1 for t in state["_carried"])
            found = True
            break
    assert found


def _nodes(dataset):
    from energon_nemotron._energon import inner_datasets

    return [dataset] + [n for child in inner_datasets(dataset) for n in _nodes(child)]


def test_the_schedule_follows_energons_turn_of_workers(data):
    """The schedule's step of a pack (``pack_step``) assumes Energon yields its workers' batches in
    turn, by logical worker id, also after a restore: checked on the real loader."""
    root, _ = data
    cfg = config(root, 2)
    loader = build_train_loader(cfg, repeat=True)
    it = iter(loader)
    first = [batch_worker(next(it).__restore_key__)[0] % 2 for _ in range(6)]
    state = loader.state_dict()
    again = build_train_loader(cfg, repeat=True)
    again.load_state_dict(state)
    it2 = iter(again)
    after = [batch_worker(next(it2).__restore_key__)[0] % 2 for _ in range(4)]
    assert first + after == [j % 2 for j in range(10)]


def test_switching_balance_and_carry_off_packs_as_the_packer_does():
    from conftest import DEMO_TOKENIZER
    from energon_nemotron.encoders import NemotronMultimodalTaskEncoder
    from energon_nemotron.types import EncodedSample

    costs = [300, 200, 120, 100, 90, 40, 30, 8]
    samples = [EncodedSample(__key__=f"s{i}", __restore_key__=(), sources=[], cost=c) for i, c in enumerate(costs)]
    off = PackingConfig(algorithm="first_fit_decreasing", buffer_size=8, balance=None, carry=None)
    enc = NemotronMultimodalTaskEncoder(DEMO_TOKENIZER, {"seq_length": 512}, packing=off)
    packs = [[int(s.__key__[1:]) for s in p] for p in enc.select_samples_to_pack(samples)]
    assert packs == first_fit_decreasing(costs, 512)


def test_a_cost_cap_that_cannot_apply_is_refused():
    from conftest import DEMO_TOKENIZER
    from energon_nemotron.encoders import NemotronMultimodalTaskEncoder

    for packing in ({"algorithm": "first_fit_decreasing", "balance": {"cost_cap": 1.2}},
                    {"max_media_patches_per_pack": 4096, "balance": {"cost_cap": 1.0}}):
        with pytest.raises(ConfigError, match="packing.balance.cost_cap"):
            NemotronMultimodalTaskEncoder(DEMO_TOKENIZER, {"seq_length": 512}, packing=PackingConfig(**packing))
    # unset, the cap just does not apply there
    NemotronMultimodalTaskEncoder(DEMO_TOKENIZER, {"seq_length": 512},
                                  packing=PackingConfig(algorithm="first_fit_decreasing"))


def test_step_cost_telemetry_counts_what_the_pre_packer_planned(tmp_path, monkeypatch):
    """A batch's cost in the loader's telemetry (``batch_cost``: from the batch's segments, image
    grids and audio frames) equals the row positions plus the extra work the pre-packer planned for
    its samples from their headers (``sample_extra``): phase 1 and the batch agree."""
    from energon_nemotron.demo.datasets import multimodal_dataset
    from energon_nemotron.encoders import pre_pack
    from energon_nemotron.loading.stats import batch_cost

    multimodal_dataset(tmp_path / "mm", n=15, per_shard=5)
    planned = planned_extras(monkeypatch)
    config = text_config(tmp_path / "mm", workers=0, packing={"algorithm": "minimum_bin_slack", "buffer_size": 6},
                         seq_length=4096)
    config["task_encoder"]["options"].update({"image": {"min_patches": 64, "max_patches": 256},
                                              "video": {"target_patches": 64, "min_frames": 2, "max_frames": 4}})
    loader = build_train_loader(config, repeat=False)
    model = pre_pack.cost_model(loader_packing(config))
    costs, visual, audio = [], 0, 0
    for batch in loader:
        want = batch.batch_size * batch.seq_length + sum(planned[k] for k in keys_of(batch))
        assert batch_cost(batch, model) == pytest.approx(want, rel=1e-9)
        costs.append(batch_cost(batch, model))
        visual += batch.media.num_visual
        audio += batch.media.num_audio
    assert visual > 0 and audio > 0                       # images, videos and audio were priced
    stats = loader.telemetry()["step_cost"]
    assert stats["mean"] == pytest.approx(sum(costs) / len(costs), abs=0.1)
    assert stats["max_over_mean"] == pytest.approx(max(costs) / (sum(costs) / len(costs)), abs=1e-4)


def planned_extras(monkeypatch) -> dict:
    """key -> the extra cost the pre-packer plans for the sample (``pre_pack.sample_extra``), filled
    as the loader (in this process) plans."""
    from energon_nemotron.encoders import pre_pack

    planned = {}
    original = pre_pack.sample_extra

    def spy(model, sample):
        planned[sample.__key__] = original(model, sample)
        return planned[sample.__key__]

    monkeypatch.setattr(pre_pack, "sample_extra", spy)
    return planned


def loader_packing(config) -> PackingConfig:
    return PackingConfig(**config["packing"])


@pytest.mark.slow
def test_ranks_of_the_real_loader_meet_at_closer_step_costs(tmp_path):
    """Four data-parallel ranks of the real loader over the demo's multimodal samples (text, images,
    video, audio): with the defaults (the step schedule, carried tails) the straggler ratio of their
    batches' costs (``batch_cost``, max over ranks ÷ mean, per step) is lower than with
    ``balance: null, carry: null``, the packs of the same buffers in the packer's order."""
    from energon_nemotron.demo.datasets import multimodal_dataset
    from energon_nemotron.encoders.pre_pack import cost_model
    from energon_nemotron.loading.stats import batch_cost

    multimodal_dataset(tmp_path / "mm", n=80, per_shard=10)
    ratios = {}
    for name, packing in (("off", {"balance": None, "carry": None}), ("defaults", {})):
        p = {"algorithm": "minimum_bin_slack", "buffer_size": 16, **packing}
        cfg = text_config(tmp_path / "mm", workers=0, packing=p, seq_length=4096, shuffle_buffer_size=20)
        cfg["task_encoder"]["options"].update({"image": {"min_patches": 64, "max_patches": 1024},
                                               "video": {"target_patches": 256, "min_frames": 2, "max_frames": 8}})
        model = cost_model(PackingConfig(**p))
        per_rank = []
        for rank in range(4):
            it = iter(build_train_loader(cfg, repeat=True, dp_rank=rank, dp_size=4))
            per_rank.append([batch_cost(next(it), model) for _ in range(60)])
        steps = list(zip(*per_rank))
        ratios[name] = sum(max(s) / (sum(s) / len(s)) for s in steps) / len(steps)
    assert ratios["defaults"] < ratios["off"] - 0.01, ratios
