"""pack-megatron at scale: inputs and globs, shards, the Ray engine, manifests and resume, the loader
reading manifests.

A local Ray cluster of 2 CPUs is started once for the module (no outside service); the Ray engine
must write the very bytes of the single-process engine.
"""

from __future__ import annotations

import functools
import importlib.util
import io
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import DEMO_TOKENIZER
from energon_nemotron.demo.conversations import make_conversations
from energon_nemotron.errors import ConfigError, DataError
from energon_nemotron.loading import build_train_loader
from energon_nemotron.megatron_packed import MegatronSFTPackedEncoder
from energon_nemotron.megatron_packed.counting import count_local
from energon_nemotron.megatron_packed.inputs import expand_inputs, split_blocks
from energon_nemotron.megatron_packed.offline_pack import PackOptions, pack
from energon_nemotron.megatron_packed.ray_engine import RayEngine

def needs_ray(fn):
    """Ray is part of the test setup (the ``ray`` extra, installed by ``make test``): a missing Ray
    fails the test, it never skips it."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        if importlib.util.find_spec("ray") is None:
            pytest.fail("Ray Data is not installed: pip install 'energon-nemotron[ray]' (make test does)",
                        pytrace=False)
        return fn(*args, **kwargs)

    return run

L, FMT = 512, "nemotron-h-aligned"
ENCODER_ARGS = ["--tokenizer", str(DEMO_TOKENIZER), "--seq-length", str(L), "--prompt-format", FMT]
RPS = 25                                   # rows per shard of the sharded outputs (6 shards)
BLOCK = 30000                              # bytes per counting block of the Ray runs (~12 blocks)


def encoder() -> MegatronSFTPackedEncoder:
    return MegatronSFTPackedEncoder(DEMO_TOKENIZER, L, FMT)


def write_corpus(folder: Path, bad: bool = False) -> list[Path]:
    """Three raw JSONL files (some lines hold two conversations, some are blank); with ``bad``, one
    line of each kind of error, in the second file and (later in input order) the third."""
    folder.mkdir(parents=True, exist_ok=True)
    convs = iter(make_conversations(700, seed=21))
    paths = []
    for k in range(3):
        lines = []
        for j in range(150):
            c = next(convs)
            if j % 9 == 0:
                nxt = next(convs)
                c = c + (nxt if nxt[0]["role"] == "system" else [{"role": "system", "content": "Two."}] + nxt)
            lines.append(json.dumps({"messages": c}))
            if j % 40 == 5:
                lines.append("")
        if bad and k == 1:
            lines.insert(20, '{"messages": [{"role": "user", "content": "q"}')                  # invalid_json
            lines.insert(30, json.dumps({"messages": [{"role": "user", "content": "q"},
                                                      {"role": "assistant", "content": ""}]}))   # empty_assistant
        if bad and k == 2:
            lines.insert(3, json.dumps({"messages": [{"role": "robot", "content": "x"}]}))      # unknown_role
            ok = next(convs)
            lines.insert(9, json.dumps({"messages": ok + [{"role": "system", "content": "s"},     # conversation 1:
                                                          {"role": "assistant", "content": "a"}]}))   # turn order
        p = folder / f"part{k}.jsonl"
        p.write_text("\n".join(lines) + "\n")
        paths.append(p)
    return paths


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster of 2 CPUs for the module; yields its address for CLI drivers to join."""
    import ray

    for k, v in (("RAY_BACKEND_LOG_LEVEL", "fatal"), ("RAY_USAGE_STATS_ENABLED", "0")):
        os.environ.setdefault(k, v)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    paths = write_corpus(root / "raw")
    single = pack([str(root / "raw" / "part*.jsonl")], root / "local" / "one.jsonl.packed", encoder(), progress=False)
    sharded = pack([str(root / "raw" / "part*.jsonl")], root / "local" / "rows.jsonl.packed", encoder(),
                   PackOptions(rows_per_shard=RPS), progress=False)
    return {"root": root, "paths": paths, "single": single, "sharded": sharded}


def files_of(summary) -> dict[str, bytes]:
    folder = Path(summary.manifest).parent
    return {name: (folder / name).read_bytes() for name in summary.shards}


def manifest_of(summary) -> dict:
    return json.loads(Path(summary.manifest).read_text())


# -- inputs ------------------------------------------------------------------------------------
def test_inputs_globs_order_and_errors(tmp_path):
    for name in ("b.jsonl", "a.jsonl", "c.txt"):
        (tmp_path / name).write_text("{}\n")
    got = expand_inputs([str(tmp_path / "c.txt"), str(tmp_path / "*.jsonl")])
    assert [p.name for p in got] == ["c.txt", "a.jsonl", "b.jsonl"]       # given order, a glob sorted
    with pytest.raises(ConfigError, match=r"--input '.*nothing\*\.jsonl' matches no file"):
        expand_inputs([str(tmp_path / "nothing*.jsonl")])
    with pytest.raises(ConfigError, match=r"does not exist"):
        expand_inputs([str(tmp_path / "missing.jsonl")])
    with pytest.raises(ConfigError, match=r"a\.jsonl' is named twice"):
        expand_inputs([str(tmp_path / "a.jsonl"), str(tmp_path / "?.jsonl")])


def test_blocks_are_whole_lines_and_count_like_whole_files(corpus):
    paths = corpus["paths"]
    blocks = split_blocks(paths, 1500)
    assert len(blocks) > 3 * 10
    for p in paths:
        data = p.read_bytes()
        mine = [b for b in blocks if b.path == str(p)]
        assert mine[0].start == 0 and mine[-1].end == len(data)
        assert all(a.end == b.start for a, b in zip(mine, mine[1:]))
        assert all(data[b.start - 1:b.start] == b"\n" for b in mine[1:])
    whole, small = count_local(split_blocks(paths), encoder()), count_local(blocks, encoder())
    for key in ("costs", "files", "offsets", "index_in_line"):
        assert getattr(whole, key).tolist() == getattr(small, key).tolist()
    assert whole.input_lines == small.input_lines == 3 * 150


def test_blocks_counted_out_of_order_raise_the_first_error_in_input_order(tmp_path):
    from energon_nemotron.megatron_packed.counting import CountMerger, count_block

    paths = write_corpus(tmp_path / "raw", bad=True)
    blocks = split_blocks(paths, 8000)
    counts = [count_block(b, encoder(), "raise") for b in blocks]
    bad = [c.block for c in counts if c.errors]
    assert len(bad) >= 2 and all(c.stopped for c in counts if c.errors)
    merger = CountMerger(blocks, "raise")
    for c in reversed(counts[bad[0] + 1:]):            # later blocks first: their errors wait
        merger.add(c)
    for c in counts[:bad[0]]:
        merger.add(c)
    with pytest.raises(DataError, match=rf"^{re.escape(str(paths[1]))}:21: ") as err:
        merger.add(counts[bad[0]])
    assert err.value.code == "invalid_json"


def test_input_order_is_the_packing_input(corpus, tmp_path):
    """The files in the order given define the conversations' order: the same files in another
    order pack differently; a glob equals its sorted list."""
    paths = corpus["paths"]
    listed = pack([str(p) for p in paths], tmp_path / "listed.jsonl.packed", encoder(), progress=False)
    assert files_of(listed)["listed.jsonl.packed"] == files_of(corpus["single"])["one.jsonl.packed"]
    backwards = pack([str(p) for p in reversed(paths)], tmp_path / "back.jsonl.packed", encoder(), progress=False)
    assert [i["path"] for i in manifest_of(backwards)["inputs"]] == [str(p) for p in reversed(paths)]
    assert files_of(backwards)["back.jsonl.packed"] != files_of(corpus["single"])["one.jsonl.packed"]


# -- shards and the manifest -------------------------------------------------------------------
def test_shards_and_manifest(corpus):
    s, m = corpus["sharded"], manifest_of(corpus["sharded"])
    n = -(-s.rows // RPS)
    assert s.shards == [f"rows-{k:05d}-of-{n:05d}.jsonl.packed" for k in range(n)]
    assert Path(s.manifest).name == "rows.jsonl.packed.manifest.json" and m["complete"]
    assert [e["rows"] for e in m["shards"]] == [RPS] * (n - 1) + [s.rows - RPS * (n - 1)]
    assert all(e["complete"] and len(e["sha256"]) == 64 for e in m["shards"])
    # the shards back to back are the single file's rows
    one = files_of(corpus["single"])["one.jsonl.packed"]
    assert b"".join(files_of(s).values()) == one
    enc = encoder()
    assert m["encoder"] == enc.signature() and m["encoder"]["pad_token"] == "<SPECIAL_233>"
    assert m["packing"] == {"algorithm": "best_fit_decreasing", "seed": 0, "rows_per_shard": RPS, "on_error": "raise"}
    assert [i["size"] for i in m["inputs"]] == [p.stat().st_size for p in corpus["paths"]]
    assert m["counts"]["conversations"] == s.conversations and m["counts"]["rows"] == s.rows
    assert not (corpus["root"] / "local" / "rows.jsonl.packed.counts.npz").exists()


def test_rerun_with_other_options_rewrites_everything(corpus, tmp_path):
    src = [str(corpus["root"] / "raw" / "part*.jsonl")]
    first = pack(src, tmp_path / "r.jsonl.packed", encoder(), PackOptions(rows_per_shard=RPS), progress=False)
    again = pack(src, tmp_path / "r.jsonl.packed", encoder(), PackOptions(rows_per_shard=RPS), progress=False)
    assert again.shards_skipped == len(first.shards) and "complete already" in again.notes[0]
    other = pack(src, tmp_path / "r.jsonl.packed", encoder(), PackOptions(rows_per_shard=RPS * 3, seed=1),
                 progress=False)
    assert "rewriting everything" in other.notes[0]
    assert "packing.seed: saved 0 != now 1" in other.notes[0] and "packing.rows_per_shard" in other.notes[0]
    assert other.shards_skipped == 0
    left = sorted(p.name for p in tmp_path.glob("r-*.jsonl.packed"))
    assert left == sorted(other.shards)                  # the first run's shards are gone


# -- the Ray engine ----------------------------------------------------------------------------
@needs_ray
def test_ray_writes_the_same_bytes(cluster, corpus, tmp_path):
    """Sharded, with the module's 2-CPU cluster (the single file: see the CLI test below)."""
    ref = corpus["sharded"]
    got = pack([str(corpus["root"] / "raw" / "part*.jsonl")], tmp_path / "rows.jsonl.packed", encoder(),
               PackOptions(rows_per_shard=RPS, block_size=BLOCK), engine=RayEngine(), progress=False)
    assert got.engine == "ray" and set(got.times) == {"hash", "count", "pack", "write"}
    assert len(got.shards) > 3 and files_of(got) == files_of(ref)
    assert manifest_of(got) == manifest_of(ref)
    import ray

    assert ray.is_initialized()                          # a session it did not start is left running


@needs_ray
def test_ray_on_error(cluster, tmp_path):
    paths = write_corpus(tmp_path / "raw", bad=True)
    src = [str(p) for p in paths]
    with pytest.raises(DataError) as local_err:
        pack(src, tmp_path / "l.jsonl.packed", encoder(), progress=False)
    assert str(local_err.value).startswith(f"{paths[1]}:21: ") and local_err.value.code == "invalid_json"
    with pytest.raises(DataError) as ray_err:       # the first error in input order, whatever block ends first
        pack(src, tmp_path / "r.jsonl.packed", encoder(), PackOptions(block_size=BLOCK), engine=RayEngine(),
             progress=False)
    assert str(ray_err.value) == str(local_err.value)
    assert not (tmp_path / "r.jsonl.packed").exists() and not (tmp_path / "r.jsonl.packed.manifest.json").exists()

    local = pack(src, tmp_path / "l.jsonl.packed", encoder(), PackOptions(on_error="skip"), progress=False)
    remote = pack(src, tmp_path / "r.jsonl.packed", encoder(), PackOptions(on_error="skip", block_size=BLOCK),
                  engine=RayEngine(), progress=False)
    want = {"empty_assistant": 1, "invalid_json": 1, "invalid_sample": 1, "unknown_role": 1}
    assert local.skipped == remote.skipped == want
    assert local.skipped_examples == remote.skipped_examples
    assert local.skipped_examples[0].startswith(f"{paths[1]}:21: ")
    assert any(e.startswith(f"{paths[2]}:10#1: assistant turn 1 follows system") for e in local.skipped_examples)
    assert files_of(local)["l.jsonl.packed"] == files_of(remote)["r.jsonl.packed"]
    assert manifest_of(remote)["counts"]["skipped"] == want
    assert local.input_lines == sum(1 for p in paths for line in p.read_text().splitlines() if line.strip())
    assert "skipped            4 (empty_assistant 1" in local.text()


def run_cli(*args, **kw):
    return subprocess.Popen([sys.executable, "-m", "energon_nemotron.cli", "pack-megatron", *args, *ENCODER_ARGS,
                             "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


#: a driver to kill mid-write: what ``pack-megatron --rows-per-shard N --engine ray --address A
#: --block-size B`` runs, with a callback that blocks once PAUSE shards are written and recorded
DRIVER = """
import sys, threading
from energon_nemotron.megatron_packed import MegatronSFTPackedEncoder
from energon_nemotron.megatron_packed.offline_pack import PackOptions, pack
from energon_nemotron.megatron_packed.ray_engine import RayEngine

tokenizer, seq_length, fmt, inputs, output, rows_per_shard, block_size, address, pause = sys.argv[1:]

def on_shard_done(written):
    if written >= int(pause):
        threading.Event().wait()            # until the test kills this process

pack([inputs], output, MegatronSFTPackedEncoder(tokenizer, int(seq_length), fmt),
     PackOptions(rows_per_shard=int(rows_per_shard), block_size=int(block_size)),
     engine=RayEngine(address=address), progress=False, on_shard_done=on_shard_done)
"""


@needs_ray
def test_ray_resume_after_the_driver_is_killed(cluster, corpus, tmp_path):
    out = tmp_path / "rows.jsonl.packed"
    src = str(corpus["root"] / "raw" / "part*.jsonl")
    args = ["--input", src, "--output", str(out), "--rows-per-shard", str(RPS),
            "--engine", "ray", "--address", cluster, "--block-size", str(BLOCK)]
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(DEMO_TOKENIZER), str(L), FMT, src, str(out), str(RPS),
                             str(BLOCK), cluster, "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    manifest = out.with_name(out.name + ".manifest.json")
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and proc.poll() is None:
        if manifest.exists() and sum(s["complete"] for s in json.loads(manifest.read_text())["shards"]) >= 2:
            break
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    state = json.loads(manifest.read_text())
    assert sum(s["complete"] for s in state["shards"]) == 2 and not state["complete"]
    assert out.with_name(out.name + ".counts.npz").exists()

    res = run_cli(*args, "--json")
    stdout, stderr = res.communicate(timeout=240)
    assert res.returncode == 0, stderr
    summary = json.loads(stdout.splitlines()[-1])
    assert summary["shards_skipped"] == 2 and summary["engine"] == "ray"
    assert any("resumed rows.jsonl.packed.manifest.json: 2 of" in n for n in summary["notes"])
    assert any("reused the counts" in n for n in summary["notes"])
    ref = corpus["sharded"]
    assert summary["shards"] == ref.shards
    assert {n: (tmp_path / n).read_bytes() for n in summary["shards"]} == files_of(ref)
    assert json.loads(manifest.read_text())["shards"] == manifest_of(ref)["shards"]
    assert not list(tmp_path.glob("*.tmp")) and not out.with_name(out.name + ".counts.npz").exists()


@needs_ray
def test_cli_ray_on_its_own_one_cpu_cluster(corpus, tmp_path):
    """The CLI starts (and stops) a local cluster of one CPU: one actor counts, then a task writes."""
    out = tmp_path / "one.jsonl.packed"
    res = run_cli("--input", *(str(p) for p in corpus["paths"]), "--output", str(out), "--engine", "ray",
                  "--num-cpus", "1", "--block-size", str(BLOCK))
    stdout, stderr = res.communicate(timeout=240)
    assert res.returncode == 0, stderr
    assert "wrote one.jsonl.packed beside" in stdout and "skipped            0" in stdout
    assert "engine             ray; hash" in stdout and "count" in stdout and "write" in stdout
    assert out.read_bytes() == files_of(corpus["single"])["one.jsonl.packed"]
    # Ray kept quiet: no progress bars, no Python logs; only Ray saying it read its (fatal) log level,
    # and, the input being small, the one-line hint that the local engine is faster here
    size, blocks = sum(p.stat().st_size for p in corpus["paths"]), len(split_blocks(corpus["paths"], BLOCK))
    hint = (f"warning: the input is small ({size / 2**20:.1f} MiB in {blocks} blocks, under 8 MiB): --engine local "
            "is usually faster here; Ray pays for starting its actors")
    noise = [line for line in stderr.splitlines() if line.strip() and "Set ray log level" not in line]
    assert noise == [hint], noise


@needs_ray
def test_ray_count_bar_leaves_the_actors_start_up_out(cluster, corpus):
    """The counting bar's clock restarts once every actor has returned its first block (those
    blocks' bytes left out of its rate and ETA); a small input ends the run with the hint."""
    from itertools import combinations

    from tqdm import tqdm

    from energon_nemotron.megatron_packed.ray_engine import SmallInputWarning

    blocks = split_blocks(corpus["paths"], BLOCK)
    bar = tqdm(total=sum(b.size for b in blocks), file=io.StringIO(), mininterval=0)
    opened = bar.start_t
    with pytest.warns(SmallInputWarning, match=r"the input is small \(0\.\d MiB in \d+ blocks, under 8 MiB\)"):
        with RayEngine() as engine:
            counted = engine.count(blocks, encoder(), "raise", bar)
            assert engine.workers == 2 and engine.hint
        assert engine.hint is None
    assert counted.costs.tolist() == count_local(blocks, encoder()).costs.tolist()
    assert bar.n == bar.total and bar.start_t > opened
    assert bar.initial in {a.size + b.size for a, b in combinations(blocks, 2)}      # the first round: 2 actors
    bar.close()


def test_restart_clock_leaves_the_units_before_out():
    from tqdm import tqdm

    from energon_nemotron.megatron_packed.ray_engine import restart_clock

    bar = tqdm(total=100, file=io.StringIO(), mininterval=0)
    bar.update(40)
    time.sleep(0.2)
    before = time.time()                                # tqdm's clock (bar._time) is time.time
    restart_clock(bar)
    bar.update(10)
    state = bar.format_dict
    since = time.time() - before
    assert (state["n"], state["initial"]) == (50, 40)
    assert bar.start_t >= before and state["elapsed"] <= since    # restarted now, not at the bar's opening
    bar.close()
    off = tqdm(total=10, disable=True)
    restart_clock(off)                                  # a disabled bar, or no bar at all: nothing
    restart_clock(object())


# -- the loader reading manifests --------------------------------------------------------------
def loader_config(path, tokenizer=DEMO_TOKENIZER, **source):
    src = {"format": "megatron_sft_packed", "path": str(path), "seq_length": L, "prompt_format": FMT, **source}
    return {"tokenizer": str(tokenizer), "data": {"train": src},
            "loader": {"batch_size": 2, "num_workers": 2, "seed": 3}}


def tensors(batches) -> list:
    return [(b.tokens.tolist(), b.labels.tolist(), b.loss_mask.tolist(), b.position_ids.tolist(),
             [c.tolist() for c in b.cu_seqlens]) for b in batches]


def test_loader_reads_a_manifest_of_shards_like_the_single_file(corpus):
    single = Path(corpus["single"].manifest[:-len(".manifest.json")])
    manifest = Path(corpus["sharded"].manifest)
    for shuffle in (1000, None):
        cfg_one, cfg_many = loader_config(single), loader_config(manifest)
        for c in (cfg_one, cfg_many):
            c["loader"]["shuffle_buffer_size"] = shuffle
        one = list(build_train_loader(cfg_one, repeat=False))
        many = list(build_train_loader(cfg_many, repeat=False))
        assert tensors(one) == tensors(many) and len(one) == -(-corpus["single"].rows // 2)
        assert many[0].sample_keys[0][0].startswith(str(manifest.parent / "rows-0"))
    # resume in the middle of the stream of shards
    first = build_train_loader(cfg_many, repeat=False)
    it = iter(first)
    head = [next(it) for _ in range(5)]
    state = json.loads(json.dumps(first.state_dict()))
    assert "manifest" in state["fingerprint"]["train"]
    rest = build_train_loader(cfg_many, repeat=False)
    rest.load_state_dict(state)
    assert tensors(head + list(rest)) == tensors(many)


def test_loader_refuses_a_manifest_of_another_encoder(corpus, tmp_path):
    manifest = Path(corpus["sharded"].manifest)
    cfg = loader_config(manifest, seq_length=1024, prompt_format="identity")
    with pytest.raises(ConfigError) as err:
        build_train_loader(cfg)
    text = str(err.value)
    assert text.startswith(f"{manifest}: the rows were packed for another encoder than the one configured")
    for line in ("  prompt_format: manifest \"nemotron-h-aligned\", configured \"identity\"",
                 "  seq_length: manifest 512, configured 1024",
                 "  pad_token: manifest \"<SPECIAL_233>\", configured \"<unk>\""):
        assert line in text.splitlines()
    assert "tokenizer" not in text and "chat_key" not in text
    # the single file, with its manifest beside it; and another tokenizer folder
    tok = tmp_path / "tok"
    shutil.copytree(DEMO_TOKENIZER, tok)
    (tok / "tokenizer_config.json").write_text((tok / "tokenizer_config.json").read_text() + "\n")
    single = Path(corpus["single"].manifest[:-len(".manifest.json")])
    with pytest.raises(ConfigError, match=r"one\.jsonl\.packed\.manifest\.json: the rows were packed for another "
                                          r"encoder.*\n  tokenizer \(sha256 over its folder's files\): manifest \""):
        build_train_loader(loader_config(single, tokenizer=tok))
    with pytest.raises(ConfigError, match=r"chat_key: manifest \"messages\", configured \"conversation\""):
        build_train_loader(loader_config(single, chat_key="conversation"))
    # a sharded output named by its (absent) output path points to the manifest
    with pytest.raises(ConfigError, match=r"set path to their manifest rows\.jsonl\.packed\.manifest\.json"):
        build_train_loader(loader_config(manifest.with_name("rows.jsonl.packed")))


def test_loader_refuses_an_incomplete_manifest(corpus, tmp_path):
    folder = tmp_path / "copy"
    shutil.copytree(Path(corpus["sharded"].manifest).parent, folder)
    m = json.loads((folder / "rows.jsonl.packed.manifest.json").read_text())
    m["shards"][1]["complete"] = False
    (folder / "rows.jsonl.packed.manifest.json").write_text(json.dumps(m))
    with pytest.raises(ConfigError, match=r"shard 1 \(rows-00001-of-\d+\.jsonl\.packed\) is not complete"):
        build_train_loader(loader_config(folder / "rows.jsonl.packed.manifest.json"))


def _copy_of_sharded(corpus, folder: Path) -> tuple[Path, dict]:
    shutil.copytree(Path(corpus["sharded"].manifest).parent, folder)
    path = folder / "rows.jsonl.packed.manifest.json"
    return path, json.loads(path.read_text())


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_refuses_a_shard_listed_twice_or_changed(corpus, tmp_path, workers):
    """Damage that keeps every size: a manifest listing shard 0 twice (shard 1's entry replaced), a
    same-size edit of a shard, a recorded sha256 of zeros: each a ConfigError naming it before any
    batch, never a silent read."""
    path, m = _copy_of_sharded(corpus, tmp_path / "twice")
    m["shards"][1] = dict(m["shards"][0])
    path.write_text(json.dumps(m))
    with pytest.raises(ConfigError, match=r"shards 0 and 1 are both 'rows-00000-of-\d+\.jsonl\.packed': the manifest "
                                          r"lists a shard twice"):
        build_train_loader(loader_config(path))
    path, m = _copy_of_sharded(corpus, tmp_path / "edited")
    shard = path.parent / m["shards"][1]["file"]
    data = bytearray(shard.read_bytes())
    at = data.index(b"9") if b"9" in data else data.index(b"1")
    data[at:at + 1] = b"8" if data[at:at + 1] == b"9" else b"2"          # a digit for a digit: same size
    shard.write_bytes(bytes(data))
    cfg = loader_config(path)
    cfg["loader"]["num_workers"] = workers
    with pytest.raises(ConfigError, match=rf"{re.escape(str(path))}: shard {shard.name}: its sha256 is [0-9a-f]{{64}}, "
                                          r"the manifest records [0-9a-f]{64}: the file changed since it was packed"):
        next(iter(build_train_loader(cfg)))
    path, m = _copy_of_sharded(corpus, tmp_path / "zeros")
    m["shards"][0]["sha256"] = "0" * 64
    path.write_text(json.dumps(m))
    cfg = loader_config(path)
    cfg["loader"]["num_workers"] = workers
    with pytest.raises(ConfigError, match=r"the manifest records 0{64}"):
        next(iter(build_train_loader(cfg)))
