"""Media bytes in the packing buffer bounded (``packing.max_buffer_bytes``; ``encoders.held_media``).

The admission rule against the bound it promises over random streams; leaving payloads out and
putting them back; then the real loader over prepared shards with images, video and audio: the same
batches bit for bit with any bound as without one (0 and 2 workers, a shuffle buffer), each sample
once per epoch, exact resume from every point and an elastic resume onto another shape, the bytes
held within the budget by telemetry (also right after a restore), and the config's spellings.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from energon_data import rest_after, text_config
from energon_nemotron.config import PackingConfig
from energon_nemotron.demo.datasets import multimodal_dataset
from energon_nemotron.encoders.held_media import HeldMedia, LeftOut
from energon_nemotron.errors import DataError
from energon_nemotron.loading import build_train_loader
from energon_nemotron.parallel.broadcast import batches_equal
from energon_nemotron.resume import merge_rank_states
from energon_nemotron.types import EncodedSample, MediaRef

N = 30


pytestmark = pytest.mark.usefixtures("quick_worker_shutdown")


# -- the rule and the payloads ----------------------------------------------------------------------

def test_admission_never_holds_more_than_the_budget_and_keeps_small_media():
    rng = random.Random(3)
    for trial in range(200):
        budget, size = rng.randint(0, 5000), rng.randint(1, 12)
        held = HeldMedia(budget, size)
        buffer: list[int] = []            # bytes each buffered sample holds
        for _ in range(60):
            if len(buffer) == size:       # a pack leaves: one to three samples
                for _ in range(rng.randint(1, min(3, len(buffer)))):
                    buffer.pop(rng.randrange(len(buffer)))
            n = rng.choice([0, rng.randint(1, max(held.share, 1)), rng.randint(1, 3 * budget + 1)])
            keep = held.admits(n, sum(buffer), len(buffer))
            buffer.append(n if keep else 0)
            assert sum(buffer) <= budget, trial
            if n == 0:
                assert keep
        # a buffer filled from empty with media of at most the share holds them all
        filled: list[int] = []
        for _ in range(size):
            n = rng.randint(0, held.share)
            assert held.admits(n, sum(filled), len(filled)), trial
            filled.append(n)


def test_a_large_sample_leaves_room_for_the_share_of_the_rest():
    held = HeldMedia(1000, 10)                  # share 100
    assert held.admits(500, 0, 0) is False      # 500 + 9 x 100 reserved > 1000
    assert held.admits(500, 0, 5) is True       # 500 + 4 x 100 <= 1000
    assert held.admits(100, 900, 9) is True and held.admits(101, 900, 9) is False


def sample(*payloads):
    media = [MediaRef("audio", p, {}, f"clip{i}.wav") for i, p in enumerate(payloads)]
    return EncodedSample(__key__="ds/shard.tar:k1", __restore_key__=(), __subflavors__={}, sources=[], cost=1,
                         media=media)


def test_payloads_left_out_and_put_back():
    held = HeldMedia(0, 4)
    light = sample(b"abc", "some/path.wav", b"defg")
    assert held.nbytes(light) == 7
    held.leave_out(light)
    assert [r.payload for r in light.media] == [LeftOut(3), "some/path.wav", LeftOut(4)]
    assert held.nbytes(light) == 0 and held.is_light(light)
    back = held.refill(light, sample(b"abc", "some/path.wav", b"defg"))
    assert [r.payload for r in back.media] == [b"abc", "some/path.wav", b"defg"] and not held.is_light(back)


def test_a_re_read_that_differs_is_a_data_error_naming_the_sample():
    held = HeldMedia(0, 4)
    light = sample(b"abc")
    held.leave_out(light)
    with pytest.raises(DataError, match=r"ds/shard.tar:k1.*media item 0 \(clip0.wav\) is 2 bytes, not 3"):
        held.refill(light, sample(b"ab"))
    with pytest.raises(DataError, match="2 media items, not 1"):
        held.refill(light, sample(b"abc", b"x"))


def test_the_config_takes_bytes_with_units_and_null():
    assert PackingConfig(max_buffer_bytes="1.5 MiB").max_buffer_bytes == 1572864
    assert PackingConfig(max_buffer_bytes=0).max_buffer_bytes == 0
    assert PackingConfig().max_buffer_bytes is None
    with pytest.raises(ValueError):
        PackingConfig(max_buffer_bytes="lots")


# -- in the loader ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("held")
    _, keys = multimodal_dataset(root / "mm", N, seed=2, per_shard=6)
    return root, keys


def config(root, workers=0, bound=None, shuffle=4, **packing):
    p = {"algorithm": "first_fit_decreasing", "buffer_size": 8, "max_buffer_bytes": bound, **packing}
    return text_config(root / "mm", workers=workers, packing=p, seq_length=2048, shuffle_buffer_size=shuffle)


def keys_of(batch) -> list[str]:
    return [k for row in batch.sample_keys for k in row]


def share_bytes(root) -> int:
    """A budget of about half a buffer's media: some samples keep theirs, others leave them out."""
    return sum(f.stat().st_size for f in (root / "mm").rglob("*.tar")) // N * 8 // 2


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_are_bit_for_bit_those_of_an_unbounded_buffer(data, workers):
    root, keys = data
    plain = list(build_train_loader(config(root, workers), repeat=False))
    assert Counter(k for b in plain for k in keys_of(b)) == Counter(keys)
    for bound in (0, share_bytes(root)):
        loader = build_train_loader(config(root, workers, bound), repeat=False)
        got = list(loader)
        assert len(got) == len(plain) and all(batches_equal(a, b) for a, b in zip(got, plain)), bound
        t = loader.telemetry()["buffer_bytes"]
        assert t["budget_per_worker"] == bound and t["peak_per_worker"] <= bound and t["reread"] > 0, t
        if bound:
            assert t["peak_per_worker"] > 0             # some media stayed in the buffer
        assert f"reread {t['reread']}" in loader.stats.line()
    assert build_train_loader(config(root, workers), repeat=False).telemetry()["buffer_bytes"] == {}


@pytest.mark.parametrize("workers", [0, 2])
def test_exact_resume_from_every_point_with_media_left_out(data, workers):
    root, _ = data
    plain = list(build_train_loader(config(root, workers), repeat=False))
    cfg = config(root, workers, share_bytes(root))
    whole = build_train_loader(cfg, repeat=False)
    states = [whole.state_dict()]
    for _ in whole:
        states.append(whole.state_dict())
    points = range(len(plain)) if workers == 0 else range(0, len(plain), 3)
    for k in points:
        again = build_train_loader(cfg, repeat=False)
        again.load_state_dict(states[k])
        rest = list(again)
        assert len(rest) == len(plain) - k and all(batches_equal(a, b) for a, b in zip(rest, plain[k:])), k
        t = again.telemetry()["buffer_bytes"]       # the restored buffers are admitted too
        assert t["peak_per_worker"] <= t["budget_per_worker"], (k, t)


def test_a_run_resumes_under_another_bound(data):
    """The bound is not part of the stream: a state saved without one restores with one (and back)."""
    root, _ = data
    plain = list(build_train_loader(config(root, 0), repeat=False))
    for saved_bound, restored_bound in ((None, 0), (share_bytes(root), None)):
        first = build_train_loader(config(root, 0, saved_bound), repeat=False)
        it = iter(first)
        for _ in range(3):
            next(it)
        rest = rest_after(config(root, 0, restored_bound), first.state_dict())
        assert len(rest) == len(plain) - 3 and all(batches_equal(a, b) for a, b in zip(rest, plain[3:]))


def test_an_elastic_resume_onto_another_shape_is_the_unbounded_one(data):
    root, keys = data
    bound = share_bytes(root)

    def resumed(b):
        old, states, before = [], [], Counter()
        for r in range(2):
            loader = build_train_loader(config(root, 0, b), repeat=False, dp_rank=r, dp_size=2)
            it = iter(loader)
            for _ in range(2):
                before.update(keys_of(next(it)))
            states.append(loader.state_dict())
            old.append(loader)
        merged = merge_rank_states(states)
        after = []
        for r in range(3):
            loader = build_train_loader(config(root, 2, b), repeat=False, dp_rank=r, dp_size=3)
            loader.load_state_dict(merged, elastic=True)
            after += list(loader)
        return before, after

    before, bounded = resumed(bound)
    before_plain, plain = resumed(None)
    assert before == before_plain
    assert len(bounded) == len(plain) and all(batches_equal(a, b) for a, b in zip(bounded, plain))
    assert before + Counter(k for b in bounded for k in keys_of(b)) == Counter(keys)

