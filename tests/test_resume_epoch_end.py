"""Resume at every point of a one-epoch pass (``repeat=False``), including its very end: a state
saved once the source has been read into the shuffle buffer (the last ``shuffle_buffer_size``
samples of the epoch) or the packing buffer must not make the resumed run read the epoch again.
Energon's sample loader resets its position when its source is exhausted; the encoder's one-pass
guard keeps that end in the state. Also: a worker that has delivered nothing when the state is saved
resumes from where it started (``worker_checkpoints``)."""

from __future__ import annotations

from collections import Counter

import pytest

from energon_data import text_config
from energon_nemotron.demo.datasets import text_dataset
from energon_nemotron.loading import as_config, build_loader, build_train_loader

N = 40


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("epoch_end")
    text_dataset(root / "a", "general_conversations", N, seed=1, per_shard=6)
    text_dataset(root / "b", "general_conversations", N // 2, seed=2, per_shard=5)
    (root / "mix.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend_epochized:\n"
        "      - {repetitions: 1, path: a}\n      - {repetitions: 2, path: b}\n"
        "  val:\n    blend_epochized:\n      - {repetitions: 1, path: a, split_part: train}\n"
        "      - {repetitions: 1, path: b, split_part: train}\n")
    return root


def cfg(root, path, workers, packing):
    return text_config(root / path, workers=workers, batch_size=2, shuffle_buffer_size=8,
                       packing={"algorithm": "first_fit_shuffle", "buffer_size": 6} if packing else None,
                       validation={"path": str(root / path), "split": "train"})


def signature(batch) -> tuple:
    return (tuple(tuple(r) for r in batch.sample_keys), batch.tokens.sum().item(), tuple(batch.tokens.shape))


def run_with_states(config, build):
    """The whole pass, and the loader's state after each batch (index k: after k batches)."""
    loader = build(config)
    states, batches = [loader.state_dict()], []
    for batch in loader:
        batches.append(signature(batch))
        states.append(loader.state_dict())
    return batches, states


def resumed(config, build, state):
    loader = build(config)
    loader.load_state_dict(state)
    return [signature(b) for b in loader]


def save_points(n: int, workers: int) -> list[int]:
    """The start, the middle, and every one of the last batches (where the shuffle and packing
    buffers drain after the source is exhausted); with workers (a restore costs a start of them)
    the middle and the last two."""
    if workers:
        return sorted({n // 2, n - 1, n})
    return sorted({0, n // 2, *range(max(n - 3, 1), n + 1)})


@pytest.mark.parametrize("workers, packing, path", [
    (0, True, "a"), (0, False, "a"), (2, True, "a"), (2, False, "mix.yaml"), (0, True, "mix.yaml")])
def test_one_epoch_resume_is_exact_up_to_the_very_end(data, workers, packing, path):
    config = cfg(data, path, workers, packing)
    build = lambda c: build_train_loader(c, repeat=False)                      # noqa: E731
    batches, states = run_with_states(config, build)
    keys = Counter(k for b in batches for row in b[0] for k in row)
    expected = N + (2 * (N // 2) if path == "mix.yaml" else 0)
    assert sum(keys.values()) == expected                                      # one epoch, each sample once
    for k in save_points(len(batches), workers):
        assert resumed(config, build, states[k]) == batches[k:], f"resumed after batch {k} of {len(batches)}"


def test_one_epoch_state_at_the_end_yields_nothing_more(data):
    config = cfg(data, "a", 2, True)
    build = lambda c: build_train_loader(c, repeat=False)                      # noqa: E731
    _, states = run_with_states(config, build)
    assert resumed(config, build, states[-1]) == []


def test_repeating_loader_still_continues_into_the_next_epoch(data):
    """With ``repeat=True`` the guard is not in the way: after a restore at the end of the first
    epoch, the loader goes on into the second exactly as the uninterrupted run."""
    config = cfg(data, "a", 0, True)
    first = build_train_loader(config)
    it = iter(first)
    n_epoch = 0
    seen: Counter = Counter()
    while sum(seen.values()) < N:
        seen.update(k for row in next(it).sample_keys for k in row)
        n_epoch += 1
    state = first.state_dict()
    expected = [signature(next(it)) for _ in range(8)]
    second = build_train_loader(config)
    second.load_state_dict(state)
    got = [signature(b) for _, b in zip(range(8), second)]
    assert got == expected


def test_validation_loader_resumes_exactly_up_to_its_end(data):
    """The validation split is one pass too (Energon's val datasets, concatenated for a blend)."""
    config = cfg(data, "mix.yaml", 0, True)
    config["data"]["validation"] = {"path": str(data / "mix.yaml"), "split": "val"}
    build = lambda c: build_loader(as_config(c), validation=True, repeat=False)        # noqa: E731
    batches, states = run_with_states(config, build)
    assert sum(len(row) for b in batches for row in b[0]) == N + N // 2
    for k in save_points(len(batches), 0):
        assert resumed(config, build, states[k]) == batches[k:], f"resumed after batch {k} of {len(batches)}"


def test_a_worker_that_has_delivered_nothing_resumes_from_its_start(data):
    """A save that reaches a worker before it has started iterating (the second worker still
    starting when the first batch arrives) is answered by Energon with its placeholder checkpoint,
    "initial state, then skip one sample": restored as is, that worker's first batch is lost. The
    loader settles such a worker to where it started."""
    from energon_nemotron.resume import encode_state
    from energon_nemotron.resume.worker_checkpoints import settle

    config = cfg(data, "a", 2, True)
    build = lambda c: build_train_loader(c, repeat=False)                      # noqa: E731
    batches, _ = run_with_states(config, build)
    loader = build(config)
    it = iter(loader)
    next(it)
    raced = loader.inner.save_state_rank()
    unstarted = loader.inner.dataset            # the main process's copy of the worker wrapper never iterated
    unstarted._worker_id = 1
    raced.worker_states[1] = unstarted.get_checkpoint(list(loader.inner._worker_sample_counters))
    assert raced.worker_states[1].state is None and raced.worker_states[1].offset == 1

    def resume_from(energon_state):
        state = {"fingerprint": loader.fingerprint, "position": {"energon": encode_state(energon_state)}}
        return resumed(config, build, state)

    assert resume_from(raced) != batches[1:]                                   # a batch of worker 1 lost
    assert resume_from(settle(raced, loader.inner, loader._start)) == batches[1:]
