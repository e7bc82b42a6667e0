"""Datasets on object storage (issue 47, first slice): ``msc://PROFILE/PATH`` sources read through
Energon's path layer from a real S3-compatible server (moto, on 127.0.0.1: the ``object_store``
fixture), compared bit for bit with the same data read from local disk, with 0 and 2 workers; the
start-up checks run on the store; the URL is never joined to the config's folder."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from energon_data import text_config, text_dataset
from energon_nemotron.config import load_config
from energon_nemotron.errors import ConfigError, DatasetError
from energon_nemotron.loading import build_train_loader
from energon_nemotron.parallel.broadcast import batches_equal


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, object_store):
    """A prepared text dataset (5 shards), on local disk and uploaded to ``msc://lake/corpus``."""
    ds, _ = text_dataset(tmp_path_factory.mktemp("msc") / "corpus", "openai_messages", n=40)
    return ds, object_store.upload(ds, "corpus")


def read(path, workers: int, packing=None) -> list:
    cfg = text_config(path, workers=workers, packing=packing, shuffle_buffer_size=8)
    return list(build_train_loader(cfg, repeat=False))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_prepared_folder_on_object_storage_reads_as_on_disk(corpus, workers):
    local, url = corpus
    packing = {"algorithm": "first_fit_decreasing", "buffer_size": 8}
    here, there = read(local, workers, packing), read(url, workers, packing)
    assert len(here) == len(there) > 0
    assert all(batches_equal(a, b) for a, b in zip(here, there))
    assert [b.sample_keys for b in here] == [b.sample_keys for b in there]


def test_an_msc_leaf_of_a_local_metadataset_reads_as_its_local_copy(corpus, tmp_path):
    local, url = corpus
    blends = {}
    for name, path in (("local", str(local)), ("remote", url)):
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump({
            "__module__": "megatron.energon", "__class__": "MetadatasetV2",
            "splits": {"train": {"path": path}}}))
        blends[name] = read(tmp_path / f"{name}.yaml", 0)
    assert len(blends["local"]) == len(blends["remote"]) > 0
    assert all(batches_equal(a, b) for a, b in zip(blends["local"], blends["remote"]))


def test_the_start_up_checks_read_the_store(corpus, object_store):
    """A shard whose index is not on the store, and a prefix that holds no prepared dataset, are
    named by their msc:// locations before Energon builds anything."""
    local, _ = corpus
    url = object_store.upload(local, "damaged")
    shard = sorted(p.relative_to(local).as_posix() for p in local.rglob("*.tar"))[1]     # parts/data-1.tar
    object_store.client().delete_object(Bucket="lake", Key=f"damaged/{shard}.idx")
    with pytest.raises(DatasetError, match=rf"{url}/{shard}: its index {shard.split('/')[-1]}.idx is missing"):
        read(url, 0)
    object_store.client().put_object(Bucket="lake", Key="raw/part-0.tar", Body=b"x" * 1024)
    with pytest.raises(ConfigError, match=r"data.train.path: 'msc://lake/raw' is not a prepared Energon dataset"):
        read(object_store.url("raw"), 0)


def test_a_url_is_kept_and_other_schemes_are_named(tmp_path):
    """``msc://`` stays the URL (not joined to the config's folder, ``//`` kept); ``file://`` is a
    local path; ``s3://`` is refused with the way to name it."""
    (tmp_path / "a.yaml").write_text(yaml.safe_dump({"tokenizer": "tok", "data": {"train": {"path": "msc://lake/c"}}}))
    assert load_config(tmp_path / "a.yaml").data.train.path == "msc://lake/c"
    assert str(load_config({"tokenizer": "t", "data": {"train": {"path": f"file://{tmp_path}/d"}}}).data.train.path) \
        == f"{tmp_path}/d"
    with pytest.raises(ConfigError, match=r"data.train.path: 's3://b/c': the scheme s3:// is not read here; name "
                                          r"object storage as msc://PROFILE/PATH"):
        load_config({"tokenizer": "t", "data": {"train": {"path": "s3://b/c"}}})


def test_the_installed_set_is_one_pip_accepts():
    """The s3 extra's boto3 sits in the botocore window of Energon's aiobotocore: ``pip check``."""
    res = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr


# -- resume: the same batches from the store as from local disk ---------------------------------------
@pytest.mark.parametrize("workers", [0, 2])
def test_an_exact_resume_on_the_store_gives_the_batches_of_local_disk(corpus, workers):
    """Saved after 3 batches of one pass, restored in a new loader: the rest of the pass, the same
    from msc:// as from local disk (every loader read to its end: none is left with live workers)."""
    local, url = corpus
    rest = {}
    for path in (str(local), url):
        cfg = text_config(path, workers=workers, packing={"algorithm": "first_fit_decreasing", "buffer_size": 8},
                          shuffle_buffer_size=8)
        loader = build_train_loader(cfg, repeat=False)
        it = iter(loader)
        for _ in range(3):
            next(it)
        state = loader.state_dict()
        rest[path] = list(it)
        again = build_train_loader(cfg, repeat=False)
        again.load_state_dict(state)
        resumed = list(again)
        assert len(resumed) == len(rest[path]) > 0 and all(batches_equal(a, b) for a, b in zip(rest[path], resumed))
    assert len(rest[url]) == len(rest[str(local)])
    assert all(batches_equal(a, b) for a, b in zip(rest[str(local)], rest[url]))


def test_an_elastic_resume_on_the_store_gives_the_batches_of_local_disk(corpus):
    """Two ranks (2 workers each) save after 3 batches; one rank with 1 worker reads the rest: the
    same batches from msc:// as from local disk."""
    from energon_nemotron.resume import merge_rank_states

    local, url = corpus
    after = {}
    for path in (str(local), url):
        states = []
        for rank in range(2):
            loader = build_train_loader(text_config(path, workers=2, shuffle_buffer_size=8), repeat=False,
                                        dp_rank=rank, dp_size=2)
            it = iter(loader)
            for _ in range(3):
                next(it)
            states.append(loader.state_dict())
            list(it)                                    # read to its end: its workers exit now
        one = build_train_loader(text_config(path, workers=1, shuffle_buffer_size=8), repeat=False)
        one.load_state_dict(merge_rank_states(states), elastic=True)
        after[path] = list(one)
    assert len(after[url]) == len(after[str(local)]) > 0
    assert all(batches_equal(a, b) for a, b in zip(after[str(local)], after[url]))


# -- faults end in one line ----------------------------------------------------------------------------
def test_an_unreachable_endpoint_is_one_line_naming_the_profile(object_store, tmp_path):
    """Profile ``down`` points at a port on 127.0.0.1 where nothing listens: the loader API raises a
    ``ConfigError`` naming the URL, the profile, the endpoint and the config file; ``preview`` says
    the same in one line and exits 2, within a bound (the client's retries end)."""
    url = "msc://down/corpus"
    with pytest.raises(ConfigError, match=r"^msc://down/corpus: the object store cannot be read \(a listing: .*"
                                          r"Could not connect to the endpoint URL.*127\.0\.0\.1.*\); check the "
                                          r"profile 'down' in the multi-storage-client config "):
        read(url, 0)
    (tmp_path / "loader.yaml").write_text(yaml.safe_dump(text_config(url, workers=0)))
    res = subprocess.run([sys.executable, "-m", "energon_nemotron.cli", "preview", str(tmp_path / "loader.yaml")],
                         capture_output=True, text=True, timeout=300)
    errors = [line for line in res.stderr.splitlines() if line.startswith("error: ")]
    assert res.returncode == 2 and len(errors) == 1 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert "profile 'down'" in errors[0] and "127.0.0.1" in errors[0]


def test_a_missing_object_is_named(object_store):
    with pytest.raises(ConfigError, match=r"data.train.path: 'msc://lake/nothing/here' does not exist"):
        read(object_store.url("nothing/here"), 0)


def test_a_prepared_jsonl_on_object_storage_reads_as_on_disk(object_store, tmp_path):
    import json

    from energon_data import energon

    rows = [{"messages": [{"role": "user", "content": f"Question {i}?"}, {"role": "assistant", "content": f"A{i}."}]}
            for i in range(12)]
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    energon("prepare", str(data))
    url = object_store.upload_jsonl(data, "jsonl")
    batches = {}
    for path in (str(data), url):
        cfg = text_config(path, workers=0, shuffle_buffer_size=4)
        cfg["data"]["default_cooker"] = "openai_messages"
        batches[path] = list(build_train_loader(cfg, repeat=False))
    assert len(batches[url]) == len(batches[str(data)]) == 12
    assert all(batches_equal(a, b) for a, b in zip(batches[str(data)], batches[url]))


def test_the_start_up_checks_cost_one_listing_three_reads_and_two_per_shard(corpus, monkeypatch):
    """The store operations a start makes (each one Energon path call: a listing, a metadata
    request, a read or a ranged read), counted: one listing of the folder (every existence and
    size comes from it), one read of each .nv-meta file, two ranged reads of each shard's .tar.idx;
    no metadata request, and no read touches a shard."""
    from collections import Counter

    from energon_nemotron._energon import storage
    from energon_nemotron.loading.preflight import check_source

    local, url = corpus
    calls = []
    real = storage.RemotePath._call

    def counted(self, what, fn):
        calls.append((what, self.url))
        return real(self, what, fn)

    monkeypatch.setattr(storage.RemotePath, "_call", counted)
    check_source(url, "train")
    shards = len(list(local.rglob("*.tar")))
    kinds = Counter(what for what, _ in calls)
    assert shards >= 5 and len(calls) == 2 * shards + 4, calls
    assert kinds == {"a listing": 1, "a read": 3, "a ranged read": 2 * shards}, kinds
    assert sorted(u.rsplit("/", 1)[1] for what, u in calls if what == "a read") == [".info.json", "dataset.yaml",
                                                                                   "split.yaml"]
    assert all(u.endswith(".tar.idx") for what, u in calls if what == "a ranged read"), calls


def test_refused_credentials_are_one_line_naming_the_profile_and_the_403(object_store):
    """Profile ``denied``: a server that checks credentials and knows none of them."""
    with pytest.raises(ConfigError, match=r"^msc://denied/corpus: the object store cannot be read \(a listing: "
                                          r"PermissionError: .*status_code: 403\); check the profile 'denied' in "
                                          r"the multi-storage-client config .* \(its endpoint and credentials\)$"):
        read("msc://denied/corpus", 0)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_damaged_header_inside_a_shard_on_the_store_is_named_at_read(corpus, object_store, tmp_path, workers):
    """The start-up checks cannot see garbage over a sample's tar header (sizes and offsets agree);
    the read that meets it names the msc:// shard, the sample and what is wrong, read from the store."""
    import shutil

    from bad_inputs import damage_shard

    local, _ = corpus
    copy = tmp_path / "corpus"
    shutil.copytree(local, copy)
    shard = sorted(p.relative_to(copy).as_posix() for p in copy.rglob("*.tar"))[1]
    damage_shard(copy / shard, "garbage_header")
    url = object_store.upload(copy, f"header-{workers}")
    loader = build_train_loader(text_config(url, workers=workers), repeat=False)      # the start passes
    with pytest.raises(ConfigError) as e:
        list(loader)
    cause = e.value.__cause__ or e.value
    assert f"{url}/{shard}: sample " in str(e.value) and "cannot be read: no valid tar header at byte " in \
        str(e.value), f"{type(cause).__name__}: {e.value}"


# -- a connection cut in the middle of a shard read ----------------------------------------------------
@pytest.fixture(scope="module")
def cut_corpus(corpus, object_store):
    """The corpus behind the ``cut`` profile: the same objects, reached through the proxy that cuts
    connections (``msc://cut/cut/corpus``; the folder's name, and so the sample keys, as local)."""
    local, _ = corpus
    object_store.upload(local, "cut/corpus")
    yield local, "msc://cut/cut/corpus"
    object_store.proxy.arm(cuts=0, after=0)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_connection_cut_inside_a_shard_read_is_retried_and_changes_no_batch(cut_corpus, object_store, workers):
    """The first GET of a shard is cut 100 bytes into its body (the proxy closes the connection);
    the multi-storage-client fetches it again, and every batch is the one read from local disk."""
    local, url = cut_corpus
    object_store.proxy.arm(cuts=1, after=100)
    there = read(url, workers)
    assert object_store.proxy.cut == 1
    here = read(local, workers)
    assert len(here) == len(there) > 0 and all(batches_equal(a, b) for a, b in zip(here, there))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_shard_whose_connections_keep_being_cut_fails_naming_it(cut_corpus, object_store, workers):
    """Every GET of a shard is cut: after the client's bounded retries the read fails in one line
    naming the msc:// shard, the sample, the broken transfer and the profile; the start passed."""
    _, url = cut_corpus
    loader = build_train_loader(text_config(url, workers=workers), repeat=False)
    object_store.proxy.arm(cuts=10**9, after=100)
    with pytest.raises(DatasetError) as e:
        list(loader)
    message = str(e.value)
    assert re.match(rf"^{url}/parts/data-\d\.tar: sample \d+ of the shard( \(key '[^']+'\))? could not be fetched "
                    r"from the object store \(.*IncompleteRead.*\), after the multi-storage-client's retries; its size "
                    r"and index agree, so the transfer failed, not the shard: check the endpoint of profile 'cut'",
                    message), message
    assert "\n" not in message and object_store.proxy.cut >= 2
