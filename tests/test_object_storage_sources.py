"""Other sources on object storage (issue 47): ``aux:`` media sources of a metadataset (a
prepared dataset and a folder, with and without the cache pool) and the Megatron-LM prepacked
source (a file and a manifest of shards), on moto's server on 127.0.0.1 (the ``object_store``
fixture), compared bit for bit with the same data on local disk, with 0 and 2 workers."""

from __future__ import annotations

import json

import pytest
import yaml

from energon_nemotron.errors import ConfigError
from energon_nemotron.loading import build_train_loader
from energon_nemotron.parallel.broadcast import batches_equal
from test_media_sources import aux_corpus  # noqa: F401  (the fixture)
from test_object_storage import read


# -- aux media sources on the store --------------------------------------------------------------------
@pytest.fixture(scope="module")
def remote_aux_mix(aux_corpus, object_store, tmp_path_factory):
    """``aux_corpus``'s metadataset with its aux sources on the store: the prepared media shards
    as ``msc://lake/aux/shards`` and the media folder as ``filesystem://msc://lake/aux/media``
    (the primaries stay local, so the sample keys are those of the local mix)."""
    object_store.upload(aux_corpus / "media", "aux/media")
    object_store.upload(aux_corpus / "shards", "aux/shards")
    mix = yaml.safe_load((aux_corpus / "mix.yaml").read_text())
    for entry in mix["splits"]["train"]["blend_epochized"]:
        entry["path"] = str(aux_corpus / entry["path"])
        entry["aux"] = {name: f"filesystem://{object_store.url('aux/media')}" if source.startswith("filesystem://")
                        else object_store.url(f"aux/{source}") for name, source in entry["aux"].items()}
    out = tmp_path_factory.mktemp("remote_aux") / "mix.yaml"
    out.write_text(yaml.safe_dump(mix))
    return out


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("pool", [False, True])
def test_aux_media_on_the_store_read_as_their_local_copies(aux_corpus, remote_aux_mix, tmp_path, workers, pool):
    """Images and audio named by path, found in a prepared dataset and in a folder on the store
    (direct paths, and by basename through one listing of the folder), with and without the
    cache pool: every batch is the one of the local aux sources."""
    from test_media_sources import config as media_config

    batches = {}
    for name, mix in (("local", aux_corpus / "mix.yaml"), ("store", remote_aux_mix)):
        cfg = media_config({"train": {"path": str(mix)}}, workers)
        if pool:
            cfg["loader"]["cache_pool"] = {"directory": str(tmp_path / f"pool-{name}")}
        loader = build_train_loader(cfg, repeat=False)
        batches[name] = list(loader)
        assert loader.telemetry()["basename_fallback"] == 3
    assert len(batches["local"]) == len(batches["store"]) > 0
    assert all(batches_equal(a, b) for a, b in zip(batches["local"], batches["store"]))
    assert sum(len(b.media_spans[0]) for b in batches["store"]) == 7


def test_aux_sources_on_the_store_are_checked_at_start(aux_corpus, object_store, tmp_path):
    """A prepared aux source whose index is not on the store, and a folder that is not there, are
    named by their msc:// locations before Energon builds anything."""
    url = object_store.upload(aux_corpus / "shards", "aux-noindex/shards")
    object_store.client().delete_object(Bucket="lake", Key="aux-noindex/shards/.nv-meta/index.sqlite")
    mix = tmp_path / "mix.yaml"
    mix.write_text(yaml.safe_dump({"__module__": "megatron.energon", "__class__": "MetadatasetV2", "splits": {
        "train": {"path": str(aux_corpus / "prim" / "asr.jsonl"), "subflavors": {"cooker": "granary_asr"},
                  "aux": {"speech": url, "more": f"filesystem://{object_store.url('aux-nowhere')}"}}}}))
    with pytest.raises(ConfigError) as e:
        read(mix, 0)
    assert (f"aux source 'speech' ('{url}'): {url} is not a prepared dataset (no .nv-meta/index.sqlite)"
            in str(e.value)), str(e.value)
    assert "aux source 'more' ('filesystem://msc://lake/aux-nowhere'): the folder msc://lake/aux-nowhere does not " \
        "exist" in str(e.value), str(e.value)


def test_an_aux_entry_on_the_store_is_one_ranged_read_of_its_bytes(aux_corpus, remote_aux_mix, monkeypatch):
    """Each fetch of a prepared aux source's entry on the store is one ranged read of exactly the
    entry's bytes (from its index), one per entry for its header and its decode: no shard is
    opened, which would download all of it."""
    from test_media_sources import config as media_config

    from energon_nemotron._energon import storage

    reads = []
    real = storage.RemotePath.read_range

    def counted(self, offset, length):
        reads.append((self.url, offset, length))
        return real(self, offset, length)

    monkeypatch.setattr(storage.RemotePath, "read_range", counted)
    shard_opens = []
    from megatron.energon.epathlib import EPath

    real_open = EPath.open
    monkeypatch.setattr(EPath, "open", lambda self, *a, **k: shard_opens.append(str(self)) or real_open(self, *a, **k))
    batches = list(build_train_loader(media_config({"train": {"path": str(remote_aux_mix)}}, 0), repeat=False))
    media = [r for r in reads if "/aux/shards/parts/" in r[0]]
    # 4 entries of the shards source, each fetched once: the plan's header read and the pack's decode
    # share one GET (the bytes kept between them, then dropped)
    assert batches and len(media) == 4, reads
    import tarfile

    with tarfile.open(aux_corpus / "shards" / "parts" / "data-0.tar") as tf:   # the local copy of the shard
        members = {(m.offset_data, m.size) for m in tf if m.name.split(".")[-1] in ("jpg", "png", "wav")}
    assert {(offset, length) for _, offset, length in media} == members
    assert not [u for u in shard_opens if u.endswith(".tar") and "/aux/shards/" in u], shard_opens


@pytest.mark.parametrize("workers", [0, 2])
def test_with_the_cache_pool_the_next_epochs_read_aux_entries_from_local_disk(aux_corpus, remote_aux_mix, tmp_path,
                                                                              monkeypatch, workers):
    """With ``loader.cache_pool`` set, the entries of a prepared aux source on the store are fetched
    in the first epoch and kept in the loader's own folder under the pool's folder: the second
    epoch fetches none (0 workers: counted) and gives the local second epoch's batches; the folder
    goes with its cache (removed by its maker; at its process's exit:
    ``test_the_entry_cache_keeps_its_bound_and_its_folder``)."""
    from test_media_sources import config as media_config

    from energon_nemotron._energon import storage
    from energon_nemotron.cookers.remote_entries import FOLDER_PREFIX
    from energon_nemotron.loading import loader as loader_module

    caches = []
    make = loader_module._entry_cache
    monkeypatch.setattr(loader_module, "_entry_cache", lambda s: caches.append(make(s)) or caches[-1])
    reads = []
    real = storage.RemotePath.read_range
    monkeypatch.setattr(storage.RemotePath, "read_range",
                        lambda self, offset, length: reads.append(self.url) or real(self, offset, length))
    pool = tmp_path / "pool"
    epochs = {}
    for name, mix in (("local", aux_corpus / "mix.yaml"), ("store", remote_aux_mix)):
        cfg = media_config({"train": {"path": str(mix)}}, workers)
        cfg["loader"]["cache_pool"] = {"directory": str(pool)}
        loader = build_train_loader(cfg, repeat=False)
        first = list(loader)
        fetched = len([u for u in reads if "/aux/shards/parts/" in u])
        epochs[name] = (first, list(loader))
        if name == "store":
            folders = list(pool.glob(f"{FOLDER_PREFIX}-*"))
            assert len(folders) == 1 and len([p for p in folders[0].rglob("*") if p.is_file()]) == 4
            if workers == 0:
                assert fetched == 4 and len([u for u in reads if "/aux/shards/parts/" in u]) == 4, reads
    assert len(caches) == 2
    for cache in caches:
        cache.remove()
    assert not list(pool.glob(f"{FOLDER_PREFIX}-*"))
    for epoch in (0, 1):
        here, there = epochs["local"][epoch], epochs["store"][epoch]
        assert len(here) == len(there) > 0 and all(batches_equal(a, b) for a, b in zip(here, there))


def test_the_entry_cache_keeps_its_bound_and_its_folder(tmp_path):
    """Each process writes at most its share of the bound, whole files only; a short file is not
    an entry; a folder left by a dead process of this host is removed when the next folder is
    made beside it; only the process that made the cache removes its folder."""
    import pickle
    import subprocess
    import sys

    from energon_nemotron.cookers.remote_entries import EntryCache

    cache = EntryCache(tmp_path, max_bytes=20, processes=2)          # 10 bytes a process
    url = "msc://lake/s.tar"
    assert cache.get(url, 0, 4) is None
    assert cache.put(url, 0, 4, b"abcd") and cache.put(url, 4, 6, b"efghij")
    assert not cache.put(url, 10, 1, b"k")                          # its share is full
    assert not cache.put(url, 11, 3, b"xy")                         # not the entry's size
    assert cache.get(url, 0, 4) == b"abcd" and cache.get(url, 4, 6) == b"efghij" and cache.get(url, 10, 1) is None
    assert cache.get(url, 0, 5) is None                              # another entry (the same offset)
    assert not list(cache.folder.rglob("*.tmp"))
    worker = pickle.loads(pickle.dumps(cache))                       # what a worker process gets
    assert worker.written == 0 and worker.get(url, 4, 6) == b"efghij" and worker.put(url, 20, 10, b"0123456789")
    worker.owner = -1
    worker.remove()                                                   # not its folder's maker: kept
    assert cache.folder.is_dir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    stale = tmp_path / cache.folder.name.replace(f"-{cache.owner}-", f"-{dead}-")
    stale.mkdir()
    other = EntryCache(tmp_path, max_bytes=20, processes=1)
    assert other.put(url, 0, 4, b"abcd") and not stale.exists() and cache.folder.is_dir()
    cache.remove()
    other.remove()
    assert not list(tmp_path.iterdir())
    # a process that exits removes the folder of the cache it made (no explicit remove)
    script = ("import sys; from pathlib import Path; from energon_nemotron.cookers.remote_entries import EntryCache; "
              "c = EntryCache(Path(sys.argv[1]), 100, 1); assert c.put('msc://p/s.tar', 0, 3, b'abc'); "
              "print(c.folder)")
    made = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, check=True)
    assert made.stdout.strip().startswith(str(tmp_path)) and not list(tmp_path.iterdir())


# -- the Megatron-LM prepacked source on the store -----------------------------------------------------
@pytest.fixture(scope="module")
def packed_rows(tmp_path_factory, object_store):
    """Offline-packed rows (L=512), as one ``.jsonl.packed`` file with its manifest and as shards of
    a manifest, on local disk and uploaded beside each other under ``msc://lake/packed``."""
    from conftest import DEMO_TOKENIZER
    from energon_nemotron.demo.conversations import make_conversations
    from energon_nemotron.megatron_packed import MegatronSFTPackedEncoder
    from energon_nemotron.megatron_packed.offline_pack import pack_file

    root = tmp_path_factory.mktemp("packed")
    raw = root / "raw.jsonl"
    raw.write_text("".join(json.dumps({"messages": c}) + "\n" for c in make_conversations(90, seed=7)))
    encoder = MegatronSFTPackedEncoder(DEMO_TOKENIZER, 512, "nemotron-h-aligned")
    pack_file(raw, root / "one" / "rows.jsonl.packed", encoder, progress=False)
    pack_file(raw, root / "sharded" / "rows.jsonl.packed", encoder, progress=False, rows_per_shard=7)
    object_store.upload(root / "one", "packed/one")
    object_store.upload(root / "sharded", "packed/sharded")
    return root


def megatron_config(path: str, workers: int, shuffled: bool = True) -> dict:
    """Rows of ``path``, shuffled (seed 3: a per-epoch permutation, read by offset) or in file order."""
    from conftest import DEMO_TOKENIZER

    src = {"format": "megatron_sft_packed", "path": path, "seq_length": 512, "prompt_format": "nemotron-h-aligned"}
    return {"tokenizer": str(DEMO_TOKENIZER), "data": {"train": src},
            "loader": {"batch_size": 2, "num_workers": workers, "seed": 3, "shuffle_buffer_size": 1 if shuffled else None}}


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("layout", ["one/rows.jsonl.packed", "sharded/rows.jsonl.packed.manifest.json"])
@pytest.mark.parametrize("shuffled", [False, True])
def test_megatron_prepacked_rows_on_the_store_read_as_on_disk(packed_rows, object_store, workers, layout, shuffled):
    """A ``.jsonl.packed`` file (its manifest beside it) and the manifest of shards, read in file
    order and shuffled (rows read by offset, in ranged GETs): the batches of local disk."""
    import dataclasses

    local, url = str(packed_rows / "one"), object_store.url("packed/one")
    if layout.startswith("sharded"):
        local, url = str(packed_rows / "sharded"), object_store.url("packed/sharded")
    here = list(build_train_loader(megatron_config(str(packed_rows / layout), workers, shuffled), repeat=False))
    there = list(build_train_loader(megatron_config(object_store.url(f"packed/{layout}"), workers, shuffled),
                                    repeat=False))
    # the rows are named by their file: on the store, by its URL
    assert all(k.startswith(url + "/") for b in there for row in b.sample_keys for k in row)
    there = [dataclasses.replace(b, sample_keys=[[k.replace(url, local) for k in row] for row in b.sample_keys])
             for b in there]
    assert len(here) == len(there) > 0 and all(batches_equal(a, b) for a, b in zip(here, there))


def test_a_manifest_on_the_store_is_checked_against_its_shards(packed_rows, object_store):
    """A shard of the manifest missing on the store, and one of another size, are named."""
    for name, damage in (("missing", "delete"), ("resized", "resize")):
        object_store.upload(packed_rows / "sharded", f"packed/{name}")
        key = f"packed/{name}/" + sorted(p.name for p in (packed_rows / "sharded").glob("*.jsonl.packed*")
                                          if not p.name.endswith(".json"))[1]
        if damage == "delete":
            object_store.client().delete_object(Bucket="lake", Key=key)
        else:
            object_store.client().put_object(Bucket="lake", Key=key, Body=b"{}\n")
        url = object_store.url(f"packed/{name}/rows.jsonl.packed.manifest.json")
        with pytest.raises(ConfigError, match=r"shard 1 \(.*\) (does not exist beside the manifest|has 3 bytes, the "
                                              r"manifest records)"):
            list(build_train_loader(megatron_config(url, 0), repeat=False))


def test_the_bytes_kept_between_an_entrys_two_reads_are_bounded(monkeypatch):
    """An entry's bytes are kept from its first read to its second (then dropped); an entry over
    HANDOFF_ENTRY_BYTES is never kept, and the oldest go first past HANDOFF_BYTES."""
    from energon_nemotron.cookers import remote_entries as re_

    fetched = []
    monkeypatch.setattr(re_, "HANDOFF_BYTES", 10)
    monkeypatch.setattr(re_, "HANDOFF_ENTRY_BYTES", 6)
    monkeypatch.setattr(re_, "_HANDOFF", re_.OrderedDict())
    monkeypatch.setattr(re_, "_HANDOFF_HELD", 0)
    url = "msc://lake/s.tar"

    def read(offset, size):
        return re_.remote_entry_bytes(url, offset, size, lambda: fetched.append((url, offset)) or b"x" * size)

    for _ in range(3):
        read(0, 5)
    assert fetched == [(url, 0), (url, 0)]              # read, kept, read again (dropped), fetched anew
    fetched.clear()
    read(100, 8)
    read(100, 8)
    assert fetched == [(url, 100), (url, 100)]          # over the entry bound: never kept
    re_._HANDOFF.clear()
    re_._HANDOFF_HELD = 0
    fetched.clear()
    for offset in (200, 300, 400):                      # 15 bytes: the first one is dropped
        read(offset, 5)
    assert list(re_._HANDOFF) == [(url, 300, 5), (url, 400, 5)] and re_.handoff_held() == 10
    read(200, 5)
    assert fetched[-1] == (url, 200)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("shuffled", [False, True])
def test_an_exact_resume_of_prepacked_rows_on_the_store_gives_the_rows_of_local_disk(packed_rows, object_store,
                                                                                     workers, shuffled):
    """Saved after 3 batches, restored in a new loader: the rest of the pass from the store, in file
    order and shuffled, is the rest of the local pass (elastic resume applies to Energon sources
    only, on the store as on disk)."""
    import dataclasses

    layout = "sharded/rows.jsonl.packed.manifest.json"
    local, url = str(packed_rows / "sharded"), object_store.url("packed/sharded")
    rest = {}
    for side, path in (("local", str(packed_rows / layout)), ("store", object_store.url(f"packed/{layout}"))):
        cfg = megatron_config(path, workers, shuffled)
        loader = build_train_loader(cfg, repeat=False)
        it = iter(loader)
        for _ in range(3):
            next(it)
        state = json.loads(json.dumps(loader.state_dict()))
        rest[side] = list(it)
        again = build_train_loader(cfg, repeat=False)
        again.load_state_dict(state)
        resumed = list(again)
        assert len(resumed) == len(rest[side]) > 0 and all(batches_equal(a, b) for a, b in zip(rest[side], resumed))
    there = [dataclasses.replace(b, sample_keys=[[k.replace(url, local) for k in row] for row in b.sample_keys])
             for b in rest["store"]]
    assert len(there) == len(rest["local"]) and all(batches_equal(a, b) for a, b in zip(rest["local"], there))
