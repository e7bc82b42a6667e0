"""Configuration faults are a ``ConfigError`` at start (before any worker reads a sample), naming
the field or file and the fix: a damaged tokenizer folder, wrongly typed media options, a missing
or absent ``data.train.path``, a tokenizer without the media placeholder tokens (raised by the
first item of that modality, never counted as a skip), and tampered loader states. ``preview``
prints each in one line and exits 2."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import yaml

from bad_inputs import conv
from conftest import DEMO_TOKENIZER
from energon_nemotron.cli import main
from energon_nemotron.config import load_config
from energon_nemotron.demo.datasets import multimodal_dataset, prepare, write_shards
from energon_nemotron.demo.media import make_image
from energon_nemotron.errors import ConfigError
from energon_nemotron.guards import ErrorPolicy, skip_counter as skip_counter
from energon_nemotron.loading import build_task_encoder, build_train_loader, build_val_loader
from energon_nemotron.resume import load_state_file, save_state_file

DAMAGED = "the state is damaged or belongs to another configuration"
AUDIO_TOKENS = ["<so_start>", "<so_embedding>", "<so_end>"]


def options(**media) -> dict:
    return {"prompt_format": "nemotron6", "seq_length": 2048,
            "image": {"min_patches": 64, "max_patches": 256},
            "video": {"target_patches": 64, "min_frames": 2, "max_frames": 4}, **media}


def config(path, workers: int = 0, tokenizer=DEMO_TOKENIZER, on_error: str = "raise", **opts) -> dict:
    return {"tokenizer": str(tokenizer),
            "task_encoder": {"name": "nemotron_multimodal", "options": options(**opts)},
            "packing": {"algorithm": "first_fit_shuffle", "buffer_size": 4},
            "data": {"train": {"path": str(path)}},
            "loader": {"batch_size": 1, "num_workers": workers, "shuffle_buffer_size": 8, "seed": 11,
                       "on_error": on_error}}


def without_tokens(folder: Path, tokens: list[str]) -> Path:
    """A copy of the demo tokenizer whose ``tokens`` are renamed to unused special tokens (the ids
    stay; the strings are gone from the vocabulary)."""
    shutil.copytree(DEMO_TOKENIZER, folder)
    data = json.loads((folder / "tokenizer.json").read_text())
    for i, token in enumerate(tokens):
        new = f"<SPECIAL_9{i:02d}>"
        for added in data["added_tokens"]:
            if added["content"] == token:
                added["content"] = new
        data["model"]["vocab"][new] = data["model"]["vocab"].pop(token)
    (folder / "tokenizer.json").write_text(json.dumps(data))
    return folder


def preview(capfd, *args) -> tuple[int, str]:
    """``energon-nemotron preview`` in this process: exit status and stderr (fd level, workers included)."""
    capfd.readouterr()
    rc = main(["preview", *map(str, args), "--json"])
    return rc, capfd.readouterr().err


def assert_one_line_error(err: str, *parts: str) -> None:
    assert "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, err[-3000:]
    assert all(p in lines[0] for p in parts), lines[0]
    assert err.rstrip().endswith(lines[0]), err[-3000:]      # nothing after it


@pytest.fixture(scope="module")
def mm(tmp_path_factory) -> Path:
    """Text, image, video and audio samples (the demo's multimodal cycle)."""
    root = tmp_path_factory.mktemp("mm")
    multimodal_dataset(root / "mm", n=10, per_shard=5)
    return root / "mm"


@pytest.fixture(scope="module")
def images_only(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("img")
    write_shards(root / "img", [(f"img-{i}", {"json": conv(f"<image> what is {i}?"), "jpg": make_image(64, 48, seed=i)})
                                for i in range(4)], 4)
    return prepare(root / "img", {"cooker": "general_conversations"})


# -- (a) tokenizer folders ---------------------------------------------------------------------------

def _drop_json(folder: Path) -> None:
    (folder / "tokenizer.json").unlink()


def _truncate_json(folder: Path) -> None:
    data = (folder / "tokenizer.json").read_bytes()
    (folder / "tokenizer.json").write_bytes(data[: len(data) // 2])


def _foreign_json(folder: Path) -> None:
    (folder / "tokenizer.json").write_text('{"hello": 1}')


def _truncate_config(folder: Path) -> None:
    (folder / "tokenizer_config.json").write_text('{"backend": "tokeni')


def _drop_config(folder: Path) -> None:
    (folder / "tokenizer_config.json").unlink()


@pytest.mark.parametrize("damage, message", [
    (_drop_json, r"the folder has no tokenizer\.json"),
    (_truncate_json, r"tokenizer\.json is not valid JSON \(JSONDecodeError: .*\): the file is truncated or damaged"),
    (_foreign_json, r"tokenizer\.json is not a tokenizers file"),
    (_truncate_config, r"tokenizer_config\.json is not valid JSON"),
    (_drop_config, r"the folder has no tokenizer_config\.json: transformers then loads tokenizer\.json without the "
                   r"special tokens it names \(no pad, eos or unk token"),
])
@pytest.mark.parametrize("path", ["energon", "megatron"])
def test_a_damaged_tokenizer_folder_is_named_with_the_file_and_the_fix(tmp_path, damage, message, path):
    folder = tmp_path / "tok"
    shutil.copytree(DEMO_TOKENIZER, folder)
    damage(folder)
    expected = rf"^tokenizer {folder}: {message}.*Hugging Face fast tokenizer.*save_pretrained"
    with pytest.raises(ConfigError, match=expected):
        if path == "energon":
            build_task_encoder(config(tmp_path, tokenizer=folder))
        else:
            from energon_nemotron.megatron_packed import MegatronSFTPackedEncoder

            MegatronSFTPackedEncoder(folder, 512, "nemotron-h-aligned")


def test_an_empty_or_absent_tokenizer_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=rf"^tokenizer {tmp_path / 'empty'}: the folder has no tokenizer\.json"):
        build_task_encoder(config(tmp_path, tokenizer=tmp_path / "empty"))
    with pytest.raises(ConfigError, match=r"^tokenizer directory '.*absent' does not exist; the folder must hold"):
        build_task_encoder(config(tmp_path, tokenizer=tmp_path / "absent"))


def test_prompt_format_tokenizer_without_a_chat_template_names_the_folder(tmp_path):
    folder = tmp_path / "tok"
    shutil.copytree(DEMO_TOKENIZER, folder)
    (folder / "chat_template.jinja").unlink()
    with pytest.raises(ConfigError, match=rf"tokenizer {folder} has none .*add chat_template\.jinja to its folder, "
                                          r"or set task_encoder\.options\.prompt_format to a named format \(nemotron"):
        build_task_encoder(config(tmp_path, tokenizer=folder, prompt_format="tokenizer"))


# -- (b) media options ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kind, values, message", [
    ("video", {"fps": "2"}, r"video\.fps: expected a number or null, got '2' \(a string\)"),
    ("video", {"fps": [2]}, r"video\.fps: expected a number or null, got \[2\] \(a list\)"),
    ("video", {"fps": float("nan")}, r"video\.fps: expected a finite number, got nan"),
    ("video", {"max_frames": -3}, r"video\.max_frames: must be > 0, got -3"),
    ("video", {"num_frames": 2.5}, r"video\.num_frames: expected an integer or null, got 2\.5 \(a number\)"),
    ("video", {"num_frames": "4"}, r"video\.num_frames: expected an integer or null, got '4' \(a string\)"),
    ("video", {"sampling": "even"},
     r"video\.sampling: expected one of 'hf', 'bridge', 'midpoints', 'nemo_rl', got 'even' \(a string\)"),
    ("image", {"max_patches": "x"}, r"image\.max_patches: expected an integer, got 'x' \(a string\)"),
    ("image", {"patch_size": True}, r"image\.patch_size: expected an integer, got True \(a boolean\)"),
    ("image", {"use_thumbnail": "yes"}, r"image\.use_thumbnail: expected true or false, got 'yes' \(a string\)"),
    ("image", {"min_patches": 0}, r"image\.min_patches: must be > 0, got 0"),
    ("audio", {"sample_rate": "16000"}, r"audio\.sample_rate: expected an integer, got '16000' \(a string\)"),
    ("audio", {"clip_seconds": {"a": 1}}, r"audio\.clip_seconds: expected a number, got \{'a': 1\} \(a mapping\)"),
    ("audio", {"tolerance_seconds": -0.1}, r"audio\.tolerance_seconds: must be >= 0, got -0\.1"),
    ("audio", {"clip_seconds": 0}, r"audio\.clip_seconds: must be > 0, got 0"),
    ("video", {"fpss": 2}, r"video: unknown key\(s\) 'fpss'; valid keys: fps, min_frames, .*, backend, augment_frames_up, augment_resolution_up, augment_resolution_only, temporal_jitter"),
    ("video", {"min_frames": 8, "max_frames": 4}, r"video: need 1 <= min_frames <= max_frames, got 8, 4"),
])
def test_b_wrongly_typed_media_options_name_the_field(tmp_path, kind, values, message):
    opts = options()
    opts[kind] = {**opts.get(kind, {}), **values}
    with pytest.raises(ConfigError, match=rf"^task_encoder\.options\.{message}$"):
        build_task_encoder(config(tmp_path, **{kind: opts[kind]}))


def test_b_values_are_checked_not_coerced_and_an_int_is_a_float(tmp_path):
    with pytest.raises(ConfigError, match=r"^task_encoder\.options\.video\.fps: expected a number or null, got '2'"):
        build_task_encoder(config(tmp_path, video={"fps": "2", "min_frames": 2, "max_frames": 4}))
    encoder = build_task_encoder(config(tmp_path, video={"fps": 2, "min_frames": 2, "max_frames": 4},
                                        audio={"tolerance_seconds": 0, "subsampling_layers": 0, "clip_seconds": 10}))
    assert encoder.media.video_options.fps == 2 and encoder.media.audio_options.tolerance_seconds == 0


# -- (c) data.train ------------------------------------------------------------------------------------

@pytest.mark.parametrize("train, message", [
    ({}, r"data\.train\.path: missing; set it to the dataset to read \(Energon: a folder prepared with "
         r"`energon prepare`"),
    ({"split": "train"}, r"data\.train\.path: missing; set it to the dataset"),
    ({"path": None}, r"data\.train\.path: expected the dataset to read .*; got null"),
    (None, r"data\.train: expected a data source: \{path: DATASET\} .*; got null"),
    ("ds", r"data\.train: expected a data source: .*; got 'ds' \(a string\)"),
    ({"format": "megatron_sft_packed", "seq_length": 64}, r"data\.train\.path: missing; set it to the dataset"),
    ({"format": "megatron_sft_packed", "path": "x.jsonl.packed"},
     r"data\.train\.seq_length: missing; set it to the row length L"),
])
def test_c_a_missing_train_path_names_data_train_path(train, message):
    cfg = config("unused")
    cfg["data"]["train"] = train
    if isinstance(train, dict) and train.get("format"):
        cfg["packing"] = None
    with pytest.raises(ConfigError, match=rf"^config: {message}"):
        load_config(cfg)


def test_c_a_missing_data_section():
    cfg = config("unused")
    del cfg["data"]
    with pytest.raises(ConfigError, match=r"^config: data: missing; set it to a mapping with at least train"):
        load_config(cfg)


def test_c_a_path_that_is_not_there_is_named_at_build_time(tmp_path):
    with pytest.raises(ConfigError, match=rf"^data\.train\.path: '{tmp_path / 'nope'}' does not exist; .*"
                                          r"a folder prepared with `energon prepare FOLDER`"):
        build_train_loader(config(tmp_path / "nope"))
    (tmp_path / "raw").mkdir()
    with pytest.raises(ConfigError, match=r"^data\.train\.path: '.*raw' is not a prepared Energon dataset \(it has "
                                          r"no \.nv-meta folder\); prepare it with "
                                          rf"`energon prepare {tmp_path / 'raw'}`"):
        build_train_loader(config(tmp_path / "raw"))
    rows = {"format": "megatron_sft_packed", "path": str(tmp_path / "rows.jsonl.packed"), "seq_length": 64}
    cfg = {"tokenizer": str(DEMO_TOKENIZER), "data": {"train": rows, "validation": rows}}
    with pytest.raises(ConfigError, match=r"^data\.train\.path: '.*rows\.jsonl\.packed' does not exist; a "
                                          r"megatron_sft_packed source is a \.jsonl\.packed file"):
        build_train_loader(cfg)
    with pytest.raises(ConfigError, match=r"^data\.validation\.path: '.*rows\.jsonl\.packed' does not exist"):
        build_val_loader(cfg)


# -- (d) placeholder tokens ----------------------------------------------------------------------------

def test_d_placeholder_tokens_are_resolved_when_the_encoder_is_built(tmp_path):
    tok = without_tokens(tmp_path / "tok", AUDIO_TOKENS)
    encoder = build_task_encoder(config(tmp_path, tokenizer=tok))
    assert encoder.media.missing_tokens == {"audio": AUDIO_TOKENS}
    assert set(encoder.media.ids("image")) >= {"<img>", "<image>", "</img>"}
    with pytest.raises(ConfigError, match=r"no single token for <so_start>, <so_embedding>, <so_end>, which audio"):
        encoder.media.ids("audio")


@pytest.mark.parametrize("workers, on_error", [(0, "raise"), (0, "skip"), (2, "skip")])
def test_d_missing_audio_tokens_stop_the_run_at_the_first_audio_item(tmp_path, mm, workers, on_error):
    tok = without_tokens(tmp_path / "tok", AUDIO_TOKENS)
    loader = build_train_loader(config(mm, workers, tokenizer=tok, on_error=on_error), repeat=False)
    with pytest.raises(ConfigError) as info:
        list(loader)
    message = str(info.value)
    assert message.startswith(f"tokenizer {tok}: no single token for <so_start>, <so_embedding>, <so_end>, which "
                              "audio placeholders need, and the data has audio; add them as special tokens "
                              "(tokenizer.add_special_tokens("), message[:2000]
    assert message.endswith("or use a Nemotron Omni tokenizer") and "Traceback" not in message
    assert loader.skipped() == {}                       # not counted as a skip


def test_d_image_data_needs_only_the_image_tokens(tmp_path, images_only):
    tok = without_tokens(tmp_path / "tok", AUDIO_TOKENS)
    loader = build_train_loader(config(images_only, tokenizer=tok), repeat=False)
    batches = list(loader)
    assert sum(len(keys) for b in batches for keys in b.sample_keys) == 4 and loader.skipped() == {}
    assert all(b.media for b in batches)


def test_d_config_errors_are_never_skips():
    counts = skip_counter()
    with pytest.raises(ConfigError, match="^bad option$"):
        ErrorPolicy("skip", counts)(ConfigError("bad option"), {"__key__": "k"})
    with pytest.raises(ConfigError, match="^bad option$"):
        ErrorPolicy("raise", counts)(ConfigError("bad option"), {"__key__": "k"})
    assert counts.totals() == {}


def test_d_preview_prints_the_missing_tokens_in_one_line(tmp_path, mm, capfd):
    tok = without_tokens(tmp_path / "tok", AUDIO_TOKENS)
    path = tmp_path / "l.yaml"
    path.write_text(yaml.safe_dump(config(mm, 2, tokenizer=tok, on_error="skip")))
    rc, err = preview(capfd, path)
    assert rc == 2
    assert_one_line_error(err, f"error: tokenizer {tok}: no single token for <so_start>", "Nemotron Omni tokenizer")


# -- (e) tampered states ---------------------------------------------------------------------------------

def _nodes(node, key):
    """Every dict of the tree holding ``key``."""
    if isinstance(node, dict):
        if key in node:
            yield node
        for v in node.values():
            yield from _nodes(v, key)
    elif isinstance(node, list):
        for v in node:
            yield from _nodes(v, key)


def _class_pairs(node):
    """Every ``["__class__", NAME]`` item of an encoded FlexState."""
    if isinstance(node, list):
        if len(node) == 2 and node[0] == "__class__":
            yield node
        for v in node:
            yield from _class_pairs(v)
    elif isinstance(node, dict):
        for v in node.values():
            yield from _class_pairs(v)


def _set(key, value):
    def tamper(state):
        next(_nodes(state, key))[key] = value
    return tamper


def _garble_bytes(state):
    node = next(_nodes(state, "__bytes__"))
    node["__bytes__"] = node["__bytes__"][:-3]


def _rename_dataset(state):
    pair = [p for p in _class_pairs(state) if p[1] == "WebdatasetSampleLoaderDataset"][0]
    pair[1] = "SomethingElse"


def _extra_worker(state):
    node = next(_nodes(state, "worker_states"))
    node["worker_states"] = node["worker_states"] + node["worker_states"][-1:]


TAMPERED = {
    "no position": (lambda s: s.pop("position"), r"no 'position' key"),
    "no fingerprint": (lambda s: s.pop("fingerprint"), r"no 'fingerprint' key"),
    "fingerprint a list": (lambda s: s.update(fingerprint=[1, 2]),
                           r"fingerprint is \[1, 2\] \(a list\), not a mapping"),
    "position a list": (lambda s: s.update(position=[1]), r"position is \[1\] \(a list\), not a mapping"),
    "rows position": (lambda s: s.update(position={"workers": {"0": 3}, "next_worker": 0}),
                      r"position has no 'energon' key \(it is the position of a Megatron-LM rows loader\)"),
    "energon a string": (lambda s: s["position"].update(energon="abc"),
                         r"position\.energon is 'abc' \(a string\), not an Energon loader state"),
    "garbled base64": (_garble_bytes, r"position\.energon\..*: invalid base64"),
    "foreign class": (_set("__dataclass__", "subprocess.Popen"),
                      r"position\.energon: class subprocess\.Popen is not allowed in a loader state"),
    "unknown class": (_set("__dataclass__", "megatron.energon.nope.Nope"),
                      r"position\.energon: no class megatron\.energon\.nope\.Nope"),
    "wrong type": (_set("micro_batch_size", "one"), r"position\.energon: Energon cannot restore it \("),
    "worker_states a dict": (_set("worker_states", {"__dict__": 7}), r"position\.energon\.worker_states: malformed"),
    "extra worker": (_extra_worker, r"position\.energon holds the states of \d worker stream\(s\); this loader has"),
    "renamed dataset": (_rename_dataset, r"position\.energon\..*datasets\[0\] is the state of SomethingElse, "
                                         r"and the loader has a "
                                         r"WebdatasetSampleLoaderDataset there"),
}


@pytest.fixture(scope="module")
def saved_states(mm, tmp_path_factory) -> dict:
    """Real states of a real loader after two batches, with 0 and 2 workers."""
    root = tmp_path_factory.mktemp("states")
    out = {}
    for workers in (0, 2):
        loader = build_train_loader(config(mm, workers))
        it = iter(loader)
        next(it), next(it)
        save_state_file(root / f"w{workers}.json", loader.state_dict())
        out[workers] = root / f"w{workers}.json"
    return out


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("case", list(TAMPERED))
def test_e_a_tampered_state_is_a_config_error_naming_the_key(mm, saved_states, workers, case):
    tamper, message = TAMPERED[case]
    state = load_state_file(saved_states[workers])
    tamper(state)
    loader = build_train_loader(config(mm, workers))
    with pytest.raises(ConfigError, match=rf"^the loader state: {message}.*{DAMAGED}"):
        loader.load_state_dict(state)
        next(iter(loader))


@pytest.mark.parametrize("workers", [0, 2])
def test_e_a_state_of_another_worker_count_with_a_forged_fingerprint(mm, saved_states, workers):
    state = load_state_file(saved_states[2 - workers])
    loader = build_train_loader(config(mm, workers))
    state["fingerprint"] = copy.deepcopy(loader.fingerprint)
    with pytest.raises(ConfigError, match=rf"position\.energon holds the states of {max(2 - workers, 1)} worker "
                                          rf"stream\(s\); this loader has {max(workers, 1)} \(loader\.num_workers "
                                          rf"{workers}\); {DAMAGED}"):
        loader.load_state_dict(state)


def test_e_a_truncated_array_names_its_entry(mm, saved_states):
    state = load_state_file(saved_states[2])
    array = next(_nodes(state, "__ndarray__"))["__ndarray__"]
    array["data"] = array["data"][:8]
    with pytest.raises(ConfigError, match=r"^the loader state: position\.energon\.worker_states\[0\]\.state\..*: "
                                          rf"damaged array \(dtype '<u4', shape \[624\], 6 bytes\).*{DAMAGED}"):
        build_train_loader(config(mm, 2)).load_state_dict(state)


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> dict:
    """A Megatron-LM rows loader's config and a real state after one batch."""
    from energon_nemotron.demo.conversations import make_conversations
    from energon_nemotron.megatron_packed import MegatronSFTPackedEncoder
    from energon_nemotron.megatron_packed.offline_pack import pack_file

    root = tmp_path_factory.mktemp("rows")
    (root / "raw.jsonl").write_text("".join(json.dumps({"messages": c}) + "\n" for c in make_conversations(40, seed=4)))
    encoder = MegatronSFTPackedEncoder(DEMO_TOKENIZER, 512, "nemotron-h-aligned")
    pack_file(root / "raw.jsonl", root / "rows.jsonl.packed", encoder, progress=False)
    cfg = {"tokenizer": str(DEMO_TOKENIZER),
           "data": {"train": {"format": "megatron_sft_packed", "path": str(root / "rows.jsonl.packed"),
                              "seq_length": 512, "prompt_format": "nemotron-h-aligned"}},
           "loader": {"batch_size": 1, "num_workers": 2}}
    loader = build_train_loader(cfg)
    next(iter(loader))
    return {"config": cfg, "state": json.loads(json.dumps(loader.state_dict()))}


@pytest.mark.parametrize("position, message", [
    ({"energon": None}, r"position has no 'workers' key \(it is the position of an Energon loader\)"),
    ({"workers": [1]}, r"position\.workers is \[1\] \(a list\), not a mapping"),
    ({"workers": {"5": 1}}, r"position\.workers has worker '5'; this loader has 2 worker stream\(s\)"),
    ({"workers": {"0": "x"}}, r"position\.workers\.0 is 'x' \(a string\), not a row count"),
    ({"workers": {"0": 1}, "next_worker": 7}, r"position\.next_worker is 7 \(an integer\), not a worker below 2"),
])
def test_e_a_tampered_rows_position(rows, position, message):
    state = copy.deepcopy(rows["state"])
    state["position"] = position
    with pytest.raises(ConfigError, match=rf"^the loader state: {message}.*{DAMAGED}"):
        build_train_loader(rows["config"]).load_state_dict(state)


def test_e_an_energon_state_for_a_rows_loader_with_a_forged_fingerprint(rows, saved_states):
    state = load_state_file(saved_states[2])
    state["fingerprint"] = copy.deepcopy(rows["state"]["fingerprint"])
    with pytest.raises(ConfigError, match=r"^the loader state: position has no 'workers' key \(it is the position of "
                                          rf"an Energon loader\); {DAMAGED}"):
        build_train_loader(rows["config"]).load_state_dict(state)


def test_e_preview_names_the_state_file_in_one_line(tmp_path, mm, saved_states, capfd):
    path = tmp_path / "l.yaml"
    path.write_text(yaml.safe_dump(config(mm, 2)))
    rc, err = preview(capfd, path, "--batches", "1", "--load-state", saved_states[2])
    assert rc == 0, err[-2000:]                              # the untampered state restores
    state = load_state_file(saved_states[2])
    _garble_bytes(state)
    save_state_file(tmp_path / "bad.json", state)
    rc, err = preview(capfd, path, "--batches", "1", "--load-state", tmp_path / "bad.json")
    assert rc == 2
    assert_one_line_error(err, f"error: loader state {tmp_path / 'bad.json'}: position.energon.", "invalid base64",
                          DAMAGED)
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00garbage")
    rc, err = preview(capfd, path, "--batches", "1", "--load-state", tmp_path / "binary.json")
    assert rc == 2
    assert_one_line_error(err, f"error: loader state {tmp_path / 'binary.json'}: not valid JSON",
                          "truncated or damaged")


# -- preview: one line, exit 2 ---------------------------------------------------------------------------

def test_preview_prints_config_errors_in_one_line(tmp_path, mm, capfd):
    bad_tok = tmp_path / "tok"
    shutil.copytree(DEMO_TOKENIZER, bad_tok)
    _truncate_json(bad_tok)
    cases = [
        (config(mm, video={"fps": "2"}),
         "error: task_encoder.options.video.fps: expected a number or null, got '2' (a string)"),
        (config(mm, tokenizer=bad_tok), f"error: tokenizer {bad_tok}: tokenizer.json is not valid JSON"),
        (config(tmp_path / "nope"), f"error: data.train.path: '{tmp_path / 'nope'}' does not exist"),
    ]
    for i, (cfg, expected) in enumerate(cases):
        path = tmp_path / f"l{i}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        rc, err = preview(capfd, path)
        assert rc == 2
        assert_one_line_error(err, expected)
