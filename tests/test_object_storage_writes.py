"""Writing to object storage (issue 47): ``energon-nemotron prepare`` of shards or a JSONL on the
store (Energon's prepare writes the indexes there), read as the same data prepared on disk; and
``pack-megatron`` on object storage (item 3): inputs fetched from and output published
to ``msc://`` (moto on 127.0.0.1, the ``object_store`` fixture) without ``flock`` or rename: a lock
object made by a conditional put, packing in a local staging folder, the manifest put last. The
rows read back from the store are those of the same pack on local disk; a second writer is refused
naming the holder; a run killed while publishing leaves no manifest (nothing reads as complete) and
the next run takes its lock over and finishes."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys

import pytest

from conftest import DEMO_TOKENIZER
from energon_nemotron.demo.conversations import make_conversations
from energon_nemotron.errors import ConfigError
from energon_nemotron.loading import build_train_loader
from energon_nemotron.megatron_packed import MegatronSFTPackedEncoder
from energon_nemotron.megatron_packed.offline_pack import PackOptions, pack
from energon_nemotron.megatron_packed.store_output import pack_with_store
from energon_nemotron.parallel.broadcast import batches_equal

L, FORMAT = 512, "nemotron-h-aligned"


@pytest.fixture(scope="module")
def raw(tmp_path_factory, object_store):
    """60 conversations as a local JSONL, also on the store as two JSONL objects (30 each)."""
    root = tmp_path_factory.mktemp("pack_store")
    convs = make_conversations(60, seed=11)
    (root / "raw.jsonl").write_text("".join(json.dumps({"messages": c}) + "\n" for c in convs))
    for k in range(2):
        part = root / f"part-{k}.jsonl"
        part.write_text("".join(json.dumps({"messages": c}) + "\n" for c in convs[30 * k:30 * (k + 1)]))
        object_store.upload(part, f"raw/part-{k}.jsonl")
    return root


def encoder():
    return MegatronSFTPackedEncoder(DEMO_TOKENIZER, L, FORMAT)


def rows(path: str) -> list:
    """Every batch of the rows at ``path`` (file order), the rows named without their folder."""
    src = {"format": "megatron_sft_packed", "path": path, "seq_length": L, "prompt_format": FORMAT}
    cfg = {"tokenizer": str(DEMO_TOKENIZER), "data": {"train": src},
           "loader": {"batch_size": 2, "num_workers": 0, "shuffle_buffer_size": None}}
    folder = path.rsplit("/", 1)[0] + "/"
    return [dataclasses.replace(b, sample_keys=[[k.replace(folder, "") for k in r] for r in b.sample_keys])
            for b in build_train_loader(cfg, repeat=False)]


def local_pack(raw, tmp_path) -> list:
    out = tmp_path / "local" / "rows.jsonl.packed"
    pack([str(raw / "raw.jsonl")], out, encoder(), PackOptions(rows_per_shard=4), progress=False)
    return rows(str(mf_path(out)))


def mf_path(out) -> str:
    return f"{out}.manifest.json"


def test_a_pack_published_to_the_store_reads_as_the_local_pack(raw, object_store, tmp_path):
    """Inputs fetched by a glob on the store, shards of 4 rows published under msc://: the rows read
    back from the store's manifest are the local pack's; a rerun publishes nothing new."""
    url = object_store.url("packs/a/rows.jsonl.packed")
    summary = pack_with_store([object_store.url("raw/part-*.jsonl")], url, encoder(), PackOptions(rows_per_shard=4),
                              progress=False, staging=tmp_path / "staging")
    assert summary.manifest == mf_path(url) and all(s.startswith(object_store.url("packs/a/")) for s in summary.shards)
    here, there = local_pack(raw, tmp_path), rows(mf_path(url))
    assert len(here) == len(there) > 0 and all(batches_equal(a, b) for a, b in zip(here, there))
    keys = {o["Key"] for o in object_store.client().list_objects_v2(Bucket="lake", Prefix="packs/a/")["Contents"]}
    assert "packs/a/rows.jsonl.packed.lock" not in keys and "packs/a/rows.jsonl.packed.manifest.json" in keys
    def etags() -> dict:
        listed = object_store.client().list_objects_v2(Bucket="lake", Prefix="packs/a/")["Contents"]
        return {o["Key"]: (o["ETag"], o["LastModified"]) for o in listed}

    before = etags()
    pack_with_store([object_store.url("raw/part-*.jsonl")], url, encoder(), PackOptions(rows_per_shard=4),
                    progress=False, staging=tmp_path / "staging")
    assert etags() == before                       # nothing put again: the same manifest is there


def test_the_command_line_packs_to_the_store(raw, object_store, tmp_path):
    url = object_store.url("packs/cli/rows.jsonl.packed")
    res = subprocess.run([sys.executable, "-m", "energon_nemotron.cli", "pack-megatron", "--input",
                          str(raw / "raw.jsonl"), "--output", url, "--tokenizer", str(DEMO_TOKENIZER), "--seq-length",
                          str(L), "--prompt-format", FORMAT, "--rows-per-shard", "4", "--no-progress", "--staging",
                          str(tmp_path / "staging")], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "MSC_CONFIG": str(object_store.config)})
    assert res.returncode == 0, res.stderr[-2000:]
    here, there = local_pack(raw, tmp_path), rows(mf_path(url))
    assert len(here) == len(there) > 0 and all(batches_equal(a, b) for a, b in zip(here, there))


def test_a_second_writer_is_refused_naming_the_holder(raw, object_store, tmp_path):
    """A lock object held by a run on another host: the run is refused, naming the holder and the
    lock object to delete once that run is gone; nothing is published."""
    url = object_store.url("packs/held/rows.jsonl.packed")
    object_store.client().put_object(Bucket="lake", Key="packs/held/rows.jsonl.packed.lock",
                                     Body=b"pid 4242 on another-host, started 2026-12-07 10:00:00, token x\n")
    with pytest.raises(ConfigError, match=r"another pack-megatron run is writing it \(pid 4242 on another-host, "
                                          r"started 2026-12-07 10:00:00, token x\).*delete "
                                          r"msc://lake/packs/held/rows.jsonl.packed.lock and rerun"):
        pack_with_store([str(raw / "raw.jsonl")], url, encoder(), PackOptions(rows_per_shard=4), progress=False,
                        staging=tmp_path / "staging")
    listed = object_store.client().list_objects_v2(Bucket="lake", Prefix="packs/held/")["Contents"]
    assert [o["Key"] for o in listed] == ["packs/held/rows.jsonl.packed.lock"]


KILLED = """
import os, sys
from energon_nemotron._energon import storage
from energon_nemotron.megatron_packed import MegatronSFTPackedEncoder
from energon_nemotron.megatron_packed.offline_pack import PackOptions
from energon_nemotron.megatron_packed.store_output import pack_with_store

real, uploads = storage.RemotePath.upload, []
def upload(self, local, attributes):          # killed (no cleanup at all) after its second shard
    real(self, local, attributes)
    uploads.append(local)
    if len(uploads) == 2:
        os._exit(9)
storage.RemotePath.upload = upload
raw, url, tokenizer, staging = sys.argv[1:]
pack_with_store([raw], url, MegatronSFTPackedEncoder(tokenizer, 512, "nemotron-h-aligned"),
                PackOptions(rows_per_shard=4), progress=False, staging=staging)
"""


def test_a_run_killed_while_publishing_is_never_read_and_the_next_run_finishes_it(raw, object_store, tmp_path):
    url = object_store.url("packs/killed/rows.jsonl.packed")
    res = subprocess.run([sys.executable, "-c", KILLED, str(raw / "raw.jsonl"), url, str(DEMO_TOKENIZER),
                          str(tmp_path / "staging")], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "MSC_CONFIG": str(object_store.config)})
    assert res.returncode == 9, res.stderr[-2000:]
    listed = {o["Key"] for o in object_store.client().list_objects_v2(Bucket="lake", Prefix="packs/killed/")["Contents"]}
    assert "packs/killed/rows.jsonl.packed.manifest.json" not in listed and len(listed) == 3   # 2 shards + the lock
    lock = object_store.client().get_object(Bucket="lake", Key="packs/killed/rows.jsonl.packed.lock")["Body"].read()
    assert f" on {socket.gethostname()}, started ".encode() in lock
    with pytest.raises(ConfigError, match=r"rows.jsonl.packed.manifest.json' does not exist"):
        rows(mf_path(url))                          # the cut output is not read, as complete or at all
    pack_with_store([str(raw / "raw.jsonl")], url, encoder(), PackOptions(rows_per_shard=4), progress=False,
                    staging=tmp_path / "staging")   # its pid is dead on this host: the lock is taken over
    here, there = local_pack(raw, tmp_path), rows(mf_path(url))
    assert len(here) == len(there) > 0 and all(batches_equal(a, b) for a, b in zip(here, there))


def test_of_two_runs_taking_one_lock_the_store_lets_one_in(object_store):
    """The lock is a conditional put: while one run holds it (a live pid on this host), a second is
    refused; once released, it is free again (the object is gone)."""
    from energon_nemotron._energon.storage import RemotePath
    from energon_nemotron.megatron_packed.store_output import store_lock

    out = RemotePath(object_store.url("packs/race/rows.jsonl.packed"))
    with store_lock(out) as lock:
        assert f"pid {os.getpid()} on {socket.gethostname()}" in lock.read_text()
        with pytest.raises(ConfigError, match=rf"another pack-megatron run is writing it \(pid {os.getpid()} on "):
            with store_lock(out):
                pass
    assert not lock.is_file()
    with store_lock(out):
        pass


# -- energon-nemotron prepare on the store -----------------------------------------------------------
def chat_rows(n: int) -> list:
    return [(f"s{i:03d}", {"json": json.dumps({"messages": [{"role": "user", "content": f"Question {i}?"},
                                                            {"role": "assistant", "content": f"Answer {i}."}]}).encode()})
            for i in range(n)]


@pytest.mark.parametrize("workers", [0, 2])
def test_prepare_on_the_store_reads_as_the_same_shards_prepared_on_disk(object_store, tmp_path, workers):
    """Raw shards uploaded to the store, prepared there by the command line (its indexes and
    .nv-meta written by Energon through the store): the batches of the same shards prepared locally."""
    from energon_data import text_config
    from energon_nemotron.demo.datasets import write_shards
    from energon_nemotron.loading.prepare import PrepareOptions, prepare_dataset

    local = write_shards(tmp_path / "corpus", chat_rows(20), per_shard=6)
    url = object_store.upload(local, f"prep-{workers}/corpus")
    res = subprocess.run([sys.executable, "-m", "energon_nemotron.cli", "prepare", url, "--cooker", "openai_messages",
                          "--num-workers", "1", "--no-progress"], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "MSC_CONFIG": str(object_store.config)})
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"indexed {url}: 4 shards, 20 samples" in res.stdout
    prepare_dataset(local, "openai_messages", PrepareOptions(workers=1, progress=False))
    here = list(build_train_loader(text_config(local, workers=workers), repeat=False))
    there = list(build_train_loader(text_config(url, workers=workers), repeat=False))
    assert len(here) == len(there) == 20 and all(batches_equal(a, b) for a, b in zip(here, there))


def test_prepare_of_a_jsonl_on_the_store_writes_its_index_there(object_store, tmp_path):
    from energon_data import text_config
    from energon_nemotron.loading.prepare import PrepareOptions, prepare_dataset

    data = tmp_path / "chat.jsonl"
    data.write_text("".join(r[1]["json"].decode() + "\n" for r in chat_rows(9)))
    object_store.upload(data, "prep-jsonl/chat.jsonl")
    url = object_store.url("prep-jsonl/chat.jsonl")
    done = prepare_dataset(url, "openai_messages", PrepareOptions(progress=False))
    assert done.jsonl and done.samples == 9
    prepare_dataset(data, "openai_messages", PrepareOptions(progress=False))
    batches = {}
    for path in (str(data), url):
        cfg = text_config(path, workers=0)
        cfg["data"]["default_cooker"] = "openai_messages"
        batches[path] = list(build_train_loader(cfg, repeat=False))
    assert len(batches[url]) == len(batches[str(data)]) == 9
    assert all(batches_equal(a, b) for a, b in zip(batches[str(data)], batches[url]))


def test_prepare_where_the_store_refuses_writes_is_one_line(object_store):
    """Profile ``denied`` refuses every request: prepare stops in one line naming the profile, exit 2."""
    res = subprocess.run([sys.executable, "-m", "energon_nemotron.cli", "prepare", "msc://denied/corpus", "--cooker",
                          "openai_messages"], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "MSC_CONFIG": str(object_store.config)})
    errors = [line for line in res.stderr.splitlines() if line.startswith("error: ")]
    assert res.returncode == 2 and len(errors) == 1 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert "profile 'denied'" in errors[0] and "403" in errors[0]
