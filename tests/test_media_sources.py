"""Where media files are found: Energon aux sources bound by a metadataset (a prepared WebDataset and
a ``filesystem://`` folder, with the basename fallback), and ``data.media_roots`` (absolute paths,
links, several roots), read through the real loader with 0 and 2 workers."""

from __future__ import annotations

import functools
import json
import os
from collections import Counter
from pathlib import Path

import pytest
import yaml
from megatron.energon.cache.file_store import SystemFileStore, WebdatasetFileStore
from megatron.energon.epathlib import EPath
from megatron.energon.source_info import SourceInfo

from conftest import DEMO_TOKENIZER
from energon_data import energon, prepare, write_shards
from energon_nemotron.cookers.media_sources import AuxMedia, media_scope
from energon_nemotron.demo.media import make_audio, make_image
from energon_nemotron.errors import ConfigError, DataError
from energon_nemotron.loading import build_task_encoder, build_train_loader
from energon_nemotron.resume import fingerprint
from energon_nemotron.registry import COOKERS
from energon_nemotron.telemetry import SharedCounter

PACKING = {"algorithm": "best_fit_decreasing", "buffer_size": 8, "pad_multiple": 4}
SMALL = {"image": {"min_patches": 64, "max_patches": 256}}
ASK = "<image> What is it?"


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    energon("prepare", str(path))
    return path


def chat(path: str, question: str = ASK, field: str = "image") -> dict:
    return {"conversations": [{"from": "human", "value": question}, {"from": "gpt", "value": "A thing."}],
            field: path}


def fragments(path: str) -> dict:
    return {"conversation": [{"sender": "user", "fragments": ["Look: ", {"t": "image", "value": path}]},
                             {"sender": "assistant", "fragments": ["Nice."]}]}


def config(data: dict, workers: int, on_error: str = "raise") -> dict:
    return {"tokenizer": str(DEMO_TOKENIZER),
            "task_encoder": {"name": "nemotron_multimodal",
                             "options": {"prompt_format": "nemotron6", "seq_length": 2048, **SMALL}},
            "packing": PACKING, "data": data,
            "loader": {"batch_size": 1, "num_workers": workers, "shuffle_buffer_size": None, "seed": 5,
                       "on_error": on_error}}


def read_all(cfg: dict):
    """(sample keys, media kinds, loader) of one epoch."""
    loader = build_train_loader(cfg, repeat=False)
    keys, kinds = [], Counter()
    for batch in loader:
        batch.validate()
        keys += [k for row in batch.sample_keys for k in row]
        spans = [s for row in batch.media_spans for s in row]
        kinds.update(s.kind for s in spans)
        visual = [s for s in spans if s.kind != "audio"]
        if visual:
            assert len(batch.media["pixel_values"]) == len(visual)
        # the placeholder runs hold exactly the planned media tokens
        assert sum(int((batch.tokens == i).sum()) for i in embedding_ids()) == sum(s.num_tokens for s in spans)
    return keys, kinds, loader


@functools.lru_cache(maxsize=None)
def embedding_ids() -> tuple[int, int]:
    from transformers import AutoTokenizer

    vocab = AutoTokenizer.from_pretrained(str(DEMO_TOKENIZER)).get_vocab()
    return vocab["<image>"], vocab["<so_embedding>"]


# -- Energon aux sources ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def aux_corpus(tmp_path_factory):
    """Three JSONL primaries whose media live only in aux sources, and a metadataset binding them:

    - ``chat.jsonl`` (general_conversations) + ``aux: {media: filesystem://media}``: one direct path,
      one found by basename, one audio
    - ``frag.jsonl`` (nemotron_conversation) + two aux sources, ``media_source: shards`` selects one:
      one direct path, one found by basename
    - ``asr.jsonl`` (granary_asr) + its only aux source ``speech``: one direct path, one by basename
    """
    root = tmp_path_factory.mktemp("aux")
    (root / "media" / "pics").mkdir(parents=True)
    (root / "media" / "pics" / "a.jpg").write_bytes(make_image(64, 48, seed=1))
    (root / "media" / "deep" / "nested").mkdir(parents=True)
    (root / "media" / "deep" / "nested" / "b.png").write_bytes(make_image(80, 64, seed=2, fmt="PNG"))
    (root / "media" / "sounds").mkdir()
    (root / "media" / "sounds" / "s.wav").write_bytes(make_audio(1.0, 16000, 1, seed=3))
    write_shards(root / "shards", [("images/cat", {"jpg": make_image(72, 40, seed=4)}),
                                   ("dog", {"png": make_image(48, 48, seed=5, fmt="PNG")}),
                                   ("clips/c0", {"wav": make_audio(0.8, 16000, 1, seed=6)}),
                                   ("clips/c1", {"wav": make_audio(1.2, 16000, 1, seed=7)})])
    prepare(root / "shards")
    write_jsonl(root / "prim" / "chat.jsonl", [
        chat("pics/a.jpg"), chat("old/location/b.png"),
        chat("sounds/s.wav", "<audio> What do you hear?", "audio")])
    write_jsonl(root / "prim" / "frag.jsonl", [fragments("images/cat.jpg"), fragments("somewhere/dog.png")])
    write_jsonl(root / "prim" / "asr.jsonl", [{"audio_filepath": "clips/c0.wav", "text": "Zero."},
                                              {"audio_filepath": "c1.wav", "text": "One."}])
    (root / "mix.yaml").write_text(yaml.safe_dump({
        "__module__": "megatron.energon", "__class__": "MetadatasetV2",
        "splits": {"train": {"blend_epochized": [
            {"repetitions": 1, "path": "prim/chat.jsonl", "aux": {"media": "filesystem://media"},
             "subflavors": {"cooker": "general_conversations"}},
            {"repetitions": 1, "path": "prim/frag.jsonl", "aux": {"shards": "shards", "other": "filesystem://media"},
             "subflavors": {"cooker": "nemotron_conversation", "media_source": "shards"}},
            {"repetitions": 1, "path": "prim/asr.jsonl", "aux": {"speech": "shards"},
             "subflavors": {"cooker": "granary_asr"}}]}}}))
    return root


@pytest.mark.parametrize("workers", [0, 2])
def test_metadataset_aux_sources_read_every_sample(aux_corpus, workers):
    keys, kinds, loader = read_all(config({"train": {"path": str(aux_corpus / "mix.yaml")}}, workers))
    # all 7 samples of the 3 primaries, each named by its file and line (no two the same)
    assert Counter(keys) == {k: 1 for k in ("chat.jsonl:1", "chat.jsonl:2", "chat.jsonl:3", "frag.jsonl:1",
                                            "frag.jsonl:2", "asr.jsonl:1", "asr.jsonl:2")}
    assert kinds == {"image": 4, "audio": 3}
    t = loader.telemetry()
    assert t["basename_fallback"] == 3 and t["skipped"] == {}
    assert t["media_decoded"] == {"image": 4, "audio": 3}
    assert "media found by basename: 3" in loader.stats.line()


def test_without_a_binding_the_aux_media_are_missing(aux_corpus, tmp_path):
    """The old behaviour (aux sources ignored) reads none of these samples: the paths are not in the
    dataset folder; the error hints at the unbound aux sources."""
    mds = tmp_path / "two.yaml"
    mds.write_text(yaml.safe_dump({"__module__": "megatron.energon", "__class__": "MetadatasetV2", "splits": {
        "train": {"path": str(aux_corpus / "prim" / "frag.jsonl"),
                  "aux": {"x": str(aux_corpus / "shards"), "y": f"filesystem://{aux_corpus / 'media'}"},
                  "subflavors": {"cooker": "nemotron_conversation"}}}}))
    with pytest.raises(DataError, match=r"not found under the dataset folder.*aux sources x, y but none holds its "
                                        r"media: set subflavors media_source: NAME") as e:
        list(build_train_loader(config({"train": {"path": str(mds)}}, 0), repeat=False))
    assert e.value.code == "missing_media"


def test_a_media_source_naming_no_aux_source_fails_at_start(aux_corpus, tmp_path):
    mds = tmp_path / "bad.yaml"
    mds.write_text(yaml.safe_dump({"__module__": "megatron.energon", "__class__": "MetadatasetV2", "splits": {
        "train": {"path": str(aux_corpus / "prim" / "frag.jsonl"), "aux": {"media": str(aux_corpus / "shards")},
                  "subflavors": {"cooker": "nemotron_conversation", "media_source": "pictures"}}}}))
    with pytest.raises(ConfigError, match=r"frag\.jsonl: subflavor media_source: 'pictures' names no aux source "
                                          r"of the dataset \(its aux sources: media\)"):
        build_train_loader(config({"train": {"path": str(mds)}}, 0), repeat=False)


def jsonl_sample(obj: dict, folder: Path, subflavors: dict | None = None, key: str = "3") -> dict:
    return {"__key__": key, "__restore_key__": ("x", 3), "__subflavors__": subflavors, "json": obj,
            "__sources__": (SourceInfo(dataset_path=EPath(folder / "d.jsonl"), index=3, shard_name="d.jsonl",
                                       file_names=("3.json",)),)}


class CountingStore(SystemFileStore):
    """A real filesystem FileStore that counts its reads."""

    reads = 0

    def __getitem__(self, key):
        type(self).reads += 1
        return super().__getitem__(key)


def test_aux_media_are_read_lazily_and_recorded_as_sources(aux_corpus, tmp_path):
    store = CountingStore(EPath(aux_corpus / "media"))
    sample = jsonl_sample(chat("pics/a.jpg"), tmp_path)
    with media_scope(aux={"media": store}):
        conv = COOKERS.get("general_conversations")(sample, media=store)
    ref = conv.media[0]
    assert isinstance(ref.payload, AuxMedia) and ref.name == "pics/a.jpg" and CountingStore.reads == 0
    assert [s.index for s in conv.__sources__] == [3, "pics/a.jpg"]          # the aux entry is a source
    media = build_task_encoder(config({"train": {"path": str(aux_corpus / "mix.yaml")}}, 0)).media
    planned = media.plan(ref, 0)                                                 # phase 1: the header
    assert CountingStore.reads == 1 and planned.plan.num_tokens > 0
    media.process(ref, planned)                                                  # phase 2: the decode
    assert CountingStore.reads == 2


def test_webdataset_aux_lookup_fallback_and_errors(aux_corpus, tmp_path):
    store = WebdatasetFileStore(EPath(aux_corpus / "shards"))
    lookups = SharedCounter(("basename_fallback",))
    cook = COOKERS.get("nemotron_conversation")
    with media_scope(aux={"media": store}, lookups=lookups):
        direct = cook(jsonl_sample(fragments("images/cat.jpg"), tmp_path))
        assert direct.media[0].payload.get()[:2] == b"\xff\xd8"                  # raw JPEG bytes
        assert direct.__sources__[-1].shard_name == "parts/data-0.tar"
        moved = cook(jsonl_sample(fragments("/mnt/old/dog.png"), tmp_path))    # absolute: by basename
        assert moved.media[0].payload.key == "dog.png" and lookups.totals() == {"basename_fallback": 1}
        with pytest.raises(DataError, match=r"image 'pics/cow\.jpg' not found in aux source 'media' \(.*shards\), "
                                            r"not even by its basename 'cow\.jpg'") as e:
            cook(jsonl_sample(fragments("pics/cow.jpg"), tmp_path))
    assert e.value.code == "missing_media" and lookups.totals() == {"basename_fallback": 1}


def test_ambiguous_basename_names_the_candidates(tmp_path):
    for d in ("x", "y"):
        (tmp_path / "aux" / d).mkdir(parents=True)
        (tmp_path / "aux" / d / "same.jpg").write_bytes(make_image(16, 16))
    store = SystemFileStore(EPath(tmp_path / "aux"))
    with media_scope(aux={"pics": store}), pytest.raises(DataError, match=r"basename 'same\.jpg' is ambiguous "
                                                                           r"there: 2 entries \(x/same\.jpg, "
                                                                           r"y/same\.jpg\)") as e:
        COOKERS.get("general_conversations")(jsonl_sample(chat("z/same.jpg"), tmp_path))
    assert e.value.code == "missing_media"


def test_a_filesystem_aux_source_cannot_be_left(tmp_path):
    (tmp_path / "aux").mkdir()
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "s.jpg").write_bytes(make_image(16, 16))
    os.symlink(tmp_path / "secret", tmp_path / "aux" / "link")
    store = SystemFileStore(EPath(tmp_path / "aux"))
    cook = COOKERS.get("general_conversations")
    with media_scope(aux={"media": store}):
        with pytest.raises(DataError, match=r"'link/s\.jpg' in aux source .* resolves to .*secret/s\.jpg, outside the "
                                            r"allowed folders") as e:
            cook(jsonl_sample(chat("link/s.jpg"), tmp_path))
        assert e.value.code == "path_escape"
        with pytest.raises(DataError, match="not even by its basename") as e:       # '..' never reads outside
            cook(jsonl_sample(chat("../secret/s.jpg"), tmp_path))
    with media_scope(roots=[tmp_path / "secret"], aux={"media": store}):           # a root may be linked to
        assert cook(jsonl_sample(chat("link/s.jpg"), tmp_path)).media[0].payload.key == "link/s.jpg"


# -- media roots ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def roots_corpus(tmp_path_factory):
    """A JSONL dataset naming media by absolute paths, through symlinked folders and by a relative
    path that only the second media root holds; the expected outcome per line."""
    root = tmp_path_factory.mktemp("roots")
    for folder, name in (("r1/imgs", "in1.jpg"), ("r2", "only2.jpg"), ("outside", "out.jpg")):
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / name).write_bytes(make_image(48, 32))
    (root / "ds").mkdir()
    os.symlink(root / "r1" / "imgs", root / "ds" / "linked")
    os.symlink(root / "outside", root / "ds" / "badlink")
    lines = [(chat(str(root / "r1" / "imgs" / "in1.jpg")), "ok"),       # absolute, inside root 1
             (chat(str(root / "outside" / "out.jpg")), "path_escape"),   # absolute, outside every root
             (chat("linked/in1.jpg"), "ok"),                             # link inside the dataset into root 1
             (chat("badlink/out.jpg"), "path_escape"),                   # link inside the dataset elsewhere
             (chat("only2.jpg"), "ok")]                                  # relative, found in the second root
    write_jsonl(root / "ds" / "data.jsonl", [obj for obj, _ in lines])
    return root, [want for _, want in lines]


def roots_config(root: Path, workers: int, roots=("r1", "r2"), on_error="skip") -> dict:
    data = {"train": {"path": str(root / "ds" / "data.jsonl")}, "default_cooker": "general_conversations"}
    if roots is not None:
        data["media_roots"] = [str(root / r) for r in roots]
    return config(data, workers, on_error)


@pytest.mark.parametrize("workers", [0, 2])
def test_media_roots_through_the_loader(roots_corpus, workers):
    root, wanted = roots_corpus
    keys, kinds, loader = read_all(roots_config(root, workers))
    assert sorted(keys) == sorted(f"data.jsonl:{i + 1}" for i, w in enumerate(wanted) if w == "ok") and kinds == {"image": 3}
    assert loader.skipped() == {"path_escape": 2}


def test_without_media_roots_those_paths_fail(roots_corpus):
    root, _ = roots_corpus
    keys, _, loader = read_all(roots_config(root, 0, roots=None))
    assert keys == [] and loader.skipped() == {"path_escape": 4, "missing_media": 1}


def test_media_root_errors_name_the_path_and_the_allowed_folders(roots_corpus):
    root, _ = roots_corpus
    folders = [root / "r1", root / "r2"]
    cook = COOKERS.get("general_conversations")
    with media_scope(roots=folders):
        with pytest.raises(DataError, match=r"image path 'badlink/out\.jpg' escapes the dataset folder and the media "
                                            r"roots: it resolves to .*outside/out\.jpg \(symlinks followed\), outside "
                                            r"the allowed folders \(.*ds, .*r1, .*r2\)"):
            cook(jsonl_sample(chat("badlink/out.jpg"), root / "ds"))
        with pytest.raises(DataError, match=r"image file 'gone\.jpg' not found under the dataset folder or the media "
                                            r"roots; looked for .*ds/gone\.jpg, .*r1/gone\.jpg, .*r2/gone\.jpg") as e:
            cook(jsonl_sample(chat("gone.jpg"), root / "ds"))
        assert e.value.code == "missing_media"
        conv = cook(jsonl_sample(chat("only2.jpg"), root / "ds"))
        assert conv.media[0].payload == (root / "r2" / "only2.jpg").resolve()


def test_media_roots_resolve_against_the_config_folder_and_must_exist(roots_corpus, tmp_path):
    from energon_nemotron.config import load_config

    root, _ = roots_corpus
    path = tmp_path / "loader.yaml"
    cfg = roots_config(root, 0)
    cfg["data"]["media_roots"] = [os.path.relpath(root / "r1", tmp_path), str(root / "missing")]
    path.write_text(yaml.safe_dump(cfg))
    loaded = load_config(path)
    assert loaded.data.media_roots[0] == tmp_path / os.path.relpath(root / "r1", tmp_path)
    with pytest.raises(ConfigError, match=r"data\.media_roots\[1\]: '.*missing' does not exist"):
        build_train_loader(path, repeat=False)
    cfg["data"]["media_roots"] = [str(root / "r1" / "imgs" / "in1.jpg")]
    with pytest.raises(ConfigError, match=r"data\.media_roots\[0\]: .* is a file, not a folder"):
        build_task_encoder(cfg)


def test_media_roots_enter_the_fingerprint(roots_corpus):
    from energon_nemotron.config import load_config

    root, _ = roots_corpus
    one, two = (fingerprint(load_config(roots_config(root, 0, roots=r)), "train", False) for r in (("r1",), ("r2",)))
    assert one["media_roots"] == [str((root / "r1").resolve())] and one != two
    assert "media_roots" not in fingerprint(load_config(roots_config(root, 0, roots=None)), "train", False)


def test_bad_aux_sources_are_named_at_start(tmp_path):
    """Aux sources Energon would fail on with a raw AssertionError (or read as if empty): a folder that
    is not a prepared dataset, a missing or garbage index.sqlite, a filesystem:// folder that does not
    exist, an msc:// source whose profile the multi-storage-client does not know: one ConfigError at
    start naming each."""
    import shutil

    from energon_data import text_config, text_dataset

    ds, _ = text_dataset(tmp_path / "ds", "nemotron_conversation", n=4)
    plain = tmp_path / "plain"
    plain.mkdir()
    noindex = tmp_path / "noindex"
    shutil.copytree(ds, noindex)
    (noindex / ".nv-meta" / "index.sqlite").unlink()
    garbage = tmp_path / "garbage"
    shutil.copytree(ds, garbage)
    (garbage / ".nv-meta" / "index.sqlite").write_bytes(b"not a database" * 10)
    mds = tmp_path / "mix.yaml"
    mds.write_text(yaml.safe_dump({"__module__": "megatron.energon", "__class__": "MetadatasetV2", "splits": {
        "train": {"path": "ds", "aux": {"a": "plain", "b": "noindex", "c": "garbage", "d": "filesystem://nowhere",
                                        "e": "filesystem://plain", "f": "msc://bucket/x"}}}}))
    with pytest.raises(ConfigError) as err:
        build_train_loader(text_config(mds, workers=0), repeat=False)
    text = str(err.value)
    assert "aux source 'a' ('plain'): " in text and "not a prepared dataset (no .nv-meta/index.sqlite)" in text
    assert "aux source 'b' ('noindex'): " in text and "aux source 'c' ('garbage'): " in text
    assert "is not an SQLite index (damaged)" in text and "aux source 'd' ('filesystem://nowhere'): the folder" in text
    assert "'e'" not in text
    assert "aux source 'f' ('msc://bucket/x'): msc://bucket/x/.nv-meta/index.sqlite: the object store cannot be " \
        "read" in text and 'Profile "bucket" not found' in text
    assert "check the profile 'bucket'" in text


def test_an_oversized_aux_entry_is_refused_before_it_is_read(aux_corpus, tmp_path):
    """``max_media_bytes`` applies to an aux entry from the source's own size (index or file
    system) before its bytes are read (a 1 GiB entry used to be read whole first)."""
    from energon_nemotron.errors import MediaError
    from energon_nemotron.media.handlers import read_payload

    store = CountingStore(EPath(aux_corpus / "media"))
    with media_scope(aux={"media": store}):
        ref = COOKERS.get("general_conversations")(jsonl_sample(chat("pics/a.jpg"), tmp_path), media=store).media[0]
    size = (aux_corpus / "media" / "pics" / "a.jpg").stat().st_size
    CountingStore.reads = 0
    with pytest.raises(MediaError, match=rf"{size} bytes, over max_media_bytes {size - 1}") as err:
        read_payload(ref, max_bytes=size - 1)
    assert err.value.code == "media_too_large" and CountingStore.reads == 0
    assert len(read_payload(ref, max_bytes=size)) == size and CountingStore.reads == 1


def test_cooker_metadata_is_checked_field_by_field(aux_corpus):
    """Media metadata a cooker hands over (a fragment's ``metadata``): a video without
    ``num_frames`` is planned from ``duration * fps`` (it was refused); a field that is not a
    positive number is a MediaError naming it (it was counted ``other``)."""
    from energon_nemotron.errors import MediaError
    from energon_nemotron.types import MediaRef

    media = build_task_encoder(config({"train": {"path": str(aux_corpus / "mix.yaml")}}, 0)).media
    video = {"width": 320, "height": 240, "duration": 2.5, "fps": 8.0}
    planned = media.plan(MediaRef("video", b"never read", video, name="v.mp4"), 0)
    assert planned.plan.num_source_frames == 20 and planned.num_tokens > 0
    for bad, field in (({**video, "width": "abc"}, "width"), ({**video, "fps": float("nan")}, "fps"),
                       ({**video, "num_frames": 0}, "num_frames")):
        with pytest.raises(MediaError, match=rf"video metadata {field}: .* is not a positive") as err:
            media.plan(MediaRef("video", b"", bad, name="v.mp4"), 0)
        assert err.value.code == "invalid_sample"
    with pytest.raises(MediaError, match=r"image metadata width: 'abc' is not a positive whole number"):
        media.plan(MediaRef("image", b"", {"width": "abc", "height": 4}, name="i.png"), 0)
