"""``on_error: skip`` gives up on a broken run: ``loader.max_consecutive_skips`` and
``loader.max_skip_fraction`` stop it with one error listing the skips by reason, on the Energon and
the Megatron-LM path, with 0 and 2 workers; a healthy run with a few bad samples runs to the end;
``null`` disables a limit; skips are quiet; the workers end with the parent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from bad_inputs import decode_time_bad_dataset, skip_dataset, skip_rows
from conftest import DEMO_TOKENIZER
from energon_nemotron.errors import ConfigError
from energon_nemotron.loading import build_train_loader

N = 400


def all_bad(i: int) -> bool:
    return True


def sprinkled(i: int) -> bool:          # 5 %: 20 of 400
    return i % 20 == 7


def three_in_four(i: int) -> bool:      # 75 %, never more than 3 in a row
    return i % 4 != 0


def burst(i: int) -> bool:              # 15 in a row (in a dataset of one shard: Energon reads in order)
    return 110 <= i < 125


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """name -> (Energon dataset, Megatron-LM rows file), built on first use."""
    root = tmp_path_factory.mktemp("skiplimits")
    made = {}

    def get(name, pattern, per_shard=50):
        if name not in made:
            made[name] = (skip_dataset(root / name, pattern, N, per_shard),
                          skip_rows(root / f"{name}.jsonl.packed", pattern, N))
        return made[name]
    return get


def config(source, workers=0, **loader):
    if str(source).endswith(".jsonl.packed"):
        train = {"format": "megatron_sft_packed", "path": str(source), "seq_length": 1024,
                 "prompt_format": "nemotron-h-aligned"}
        extra = {}
    else:
        train = {"path": str(source)}
        extra = {"task_encoder": {"name": "nemotron_multimodal",
                                  "options": {"prompt_format": "nemotron6", "seq_length": 1024}},
                 "packing": {"algorithm": "best_fit_decreasing", "buffer_size": 8}}
    return {"tokenizer": str(DEMO_TOKENIZER), **extra, "data": {"train": train},
            "loader": {"batch_size": 1, "num_workers": workers, "shuffle_buffer_size": None, "on_error": "skip",
                       **loader}}


def read_all(cfg):
    loader = build_train_loader(cfg, repeat=False)
    samples = sum(len(k) for b in loader for k, pad in zip(b.sample_keys, b.is_padding) if not pad)
    return loader, samples


def source(pair, path):
    return pair[0] if path == "energon" else pair[1]


PATHS = ["energon", "megatron"]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("path", PATHS)
def test_all_bad_stops_with_the_counts(data, path, workers):
    src = source(data("all_bad", all_bad), path)
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as err:
        read_all(config(src, workers))
    message = str(err.value)
    assert type(err.value).__name__ == "SkipLimitError"
    assert message.startswith("stopping: 100 consecutive samples were skipped")
    assert "(loader.max_consecutive_skips=100)" in message and "fix the data, or raise the limit" in message
    counts = dict((k, int(v)) for k, v in (p.rsplit(" ", 1) for p in
                                           message.split("skipped so far: ")[1].split(";")[0].split(", ")))
    assert counts.get("invalid_json", 0) >= 90 and sum(counts.values()) < N        # stopped early
    assert time.monotonic() - t0 < 120


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("path", PATHS)
def test_healthy_run_with_a_sprinkle_of_bad_samples_runs_to_the_end(data, path, workers, capfd, caplog):
    src = source(data("sprinkled", sprinkled), path)
    loader, samples = read_all(config(src, workers, max_skip_fraction=0.5, max_consecutive_skips=100))  # defaults
    assert loader.skipped() == {"invalid_json": 20}
    assert samples == N - 20
    out, err = capfd.readouterr()
    assert "Except " not in out + err and "ErrorContext" not in out + err          # Energon's per-error prints
    assert len(out + err) < 5000
    if workers == 0:
        warnings = [r for r in caplog.records if r.name == "energon_nemotron" and r.levelname == "WARNING"]
        assert len(warnings) == 1 and "skipped so far" in warnings[0].getMessage()


@pytest.mark.parametrize("path", PATHS)
def test_consecutive_limit(data, path):
    src = source(data("burst", burst, per_shard=N), path)
    with pytest.raises(ConfigError, match=r"stopping: 10 consecutive samples were skipped "
                                          r"\(loader.max_consecutive_skips=10\); skipped so far: invalid_json 10"):
        read_all(config(src, max_consecutive_skips=10))
    loader, samples = read_all(config(src, max_consecutive_skips=16))
    assert loader.skipped() == {"invalid_json": 15} and samples == N - 15
    loader, samples = read_all(config(src, max_consecutive_skips=None))
    assert loader.skipped() == {"invalid_json": 15} and samples == N - 15


@pytest.mark.parametrize("path", PATHS)
def test_skip_fraction_limit(data, path):
    src = source(data("three_in_four", three_in_four), path)
    with pytest.raises(ConfigError, match=r"stopping: 1[4-6]\d of the last 200 samples read were skipped, more than "
                                          r"loader.max_skip_fraction=0.5 \(a window of the last 1000 samples"):
        read_all(config(src))
    loader, samples = read_all(config(src, max_skip_fraction=None))
    assert sum(loader.skipped().values()) == 300 and samples == 100


@pytest.mark.parametrize("path", PATHS)
def test_null_disables_both_limits(data, path):
    src = source(data("all_bad", all_bad), path)
    loader, samples = read_all(config(src, 2, max_skip_fraction=None, max_consecutive_skips=None))
    assert samples == 0 and sum(loader.skipped().values()) == N


def test_samples_failing_only_at_decode_time_stop_too(tmp_path):
    """Every sample is read and packed, then fails when its image is decoded: each one's *read*
    becomes a skip, so the fraction limit stops the run."""
    cfg = config(decode_time_bad_dataset(tmp_path / "late"))
    cfg["task_encoder"]["options"]["image"] = {"min_patches": 4, "max_patches": 16}
    with pytest.raises(ConfigError, match=r"of the last 200 samples read were skipped, more than "
                                          r"loader.max_skip_fraction=0.5.*skipped so far: corrupt_media"):
        read_all(cfg)


def test_limits_are_not_in_the_fingerprint(data):
    src = source(data("sprinkled", sprinkled), "megatron")
    first = build_train_loader(config(src))
    it = iter(first)
    next(it)
    state = first.state_dict()
    other = build_train_loader(config(src, max_consecutive_skips=7, max_skip_fraction=0.9))
    other.load_state_dict(state)                       # accepted: the limits do not change the stream
    assert next(iter(other)).sample_keys == next(it).sample_keys


def test_limit_options_are_validated(data):
    from energon_nemotron.config import load_config

    src = source(data("sprinkled", sprinkled), "megatron")
    for field, value in (("max_skip_fraction", 0), ("max_skip_fraction", 1.5), ("max_consecutive_skips", 0)):
        with pytest.raises(ConfigError, match=rf"loader\.{field}"):
            load_config(config(src, **{field: value}))


@pytest.mark.parametrize("path", PATHS)
def test_preview_on_an_all_bad_dataset_ends_promptly(data, tmp_path, path):
    """With 2 workers and ``--batches`` (a repeating loader, which span forever before), preview
    exits with status 2 and the error, stderr stays small, and no worker outlives it."""
    cfg = tmp_path / "all_bad.yaml"
    cfg.write_text(yaml.safe_dump(config(source(data("all_bad", all_bad), path), 2)))
    proc = subprocess.Popen([sys.executable, "-m", "energon_nemotron.cli", "preview", str(cfg), "--json",
                             "--batches", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("preview on an all-bad dataset did not end within 150 s")
    assert proc.returncode == 2, err[-2000:]
    assert len(err) < 20_000, f"{len(err)} bytes of stderr"
    # one error line (a worker's warning may share the pipe, so it is looked for inside lines)
    [error] = [line[line.index("error: "):] for line in err.decode().splitlines() if "error: stopping" in line] \
        or [err.decode()[-3000:]]
    assert error.startswith("error: stopping: 100 consecutive samples were skipped") and "invalid_json" in error
    deadline = time.monotonic() + 60                   # a bound on a loaded machine, not a speed goal
    while True:                                        # the session's processes: the workers, if any are left
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail("DataLoader workers outlived preview")
        time.sleep(0.2)


def test_window_counts_a_decode_time_failure_once():
    """``SkipTally``: a sample read, then dropped at decode time, turns its read into a skip."""
    from energon_nemotron.guards import skip_counter as skip_counter

    tally = skip_counter()
    tally.set_limits(None, None)
    for _ in range(10):
        tally.passed()
    tally.skip("corrupt_media", after_read=True)
    tally.skip("invalid_json")
    assert list(tally.window) == [False] * 9 + [True, True] and tally.skipped_in_window == 2
    assert tally.consecutive == 2 and tally.totals() == {"corrupt_media": 1, "invalid_json": 1}
