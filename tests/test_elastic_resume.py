"""Elastic resume: states saved by N data-parallel ranks, merged, restored on M ranks (and another
worker count). Over real ``energon prepare``d shards, with packing and a shuffle buffer: the sample
keys yielded before the save (all N ranks) and after it (all M ranks, to the end of the epoch) are
the epoch exactly, at an early point, mid-epoch and in the epoch's last buffer."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from energon_data import text_config
from energon_nemotron.demo.datasets import text_dataset
from energon_nemotron.resume.elastic import decode_counts
from energon_nemotron.errors import ConfigError
from energon_nemotron.loading import build_train_loader
from energon_nemotron.resume import load_state_file, save_state_file
from energon_nemotron.resume import merge_rank_states

N = 48
SHUFFLE, PACK = 8, 6


pytestmark = pytest.mark.usefixtures("quick_worker_shutdown")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("elastic")
    _, keys_a = text_dataset(root / "a", "general_conversations", N, seed=1, per_shard=6)
    _, keys_b = text_dataset(root / "b", "general_conversations", N // 3, seed=2, per_shard=5)
    (root / "mix.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend_epochized:\n"
        "      - {repetitions: 1, path: a}\n      - {repetitions: 2, path: b}\n")
    return root, keys_a, keys_b


def cfg(root, path="a", workers=0, buffers=True):
    return text_config(root / path, workers=workers, batch_size=1, shuffle_buffer_size=SHUFFLE if buffers else None,
                       packing={"algorithm": "first_fit_shuffle", "buffer_size": PACK} if buffers else None)


def keys_of(batch) -> list[str]:
    return [k for row in batch.sample_keys for k in row]


def run(config, ranks: int, batches, merged=None, repeat=False):
    """Every rank of a shape: ``batches`` per rank (None: to the end; a list: per rank), after an
    elastic start from ``merged``; returns (keys yielded, states)."""
    seen, states = Counter(), []
    for r in range(ranks):
        loader = build_train_loader(config, repeat=repeat, dp_rank=r, dp_size=ranks)
        if merged is not None:
            loader.load_state_dict(merged, elastic=True)
        limit = batches[r] if isinstance(batches, list) else batches
        it = iter(loader)
        for _ in range(limit) if limit is not None else iter(int, 1):
            batch = next(it, None)
            if batch is None:
                break
            seen.update(keys_of(batch))
        states.append(loader.state_dict())
    return seen, states


def with_workers(config, workers):
    return {**config, "loader": {**config["loader"], "num_workers": workers}}


def check_epoch(before, after, epoch: Counter) -> None:
    union = before + after
    assert union == epoch, (f"extra {dict(union - epoch)}, missing {dict(epoch - union)}")


def whole_runs(config, ranks):
    """Per rank of a one-pass run: the keys of each batch and the state after each batch (index k:
    after k batches)."""
    runs = []
    for r in range(ranks):
        loader = build_train_loader(config, repeat=False, dp_rank=r, dp_size=ranks)
        keys, states = [], [loader.state_dict()]
        for batch in loader:
            keys.append(keys_of(batch))
            states.append(loader.state_dict())
        runs.append((keys, states))
    return runs


def elastic_cases(root, keys, old, new, old_workers, new_workers, tmp_path):
    """One old run per rank, saved at three points: the first batch, mid-epoch and the epoch's last
    buffer (one batch before the end); each point merged and finished on the new shape."""
    old_cfg = cfg(root, workers=old_workers)
    runs = whole_runs(old_cfg, old)
    for point in ("early", "mid", "last"):
        at = [{"early": 1, "mid": len(k) // 2, "last": len(k) - 1}[point] for k, _ in runs]
        before = Counter(key for (k, _), n in zip(runs, at) for batch in k[:n] for key in batch)
        files = []
        for r, ((_, states), n) in enumerate(zip(runs, at)):     # through the files a job would write
            files.append(tmp_path / f"{point}-rank{r}.json")
            save_state_file(files[-1], states[n])
        merged = merge_rank_states([load_state_file(f) for f in reversed(files)])   # any order
        remaining = N - merged["merged"]["leaves"][0]["consumed"]
        assert remaining == N - sum(before.values())
        if point == "last":      # every sample read, the rest still in the shuffle and packing buffers
            assert 0 < remaining <= (SHUFFLE + PACK) * old * max(old_workers, 1)
        save_state_file(tmp_path / f"{point}-merged.json", merged)
        after, _ = run(with_workers(old_cfg, new_workers), new, None,
                       merged=load_state_file(tmp_path / f"{point}-merged.json"))
        check_epoch(before, after, Counter(keys))


SHAPES = [(2, 3), (4, 2), (1, 4)]
DEFAULT = {((2, 3), 0, 2), ((4, 2), 2, 0)}


def matrix():
    for shape in SHAPES:
        for workers in ((0, 2), (2, 0)):
            marks = () if (shape, *workers) in DEFAULT else (pytest.mark.slow,)
            yield pytest.param(shape, workers, marks=marks, id=f"{shape[0]}to{shape[1]}-w{workers[0]}to{workers[1]}")


@pytest.mark.parametrize("shape,workers", list(matrix()))
def test_elastic_resume_yields_the_rest_of_the_epoch_once(data, shape, workers, tmp_path):
    root, keys, _ = data
    elastic_cases(root, keys, *shape, *workers, tmp_path)


def test_a_blend_with_repetitions_resumes_twice_in_a_row(data):
    """2 ranks -> 3 ranks (2 workers) -> 2 ranks (1 worker) over a blend that reads ``b`` twice per
    epoch: each key of ``a`` once and of ``b`` twice over the three parts; the middle part's state
    carries what its elastic start skipped."""
    root, keys_a, keys_b = data
    base = cfg(root, "mix.yaml")
    first, states = run(base, 2, 2)
    merged = merge_rank_states(states)
    assert [leaf["name"] for leaf in merged["merged"]["leaves"]] == ["a", "b"]
    second, states = run(with_workers(base, 2), 3, 1, merged=merged)
    assert all("skipped" in leaf for leaf in states[0]["elastic"]["leaves"])
    third, _ = run(with_workers(base, 1), 2, None, merged=merge_rank_states(states))
    check_epoch(first + second, third, Counter(keys_a + 2 * keys_b))
    assert sum(second.values()) and sum(third.values())


def test_a_same_shape_resume_after_an_elastic_start_is_exact(data):
    """A rank started elastically, saved and restored on its own shape yields the very batches of
    the uninterrupted run (the skipped samples stay skipped)."""
    root, _, _ = data
    base = cfg(root, workers=0)
    _, states = run(base, 2, 2)
    merged = merge_rank_states(states)
    cont = with_workers(base, 2)
    whole = build_train_loader(cont, repeat=False, dp_rank=1, dp_size=3)
    whole.load_state_dict(merged, elastic=True)
    expected = [keys_of(b) for b in whole]
    first = build_train_loader(cont, repeat=False, dp_rank=1, dp_size=3)
    first.load_state_dict(merged, elastic=True)
    it = iter(first)
    head = [keys_of(next(it)) for _ in range(2)]
    state = first.state_dict()
    again = build_train_loader(cont, repeat=False, dp_rank=1, dp_size=3)
    again.load_state_dict(state)
    assert head + [keys_of(b) for b in again] == expected


def test_with_repeat_the_pass_in_progress_is_completed_then_the_new_shape_runs(data):
    """``repeat=True`` (no buffers, so that each worker's passes are in order): 2 ranks stop one
    and a half passes in; on 3 ranks, each rank's first samples complete the pass in progress (every
    key yielded exactly twice), and the following ones are a whole new pass."""
    root, keys, _ = data
    base = cfg(root, workers=0, buffers=False)
    before, states = run(base, 2, (3 * N) // 4, repeat=True)
    merged = merge_rank_states(states)
    counts = decode_counts(merged["merged"]["leaves"][0]["counts"], N, "test")
    assert set(counts.tolist()) == {0, 1}             # relative to the pass in progress
    after = Counter()
    for r in range(3):
        loader = build_train_loader(base, repeat=True, dp_rank=r, dp_size=3)
        loader.load_state_dict(merged, elastic=True)
        lo, hi = min(o[0] for o in loader_offsets(loader)), max(o[-1] for o in loader_offsets(loader))
        todo = int(np.count_nonzero(counts[lo:hi] == 0))
        it = iter(loader)
        rest = [k for _ in range(todo) for k in keys_of(next(it))]
        after.update(rest)
        following = [k for _ in range(hi - lo) for k in keys_of(next(it))]
        assert sorted(following) == sorted(set(following)) and len(following) == hi - lo   # one whole pass
    assert set((before + after).values()) == {2} and set(before + after) == set(keys)


def loader_offsets(loader):
    from energon_nemotron.resume.elastic import dataset_leaves

    (_, leaf), = dataset_leaves(loader.inner.dataset)
    return [o for o in leaf.workers_slice_offsets if len(o) > 1]


def test_merge_refuses_incomplete_or_mixed_states(data):
    root, _, _ = data
    base = cfg(root)
    _, states = run(base, 2, 1)
    with pytest.raises(ConfigError, match=r"ranks \[0\].*all 2 ranks are needed"):
        merge_rank_states(states[:1])
    with pytest.raises(ConfigError, match=r"ranks \[0, 0\]"):
        merge_rank_states([states[0], states[0]])
    _, other = run({**base, "loader": {**base["loader"], "seed": 99}}, 2, 1)
    with pytest.raises(ConfigError, match=r"(?s)another configuration.*seed"):
        merge_rank_states([states[0], other[1]])
    no_record = {k: v for k, v in states[1].items() if k != "elastic"}
    with pytest.raises(ConfigError, match="no elastic record"):
        merge_rank_states([states[0], no_record])
    damaged = {**states[1], "elastic": {**states[1]["elastic"], "leaves": [{"path": []}]}}
    with pytest.raises(ConfigError, match="damaged"):
        merge_rank_states([states[0], damaged])


def test_elastic_load_refuses_other_configurations_and_plain_states(data):
    root, _, _ = data
    base = cfg(root)
    _, states = run(base, 2, 1)
    merged = merge_rank_states(states)
    changed = {**base, "task_encoder": {**base["task_encoder"],
                                       "options": {**base["task_encoder"]["options"], "seq_length": 1024}}}
    loader = build_train_loader(changed, repeat=False, dp_rank=0, dp_size=3)
    with pytest.raises(ConfigError, match="seq_length"):
        loader.load_state_dict(merged, elastic=True)
    loader = build_train_loader(base, repeat=False, dp_rank=0, dp_size=3)
    with pytest.raises(ConfigError, match="not a merged state"):
        loader.load_state_dict(states[0], elastic=True)
    with pytest.raises(ConfigError, match="repeat"):             # one pass vs endless: another stream
        build_train_loader(base, repeat=True, dp_rank=0, dp_size=3).load_state_dict(merged, elastic=True)
    # a plain load of a merged state is refused too, saying how to load it (not "damaged")
    with pytest.raises(ConfigError, match=r"a merged state of several ranks .*: load it with "
                                          r"load_state_dict\(state, elastic=True\)$"):
        build_train_loader(base, repeat=False, dp_rank=0, dp_size=2).load_state_dict(merged)
