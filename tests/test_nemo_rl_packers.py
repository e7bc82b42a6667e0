"""NeMo-RL's packers by their names: the library's bins against NeMo-RL's own (fixture
``tests/fixtures/nemo_rl/packing.json``, made by ``make_packing.py`` from NeMo-RL's code), and the
packer protocol on the packers added for them.

Equal bin for bin wherever NeMo-RL is not defective. Where it is, the test asserts the library's
documented behaviour and that the two differ by that defect only:

- ``balanced_greedy_knapsack`` at ``rohitrango-split`` returns the ``delta`` bins it left empty:
  its non-empty bins are the library's;
- a count limit NeMo-RL ignores (``rohitrango-split``'s knapsacks; ``nvidia-7ea279ab``'s first-fit
  packers and MFFD, which have no limit): NeMo-RL's bins are the library's without the limit,
  the library's honour it;
- an oversized length: NeMo-RL raises ``ValueError``; the library places it alone (its contract);
- ``modified_first_fit_decreasing`` with a limit no bin can reach (``k >= min(N, capacity)``):
  NeMo-RL switches to its FFD all the same; the library runs MFFD (a limit that cannot bind
  changes nothing, as for every library packer).

One convention differs and is not a defect: NeMo-RL's ``first_fit_decreasing`` sorts ``(length,
index)`` pairs in reverse, so equal lengths go last index first; the library's sort is stable
(first index first). The bins are then the same slot for slot once equal-length indices are
matched in those two orders (:func:`tie_relabel`); the same holds for NeMo-RL's MFFD with a count
limit, which is its FFD.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energon_nemotron.packing import (balanced_greedy_knapsack, concatenative, first_fit_decreasing,
                                      greedy_knapsack, modified_first_fit_decreasing)
from energon_nemotron.registry import PACKERS

FIXTURE = Path(__file__).parent / "fixtures" / "nemo_rl" / "packing.json"
DATA = json.loads(FIXTURE.read_text(encoding="utf-8"))
CASES = DATA["cases"]
NEMO_RL_NAMES = ["concatenative", "first_fit_decreasing", "first_fit_shuffle", "modified_first_fit_decreasing",
                 "greedy_knapsack", "balanced_greedy_knapsack"]
NEW_PACKERS = ["concatenative", "greedy_knapsack", "modified_first_fit_decreasing", "balanced_greedy_knapsack"]


def tie_relabel(lengths: list[int], bins: list[list[int]]) -> list[list[int]]:
    """NeMo-RL FFD bins with each index replaced by the one the library places in its slot: the
    j-th item in decreasing (length, index) order becomes the j-th in decreasing length, stable."""
    nemo = sorted(range(len(lengths)), key=lambda i: (-lengths[i], -i))
    ours = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    to_ours = dict(zip(nemo, ours))
    return [[to_ours[i] for i in b] for b in bins]


def library(name: str, case: dict, k="case", delta=None) -> list[list[int]]:
    k = case["max_sequences_per_bin"] if k == "case" else k
    extra = {} if delta is None else {"balanced_knapsack_delta": delta}
    return PACKERS.get(name)(case["lengths"], case["capacity"], max_sequences_per_bin=k, seed=case["seed"], **extra)


def check_protocol(lengths, capacity, k, bins):
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))      # every index once
    assert all(bins)                                                             # no empty bin
    for b in bins:
        assert sum(lengths[i] for i in b) <= capacity or len(b) == 1            # capacity, or one oversized
        assert k is None or len(b) <= k
    for i, s in enumerate(lengths):
        if s > capacity:
            assert [i] in bins                                                   # oversized: alone


def results(revision: str, key: str):
    for case in CASES:
        yield case, case["results"][revision][key]


def test_fixture_records_its_sources():
    meta = DATA["meta"]
    assert set(meta["sources"]) == {"nvidia-7ea279ab", "nvidia-42c11bb7", "rohitrango-split"}
    for files in meta["sources"].values():
        for f in files:
            assert f["repository"] in ("NVIDIA-NeMo/RL", "rohitrango/NeMo-RL") and len(f["commit"]) == 40
            assert f["path"].startswith("nemo_rl/data/packing/") and len(f["sha256"]) == 64
    assert "random.seed" in meta["seed_protocol"]
    assert "/tmp" not in FIXTURE.read_text(encoding="utf-8") and "/work" not in meta["command"]
    sizes = [len(c["lengths"]) for c in CASES]
    assert len(CASES) >= 200 and min(sizes) == 0 and max(sizes) >= 250
    assert {c["max_sequences_per_bin"] for c in CASES} >= {None, 1, 2, 16}


def test_count_limit_record():
    """``meta.count_limit_held`` is what the cases show: the limit holds in every case at 42c11bb7,
    and fails in some for the packers that ignore it."""
    held = DATA["meta"]["count_limit_held"]
    for rev, got in held.items():
        for key, record in got.items():
            capped = [(c["max_sequences_per_bin"], c["results"][rev][key]) for c in CASES
                      if c["max_sequences_per_bin"] is not None and isinstance(c["results"][rev][key], list)]
            assert record == {"cases": len(capped), "held": sum(all(len(b) <= k for b in bins) for k, bins in capped)}
            ignores = rev == "rohitrango-split" or (rev == "nvidia-7ea279ab" and key != "concatenative")
            assert (record["held"] < record["cases"]) == ignores, (rev, key)


def test_every_nemo_rl_name_is_registered():
    assert set(NEMO_RL_NAMES) <= set(PACKERS.names())


def _oversized(case) -> bool:
    return any(s > case["capacity"] for s in case["lengths"])


def _refused(case, nemo) -> bool:
    """NeMo-RL raised: only for an oversized length; the library places it (protocol)."""
    if not isinstance(nemo, dict):
        return False
    assert nemo["error"] == "ValueError" and "exceeds bin capacity" in nemo["message"] and _oversized(case)
    return True


@pytest.mark.parametrize("key", ["concatenative", "first_fit_decreasing", "first_fit_shuffle",
                                 "modified_first_fit_decreasing", "greedy_knapsack",
                                 "balanced_greedy_knapsack/delta=0", "balanced_greedy_knapsack/delta=2",
                                 "balanced_greedy_knapsack/delta=5", "balanced_greedy_knapsack/delta=20"])
def test_equal_to_nemo_rl_42c11bb7(key):
    """The revision with every name and the count limit through ``get_packer``: equal (FFD, and
    MFFD with a limit: after the tie relabeling), the limit honoured by both."""
    name, _, delta = key.partition("/delta=")
    refused = unreachable = 0
    for case, nemo in results("nvidia-42c11bb7", key):
        ours = library(name, case, delta=int(delta) if delta else None)
        check_protocol(case["lengths"], case["capacity"], case["max_sequences_per_bin"], ours)
        if _refused(case, nemo):
            refused += 1
            continue
        k = case["max_sequences_per_bin"]
        if name == "modified_first_fit_decreasing" and k is not None and k >= min(len(case["lengths"]),
                                                                                  case["capacity"]):
            # a limit no bin can reach: NeMo-RL still switches to its FFD (defect); the library runs MFFD
            assert tie_relabel(case["lengths"], nemo) == first_fit_decreasing(case["lengths"], case["capacity"],
                                                                              max_sequences_per_bin=k)
            assert ours == library(name, case, k=None)
            unreachable += 1
            continue
        ffd_path = name == "first_fit_decreasing" or (name == "modified_first_fit_decreasing" and k is not None)
        assert ours == (tie_relabel(case["lengths"], nemo) if ffd_path else nemo), case["id"]
    assert refused >= 1
    assert unreachable >= 5 if name == "modified_first_fit_decreasing" else unreachable == 0


@pytest.mark.parametrize("name", ["concatenative", "first_fit_decreasing", "first_fit_shuffle",
                                  "modified_first_fit_decreasing"])
def test_equal_to_nemo_rl_main(name):
    """Main at 7ea279ab: no count limit in ``get_packer``. Set on the packer (as NeMo-RL's tests
    do), only ``concatenative`` (its class attribute) honours it; the others' bins are the
    library's without the limit, and break it in some cases."""
    broken = 0
    for case, nemo in results("nvidia-7ea279ab", name):
        if _refused(case, nemo):
            continue
        k = case["max_sequences_per_bin"]
        expected = library(name, case) if name == "concatenative" else library(name, case, k=None)
        assert (tie_relabel(case["lengths"], nemo) if name == "first_fit_decreasing" else nemo) == expected, case["id"]
        broken += k is not None and any(len(b) > k for b in nemo)
    assert broken == 0 if name == "concatenative" else broken >= 5


def test_first_fit_shuffle_seed_protocol():
    """NeMo-RL shuffles with the global ``random`` after ``random.seed(seed)``; the library with
    ``random.Random(seed)``: the same permutation, so the same bins (checked above); here the
    protocol itself, on the fixture's own inputs."""
    case = max(CASES, key=lambda c: len(c["lengths"]))
    random.seed(case["seed"])
    pairs = [(s, i) for i, s in enumerate(case["lengths"])]
    random.shuffle(pairs)
    order = list(range(len(case["lengths"])))
    random.Random(case["seed"]).shuffle(order)
    assert [i for _, i in pairs] == order


def test_greedy_knapsack_rohitrango_split():
    """Its ``GreedyKnapsackPacker`` has no count limit: equal without one; with one, NeMo-RL's bins
    are the library's unlimited ones (the limit ignored: the defect), the library's honour it."""
    ignored = 0
    for case, nemo in results("rohitrango-split", "greedy_knapsack"):
        if _refused(case, nemo):
            continue
        k = case["max_sequences_per_bin"]
        assert nemo == library("greedy_knapsack", case, k=None), case["id"]
        ignored += k is not None and any(len(b) > k for b in nemo)
    assert ignored >= 5


@pytest.mark.parametrize("delta", [0, 2, 5, 20])
def test_balanced_greedy_knapsack_rohitrango_split(delta):
    """Megatron-LM's loop (least-full bin, a new one when the item does not fit there): its
    non-empty bins are the library's; it also returns the empty ones (defect) and ignores a count
    limit (defect: then its non-empty bins are the library's without the limit)."""
    with_empty = 0
    for case, nemo in results("rohitrango-split", f"balanced_greedy_knapsack/delta={delta}"):
        if _refused(case, nemo):
            continue
        k = case["max_sequences_per_bin"]
        ours = library("balanced_greedy_knapsack", case, delta=delta)
        check_protocol(case["lengths"], case["capacity"], k, ours)
        unlimited = ours if k is None else library("balanced_greedy_knapsack", case, k=None, delta=delta)
        assert [b for b in nemo if b] == unlimited, case["id"]
        with_empty += any(not b for b in nemo)
    assert with_empty == 0 if delta == 0 else with_empty >= 50      # delta 0: every up-front bin gets an item


def test_nemo_rl_documented_examples():
    """NeMo-RL's own examples: the library gives the bins they state (and NeMo-RL's code at each
    revision gives them too, but for the two where ``rohitrango-split`` ignores the limit its own
    test sets, and the empty bins it returns)."""
    for doc in DATA["documented"]:
        lengths, capacity, k, delta = doc["lengths"], doc["capacity"], doc["max_sequences_per_bin"], doc["balanced_knapsack_delta"]
        extra = {} if delta is None else {"balanced_knapsack_delta": delta}
        ours = PACKERS.get(doc["packer"])(lengths, capacity, max_sequences_per_bin=k, **extra)
        check_protocol(lengths, capacity, k, ours)
        nemo = doc["result"]
        if isinstance(nemo, dict):                                  # [11] into 10: refused; placed here
            assert "exceeds bin capacity" in nemo["message"] and ours == [[0]]
            continue
        if doc["stated"] is not None:
            assert ours == doc["stated"]
            ignores_limit = doc["revision"] == "rohitrango-split" and k is not None
            assert (nemo != doc["stated"]) == ignores_limit
        assert [b for b in nemo if b] == ours or (k is not None and doc["revision"] == "rohitrango-split")
    by_hand = {(d["revision"], tuple(d["lengths"]), d["balanced_knapsack_delta"]): d["result"] for d in DATA["documented"]}
    assert by_hand["rohitrango-split", (10,), 2] == [[0], [], []]   # empty bins returned
    assert balanced_greedy_knapsack([10], 10, balanced_knapsack_delta=2) == [[0]]
    assert by_hand["nvidia-42c11bb7", (6, 5, 4, 3, 2), 0] == [[0, 3], [1, 2], [4]]


# -- the protocol on the packers added for NeMo-RL's names ------------------------------------------

@pytest.mark.parametrize("name", NEW_PACKERS)
@settings(max_examples=80, deadline=None)
@given(lengths=st.lists(st.integers(1, 300), max_size=200), capacity=st.integers(1, 256),
       k=st.none() | st.integers(1, 8), delta=st.none() | st.integers(0, 6))
def test_protocol(name, lengths, capacity, k, delta):
    extra = {"balanced_knapsack_delta": delta} if name == "balanced_greedy_knapsack" else {}
    bins = PACKERS.get(name)(lengths, capacity, max_sequences_per_bin=k, seed=3, **extra)
    check_protocol(lengths, capacity, k, bins)
    assert PACKERS.get(name)(lengths, capacity, max_sequences_per_bin=k, seed=4, **extra) == bins
    if lengths:
        assert len(bins) >= -(-sum(min(s, capacity) for s in lengths) // capacity)
    if name == "concatenative":
        assert [i for b in bins for i in b] == list(range(len(lengths)))        # runs, in order
    if name == "greedy_knapsack":
        for b in bins:
            assert [lengths[i] for i in b] == sorted((lengths[i] for i in b), reverse=True)


def test_modified_ffd_with_a_limit_is_ffd():
    lengths = [5, 3, 8, 2, 4, 6, 1, 1, 7, 9, 2]
    for k in (1, 2, 3, 10):
        assert modified_first_fit_decreasing(lengths, 12, max_sequences_per_bin=k) == \
            first_fit_decreasing(lengths, 12, max_sequences_per_bin=k)
    for k in (11, 100):                                              # cannot bind (11 items): MFFD
        assert modified_first_fit_decreasing(lengths, 12, max_sequences_per_bin=k) == \
            modified_first_fit_decreasing(lengths, 12)


def test_modified_ffd_by_hand():
    # capacity 12: large > 6: 8(#2) 7(#8) 9(#9) -> bins [9], [8], [7] (decreasing); medium (4, 6]: 5(#0) 6(#5);
    # small (2, 4]: 3(#1) 4(#4); tiny <= 2: 2(#3) 1(#6) 1(#7) 2(#10).
    # 2: bin [9] (room 3): no medium fits; [8] (room 4): none; [7] (room 5): 5(#0) -> [7, 5].
    # 3: backward over bins without medium: [8] (room 4): 3 + 4 > 4: skip; [9] (room 3): skip.
    # 4: rest 6(#5) 4(#4) 3(#1) 2(#3) 2(#10) 1(#6) 1(#7): [9] takes 3(#1) (room 3 -> 0);
    #    [8] takes 4(#4) (room 0); [7, 5] (room 0).
    # 5: 6(#5) -> the empty bin (fill 6); 2(#3) -> it (8); 2(#10) -> it (10); 1(#6) -> it (11);
    #    1(#7) -> it (12).
    lengths = [5, 3, 8, 2, 4, 6, 1, 1, 7, 9, 2]
    assert modified_first_fit_decreasing(lengths, 12) == [[9, 1], [2, 4], [8, 0], [5, 3, 10, 6, 7]]


def test_new_packers_by_hand_and_oversized():
    assert concatenative([4, 1, 3, 2, 1, 3, 4, 5], 5) == [[0, 1], [2, 3], [4, 5], [6], [7]]
    assert concatenative([2, 9, 2, 2], 5) == [[0], [1], [2, 3]]                  # oversized closes and stays alone
    assert concatenative([1] * 5, 10, max_sequences_per_bin=2) == [[0, 1], [2, 3], [4]]
    assert greedy_knapsack([6, 5, 4, 3, 2], 10) == [[0, 2], [1, 3, 4]]
    assert greedy_knapsack([3, 12, 3, 11], 10) == [[1], [3], [0, 2]]              # oversized first, decreasing
    assert greedy_knapsack([4, 3, 2], 10, max_sequences_per_bin=1) == [[0], [1], [2]]
    assert modified_first_fit_decreasing([11, 3, 2], 10) == [[0], [1, 2]]
    assert balanced_greedy_knapsack([4, 4, 4, 4], 8, balanced_knapsack_delta=1) == [[0, 3], [1], [2]]
    assert balanced_greedy_knapsack([], 8, balanced_knapsack_delta=5) == []
    with pytest.raises(ValueError, match="balanced_knapsack_delta"):
        balanced_greedy_knapsack([1], 8, balanced_knapsack_delta=-1)


def test_new_packers_scale():
    rng = random.Random(7)
    lengths = [rng.randint(1, 4096) for _ in range(30_000)]
    for name in NEW_PACKERS:
        bins = PACKERS.get(name)(lengths, 4096, max_sequences_per_bin=None)
        assert sum(map(len, bins)) == len(lengths)


def test_config_delta_only_for_balanced_and_forwarded():
    from conftest import DEMO_TOKENIZER
    from energon_nemotron.config import PackingConfig, load_config
    from energon_nemotron.encoders import NemotronMultimodalTaskEncoder
    from energon_nemotron.errors import ConfigError
    from energon_nemotron.types import EncodedSample

    base = {"tokenizer": "t", "data": {"train": {"path": "d"}}}
    with pytest.raises(ConfigError, match=r"packing: balanced_knapsack_delta: only balanced_greedy_knapsack"):
        load_config({**base, "packing": {"algorithm": "first_fit_decreasing", "balanced_knapsack_delta": 2}})
    with pytest.raises(ConfigError, match="balanced_knapsack_delta"):
        load_config({**base, "packing": {"algorithm": "balanced_greedy_knapsack", "balanced_knapsack_delta": -1}})
    assert load_config({**base, "packing": {"algorithm": "balanced_greedy_knapsack",
                                            "balanced_knapsack_delta": 3}}).packing.balanced_knapsack_delta == 3
    costs = [300, 200, 120, 100, 90, 40, 30, 8]
    samples = [EncodedSample(__key__=f"s{i}", __restore_key__=(), sources=[], cost=c) for i, c in enumerate(costs)]
    for delta in (None, 3):
        enc = NemotronMultimodalTaskEncoder(DEMO_TOKENIZER, {"seq_length": 512}, packing=PackingConfig(
            algorithm="balanced_greedy_knapsack", buffer_size=8, balanced_knapsack_delta=delta,
            balance=None, carry=None))                 # the packer's bins in its own order
        packs = [[int(s.__key__[1:]) for s in p] for p in enc.select_samples_to_pack(samples)]
        assert packs == balanced_greedy_knapsack(costs, 512, balanced_knapsack_delta=delta)
    assert balanced_greedy_knapsack(costs, 512, balanced_knapsack_delta=3) != balanced_greedy_knapsack(costs, 512)
