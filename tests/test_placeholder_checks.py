"""Media placeholder tokens are checked at start for the modalities the configuration can produce:
``task_encoder.options.modalities`` (encoder construction) and each dataset's cooker ``requires``
(dataset build), before any worker starts; a sample of a kind not listed is ``unsupported_media``.
Without declarations a tokenizer lacking the audio tokens still serves image-only data.

Tokenizers are real byte-level BPEs trained here; the placeholder tokens are added the way the
error message tells users to (``add_special_tokens`` then ``save_pretrained``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from bad_inputs import conv
from energon_data import tar_keys
from energon_nemotron.demo.build_tokenizer import CHAT_TEMPLATE
from energon_nemotron.demo.conversations import make_conversations
from energon_nemotron.demo.datasets import asr_dataset, prepare, write_shards
from energon_nemotron.demo.media import make_image, make_video
from energon_nemotron.errors import ConfigError
from energon_nemotron.loading import build_task_encoder, build_train_loader, build_val_loader

IMAGE_TOKENS = ["<img>", "</img>", "<image>"]
AUDIO_TOKENS = ["<so_start>", "<so_embedding>", "<so_end>"]
TEXT_SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
WORKERS = 2


def train_tokenizer(folder: Path, added: list[str]) -> Path:
    """A BPE trained on demo conversations, with ``added`` placeholder tokens added afterwards as
    special tokens; saved with ``save_pretrained`` (prompt format ``tokenizer``: its chat template)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=800, special_tokens=TEXT_SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    texts = ["".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in c)
             for c in make_conversations(300, seed=5)]
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(folder))
    if added:
        fast = AutoTokenizer.from_pretrained(str(folder))
        fast.add_special_tokens({"additional_special_tokens": added})
        fast.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def toks(tmp_path_factory) -> dict[str, Path]:
    """``text``: no placeholder tokens; ``image``: the image tokens only; ``omni``: image and audio."""
    root = tmp_path_factory.mktemp("toks")
    return {"text": train_tokenizer(root / "text", []), "image": train_tokenizer(root / "image", IMAGE_TOKENS),
            "omni": train_tokenizer(root / "omni", IMAGE_TOKENS + AUDIO_TOKENS)}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    """``images``: 6 image samples; ``mixed``: 6 image samples and 3 video samples; ``asr``: a
    ``granary_asr`` dataset; ``blend``: a metadataset of ``images`` and ``asr``."""
    root = tmp_path_factory.mktemp("data")
    images = [(f"img-{i}", {"json": conv(f"<image> what is {i}?"), "jpg": make_image(64, 48, seed=i)})
              for i in range(6)]
    videos = [(f"vid-{i}", {"json": conv(f"<video> what happens in {i}?"),
                            "mp4": make_video(64, 48, seconds=1.0, fps=4, seed=i)}) for i in range(3)]
    write_shards(root / "images", images, 3)
    write_shards(root / "mixed", images + videos, 3)
    out = {name: prepare(root / name, {"cooker": "general_conversations"}) for name in ("images", "mixed")}
    out["asr"], _ = asr_dataset(root / "asr", 4, per_shard=2)
    blend = {"__module__": "megatron.energon", "__class__": "MetadatasetV2",
             "splits": {"train": {"blend_epochized": [{"path": "images"}, {"path": "asr"}]}}}
    (root / "blend.yaml").write_text(yaml.safe_dump(blend))
    out["blend"] = root / "blend.yaml"
    return out


def config(path: Path, tokenizer: Path, on_error: str = "raise", validation: bool = False, **options) -> dict:
    source = {"path": str(path)}
    return {"tokenizer": str(tokenizer),
            "task_encoder": {"name": "nemotron_multimodal",
                             "options": {"prompt_format": "tokenizer", "seq_length": 1024,
                                         "image": {"min_patches": 16, "max_patches": 64},
                                         "video": {"target_patches": 16, "min_frames": 2, "max_frames": 2},
                                         **options}},
            "packing": {"algorithm": "first_fit_shuffle", "buffer_size": 4},
            "data": {"train": source, "validation": source if validation else None},
            "loader": {"batch_size": 1, "num_workers": WORKERS, "shuffle_buffer_size": None, "seed": 3,
                       "on_error": on_error}}


def keys_of(loader) -> list[str]:
    return sorted(k for batch in loader for row in batch.sample_keys for k in row)


# -- tokenizers built here -----------------------------------------------------------------------------

def test_the_trained_tokenizers_have_exactly_the_added_placeholders(toks):
    from transformers import AutoTokenizer

    for name, expected in (("text", []), ("image", IMAGE_TOKENS), ("omni", IMAGE_TOKENS + AUDIO_TOKENS)):
        vocab = AutoTokenizer.from_pretrained(str(toks[name])).get_vocab()
        assert [t for t in IMAGE_TOKENS + AUDIO_TOKENS if t in vocab] == expected, name


# -- task_encoder.options.modalities --------------------------------------------------------------------

def test_modalities_audio_without_audio_tokens_fails_at_loader_build(toks, data):
    cfg = config(data["images"], toks["image"], modalities=["image", "audio"])
    with pytest.raises(ConfigError) as info:
        build_train_loader(cfg, repeat=False)          # building only: no worker has started
    message = str(info.value)
    assert message.startswith(f"tokenizer {toks['image']}: no single token for <so_start>, <so_embedding>, "
                              "<so_end>, which audio placeholders need, and task_encoder.options.modalities "
                              "lists audio; add them as special tokens (tokenizer.add_special_tokens("
                              "{'additional_special_tokens': ['<so_start>', '<so_embedding>', '<so_end>']}), "
                              "then tokenizer.save_pretrained(FOLDER))"), message
    assert message.endswith("or use a Nemotron Omni tokenizer")


def test_modalities_image_without_image_tokens_fails_at_encoder_construction(toks, data):
    with pytest.raises(ConfigError, match=r"no single token for <img>, <image>, </img>, which image placeholders "
                                          r"need, and task_encoder\.options\.modalities lists image"):
        build_task_encoder(config(data["images"], toks["text"], modalities=["image"]))
    # text-only data declares no modality: a tokenizer without any placeholder token is fine
    assert build_task_encoder(config(data["images"], toks["text"], modalities=[])).options.modalities == []


def test_modalities_rejects_an_unknown_kind(toks, data):
    with pytest.raises(ConfigError, match=r"task_encoder\.options.*modalities"):
        build_task_encoder(config(data["images"], toks["omni"], modalities=["image", "pointcloud"]))


def test_a_video_sample_is_unsupported_media_when_modalities_lists_image_only(toks, data):
    loader = build_train_loader(config(data["mixed"], toks["image"], on_error="skip", modalities=["image"]),
                                repeat=False)
    assert tar_keys(keys_of(loader)) == [f"img-{i}" for i in range(6)]
    assert loader.skipped() == {"unsupported_media": 3}


def test_unsupported_media_names_the_sample_and_the_kind(toks, data):
    loader = build_train_loader(config(data["mixed"], toks["omni"], modalities=["image", "audio"]), repeat=False)
    with pytest.raises(Exception, match=r"vid-\d: has video, which task_encoder\.options\.modalities "
                                        r"\(image, audio\) does not list"):
        list(loader)


# -- cookers whose every sample holds a modality ---------------------------------------------------------

@pytest.mark.parametrize("which", ["asr", "blend"])
def test_a_granary_asr_dataset_needs_the_audio_tokens_at_loader_build(toks, data, which):
    with pytest.raises(ConfigError) as info:
        build_train_loader(config(data[which], toks["image"]), repeat=False)
    message = str(info.value)
    assert message.startswith(f"tokenizer {toks['image']}: no single token for <so_start>, <so_embedding>, "
                              f"<so_end>, which audio placeholders need, and dataset {data['asr']} "
                              "(cooker granary_asr) has audio in every sample; add them as special tokens"), message
    assert "images" not in message.split("(cooker")[0].split("dataset")[-1]


def test_the_validation_loader_checks_the_cookers_too(toks, data):
    loader = build_val_loader(config(data["asr"], toks["image"], validation=True))    # built when iterated
    with pytest.raises(ConfigError, match=r"dataset .*asr \(cooker granary_asr\) has audio in every sample"):
        iter(loader).__next__()


def test_a_granary_asr_dataset_outside_the_listed_modalities(toks, data):
    with pytest.raises(ConfigError, match=r"^dataset .*asr \(cooker granary_asr\): every sample holds audio, which "
                                          r"task_encoder\.options\.modalities \(image\) does not list; add audio"):
        build_train_loader(config(data["blend"], toks["omni"], modalities=["image"]), repeat=False)


def test_a_granary_asr_dataset_with_the_audio_tokens_reads(toks, data):
    loader = build_train_loader(config(data["asr"], toks["omni"], modalities=["audio"]), repeat=False)
    assert len(keys_of(loader)) == 4 and loader.skipped() == {}


# -- no declarations: the first item is the last line of defence ------------------------------------------

def test_a_tokenizer_without_audio_tokens_serves_image_only_data(toks, data):
    for options in ({}, {"modalities": ["image"]}):
        loader = build_train_loader(config(data["images"], toks["image"], **options), repeat=False)
        batches = list(loader)
        assert sorted(tar_keys(k for b in batches for row in b.sample_keys for k in row)) == [f"img-{i}" for i in range(6)]
        assert loader.skipped() == {} and all(b.media for b in batches)


def test_without_declarations_the_first_audio_item_still_stops_the_run(toks, tmp_path):
    """A general_conversations dataset may hold audio: nothing is known at start, the first audio
    item raises (``MediaHandlers.ids``)."""
    from energon_nemotron.demo.media import make_audio

    samples = [("aud-0", {"json": conv("<audio> what is said?"), "wav": make_audio(1.0, 16000, 1, seed=1)})]
    prepare(write_shards(tmp_path / "aud", samples, 1), {"cooker": "general_conversations"})
    cfg = config(tmp_path / "aud", toks["image"], on_error="skip")
    cfg["loader"]["num_workers"] = 0
    loader = build_train_loader(cfg, repeat=False)
    with pytest.raises(ConfigError, match=r"which audio placeholders need, and the data has audio"):
        list(loader)
    assert loader.skipped() == {}


def test_the_cookers_declare_their_modalities():
    from energon_nemotron.cookers import cooker_info
    from energon_nemotron.types import MODALITIES

    asr = cooker_info("granary_asr")
    assert asr.modalities == ("audio",) and asr.requires == ("audio",)
    general = cooker_info("general_conversations")
    assert general.modalities == MODALITIES and general.requires == ()


def test_register_checks_its_declarations():
    from energon_nemotron.cookers import register

    with pytest.raises(ConfigError, match=r"cooker 'x': unknown modality 'sound'"):
        register("x", modalities=("sound",))
    with pytest.raises(ConfigError, match=r"cooker 'x': requires \['audio'\] must be among its modalities \['image'\]"):
        register("x", modalities=("image",), requires=("audio",))


def test_options_round_trip_through_yaml(toks, data, tmp_path):
    path = tmp_path / "loader.yaml"
    path.write_text(yaml.safe_dump(config(data["images"], toks["image"], modalities=["image", "video"])))
    encoder = build_task_encoder(path)
    assert encoder.options.modalities == ["image", "video"]
    assert json.loads(encoder.options.model_dump_json())["modalities"] == ["image", "video"]
