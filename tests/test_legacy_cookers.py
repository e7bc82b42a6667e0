"""The legacy audio-conversation cookers (``cookers.legacy_conversations``): NeMo-RL's
``nemotron_audio_conversation_jsonl`` and ``nemotron_omcat_legacy_conversation_monolithic``, called on
crude samples with real media and run through the real Energon loader."""

from __future__ import annotations

import json

import pytest

import energon_nemotron.cookers.legacy_conversations as legacy  # registers the two cookers
from energon_data import loader_yaml
from energon_nemotron.cookers.base import cooker_info
from energon_nemotron.demo.datasets import prepare, write_shards
from energon_nemotron.demo.media import make_audio, make_image, make_video
from energon_nemotron.errors import DataError
from energon_nemotron.loading import build_train_loader
from energon_nemotron.registry import COOKERS
from energon_nemotron.types import MediaPart
from test_cookers import jsonl_sample, wds_sample
from test_energon_media import PACKING, SMALL_MEDIA, check_batch

AUDIO = "nemotron_audio_conversation_jsonl"
OMCAT = "nemotron_omcat_legacy_conversation_monolithic"
PNG = make_image(48, 32, seed=1, fmt="PNG")
JPG = make_image(40, 40, seed=2)
WAV = make_audio(0.5, 16000, 1, seed=3, container="wav")
MP4 = make_video(64, 48, seconds=1.0, fps=4, seed=4)


def turns(*pairs):
    return [{"from": sender, "value": value} for sender, value in pairs]


def media_folder(tmp_path):
    """Real media files under ``tmp_path`` (the folder of a JSONL dataset)."""
    for name, data in (("imgs/a.png", PNG), ("imgs/b.jpg", JPG), ("clips/s.wav", WAV), ("clips/v.mp4", MP4),
                       ("clips/v.wav", WAV)):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    return tmp_path


def audio_cook(obj, folder, **kw):
    sample = jsonl_sample(obj, folder)
    sample.update(kw)
    return COOKERS.get(AUDIO)(sample)


def omcat_cook(obj, members, subflavors=None):
    sample = wds_sample(obj, members)
    sample["__subflavors__"] = subflavors
    return COOKERS.get(OMCAT)(sample)


def test_registered_with_their_declarations():
    for name, fn in ((AUDIO, legacy.cook_audio_conversation_jsonl),
                     (OMCAT, legacy.cook_omcat_legacy_conversation_monolithic)):
        info = cooker_info(name)
        assert COOKERS.get(name) is fn and fn.__stateless__
        assert info.modalities == ("image", "video", "audio") and info.requires == ()
        assert {"skip_chat_template", "train_only_on_last_assistant_turn"} <= set(info.subflavors)
        assert info.schema and "\n" not in info.schema


# -- nemotron_audio_conversation_jsonl ---------------------------------------------------------

def test_audio_conversation_tags_expand_to_their_fields(tmp_path):
    folder = media_folder(tmp_path)
    obj = {"conversations": turns(("human", "<image>\nCompare them.  <sound> "),
                                  ("gpt", "Two pictures, one tone."),
                                  ("human", "And this clip? <video-sound>"), ("gpt", "A moving pattern.")),
           "image": "imgs/a.png", "image_2": {"path": "imgs/b.jpg", "metadata": {"width": 40, "height": 40}},
           "sound": {"value": "clips/s.wav", "path": "imgs/a.png", "member": "nope"},
           "vis_sound": "clips/v.wav", "vis_video": {"member": "clips/v.mp4"}, "id": 7}
    conv = audio_cook(obj, folder)
    assert [m.role for m in conv.messages] == ["user", "assistant", "user", "assistant"]
    # text kept as it is between tags, the white-space-only " " after <sound> dropped
    assert conv.messages[0].content == [MediaPart("image", 0), MediaPart("image", 1), "\nCompare them.  ",
                                        MediaPart("audio", 2)]
    # <video-sound>: the vis_video field (video) then the vis_sound field (audio), whatever the key order
    assert conv.messages[2].content == ["And this clip? ", MediaPart("video", 3), MediaPart("audio", 4)]
    assert conv.messages[3].content == ["A moving pattern."]
    assert [(r.modality, r.payload) for r in conv.media] == [
        ("image", (folder / "imgs/a.png").resolve()), ("image", (folder / "imgs/b.jpg").resolve()),
        ("audio", (folder / "clips/s.wav").resolve()),        # 'value' wins over 'path' and 'member'
        ("video", (folder / "clips/v.mp4").resolve()), ("audio", (folder / "clips/v.wav").resolve())]
    assert conv.media[1].metadata == {"width": 40, "height": 40} and conv.media[0].metadata == {}
    assert conv.media[0].payload.read_bytes() == PNG and not conv.preformatted and conv.segments == [0]
    assert [m.train for m in conv.messages] == [None, None, None, None]


def test_audio_conversation_video_tag_leaves_video_sound_fields_alone(tmp_path):
    folder = media_folder(tmp_path)
    obj = {"conversations": turns(("human", "<video>"), ("gpt", "ok")), "video": "clips/v.mp4",
           "videos_extra": "clips/v.mp4"}
    conv = audio_cook(obj, folder)
    assert [(r.modality, r.name) for r in conv.media] == [("video", "clips/v.mp4"), ("video", "clips/v.mp4")]
    assert conv.messages[0].content == [MediaPart("video", 0), MediaPart("video", 1)]
    with pytest.raises(DataError, match=r"field 'video-sound' is never referenced by a tag \(<video-sound> reads "
                                        r"the vis_video\*/vis_sound\* fields") as err:
        audio_cook({**obj, "video-sound": "clips/v.mp4"}, folder)
    assert err.value.code == "media_reference"


def test_audio_conversation_members_and_turns_without_text(tmp_path):
    obj = {"conversations": turns(("human", "<image>"), ("human", "   "), ("gpt", "a cat")), "image": "jpg"}
    sample = wds_sample(obj, {"jpg": JPG})
    conv = COOKERS.get(AUDIO)(sample)
    assert conv.messages[0].content == [MediaPart("image", 0)] and conv.messages[1].content == [""]
    assert conv.media[0].payload == JPG and conv.media[0].name == "jpg"
    with pytest.raises(DataError, match=r"media members \['wav'\] are never referenced") as err:
        COOKERS.get(AUDIO)(wds_sample(obj, {"jpg": JPG, "wav": WAV}))
    assert err.value.code == "media_reference"
    twice = {**obj, "image_b": "jpg"}
    with pytest.raises(DataError, match=r"tag <image> references member 'jpg' a second time"):
        COOKERS.get(AUDIO)(wds_sample(twice, {"jpg": JPG}))


@pytest.mark.parametrize("obj, reason, code", [
    ({"conversations": turns(("system", "be brief"), ("gpt", "ok"))},
     r"turn 0 has unknown sender 'system' \(known: human, gpt\)", "unknown_role"),
    ({"conversations": turns(("human", "<image> hi"), ("gpt", "<image>")), "image": "imgs/a.png"},
     r"turn 1: tag <image> appears a second time \(first in turn 0\)", "media_reference"),
    ({"conversations": turns(("human", "<sound> hi"), ("gpt", "ok")), "image": "imgs/a.png"},
     r"turn 0: tag <sound> needs a field starting with 'sound'; the payload has none", "media_reference"),
    ({"conversations": turns(("human", "<video-sound>"), ("gpt", "ok")), "vis_video": "clips/v.mp4"},
     r"turn 0: tag <video-sound> needs a field starting with 'vis_sound'", "media_reference"),
    ({"conversations": turns(("human", "<image>"), ("gpt", "ok")), "image": "imgs/a.png", "sound_1": "clips/s.wav",
      "vis_video": "clips/v.mp4"},
     r"field 'sound_1' is never referenced by a tag \(nor are \['vis_video'\]\)", "media_reference"),
    ({"conversations": turns(("human", "<image>"), ("gpt", "ok")), "image": {"file": "imgs/a.png"}},
     r"field 'image' needs 'value', 'path' or 'member', got keys \['file'\]", "invalid_sample"),
    ({"conversations": turns(("human", "<image>"), ("gpt", "ok")), "image": ["imgs/a.png"]},
     r"field 'image' must hold one path .* got list", "invalid_sample"),
    ({"conversations": turns(("human", "<image>"), ("gpt", "ok")), "image": "imgs/zz.png"},
     r"image file 'imgs/zz\.png' not found under the dataset folder", "missing_media"),
    ({"conversations": turns(("human", 5), ("gpt", "ok"))}, r"turn 0 value must be a string, got int",
     "invalid_sample"),
    ({"conversations": []}, r"'conversations' must be a non-empty list", "invalid_sample"),
    ({"conversations": turns(("human", "hi"), ("gpt", "  "))}, r"message 1 is an empty assistant turn",
     "empty_assistant"),
])
def test_audio_conversation_refusals(tmp_path, obj, reason, code):
    with pytest.raises(DataError, match=rf"^parts/data-0\.tar:3: {reason}") as err:
        audio_cook(obj, media_folder(tmp_path))
    assert err.value.code == code


@pytest.mark.parametrize("name", [AUDIO, OMCAT])
def test_subflavors_reach_the_prompt_format(tmp_path, name):
    """As every NeMo-RL-named cooker: last-turn-only training is the prompt format's (no train flags)."""
    obj = {"conversations": turns(("human", "q1"), ("gpt", "a1"), ("human", "q2"), ("gpt", "a2"))}
    sub = {"cooker": name, "skip_chat_template": True, "train_only_on_last_assistant_turn": True}
    conv = audio_cook(obj, tmp_path, __subflavors__=sub) if name == AUDIO else omcat_cook(obj, {}, sub)
    assert conv.preformatted and conv.last_only and [m.train for m in conv.messages] == [None] * 4
    assert [m.text for m in conv.messages] == ["q1", "a1", "q2", "a2"]
    plain = audio_cook(obj, tmp_path) if name == AUDIO else omcat_cook(obj, {})
    assert not plain.preformatted and [m.train for m in plain.messages] == [None] * 4
    with pytest.raises(DataError, match=r"subflavor 'skip_chat_template' must be true or false, got 'yes'"):
        audio_cook(obj, tmp_path, __subflavors__={"skip_chat_template": "yes"}) if name == AUDIO else \
            omcat_cook(obj, {}, {"skip_chat_template": "yes"})


# -- nemotron_omcat_legacy_conversation_monolithic ---------------------------------------------

def test_omcat_alias_tags_and_fields_take_members_by_extension():
    obj = {"conversations": turns(("human", "<images> Look, then listen: <speech>\n"), ("gpt", "Heard it."),
                                  ("human", "<videos>"), ("gpt", "Seen it.")),
           "images": "whatever.png", "speech": "x.wav", "videos": "c.mp4"}
    conv = omcat_cook(obj, {"png": PNG, "wav": WAV, "mp4": MP4})
    assert [m.role for m in conv.messages] == ["user", "assistant", "user", "assistant"]
    # the trailing "\n" is white-space only: dropped
    assert conv.messages[0].content == [MediaPart("image", 0), " Look, then listen: ", MediaPart("audio", 1)]
    assert conv.messages[2].content == [MediaPart("video", 2)]
    assert [(r.modality, r.name, r.payload) for r in conv.media] == [("image", "png", PNG), ("audio", "wav", WAV),
                                                                     ("video", "mp4", MP4)]
    assert all(r.metadata == {} for r in conv.media)


def test_omcat_extension_preference_and_case():
    obj = {"conversations": turns(("human", "<image> <audio>"), ("gpt", "ok"))}
    conv = omcat_cook(obj, {"JPEG": JPG, "flac": WAV})
    assert [(r.modality, r.name) for r in conv.media] == [("image", "JPEG"), ("audio", "flac")]
    assert conv.messages[0].content == [MediaPart("image", 0), MediaPart("audio", 1)]   # " " dropped
    # png comes before jpg: the jpg member is then left unused, which is refused
    with pytest.raises(DataError, match=r"media members \['jpg'\] are never referenced") as err:
        omcat_cook(obj, {"jpg": JPG, "png": PNG, "flac": WAV})
    assert err.value.code == "media_reference"


@pytest.mark.parametrize("obj, members, reason, code", [
    ({"conversations": turns(("human", "<video-sound>"), ("gpt", "ok"))}, {"mp4": MP4},
     r"no member mapping is defined for <video-sound> in OMCAT's schema", "unsupported_media"),
    ({"conversations": turns(("human", "<image>"), ("gpt", "ok"))}, {"wav": WAV},
     r"tag <image> needs a member with extension png, jpeg, jpg, img; the sample has none "
     r"\(members: \['json', 'wav'\]\)", "missing_media"),
    ({"conversations": turns(("human", "<audio> and <sound>"), ("gpt", "ok"))}, {"wav": WAV},
     r"turn 0: tag <sound> appears a second time", "media_reference"),
    ({"conversations": turns(("human", "<sound>"), ("gpt", "<audios>"))}, {"wav": WAV},
     r"turn 1: tag <audios> \(read as <sound>\) appears a second time \(first in turn 0\)", "media_reference"),
    ({"conversations": turns(("human", "<image>"), ("gpt", "ok")), "image": "a.png", "images": "b.png"},
     {"png": PNG}, r"fields 'image' and 'images' both hold the 'image' field", "media_reference"),
    ({"conversations": turns(("human", "<sound>"), ("gpt", "ok")), "speech": "a", "audios": "b"},
     {"wav": WAV}, r"fields 'speech' and 'audios' both hold the 'sound' field", "media_reference"),
    ({"conversations": turns(("human", "<image>"), ("gpt", "ok")), "image": "a.png", "audio": "a.wav"},
     {"png": PNG, "wav": WAV}, r"media field 'sound' is never referenced by a tag", "media_reference"),
    ({"conversations": turns(("human", "hi"), ("gpt", "ok")), "video-sound": "c.mp4"}, {},
     r"media field 'video-sound' is never referenced by a tag", "media_reference"),
    ({"conversations": turns(("human", "<image>"), ("gpt", "ok"))}, {"png": PNG, "wav": WAV},
     r"media members \['wav'\] are never referenced", "media_reference"),
    ({"conversations": turns(("user", "hi"), ("gpt", "ok"))}, {},
     r"turn 0 has unknown sender 'user'", "unknown_role"),
])
def test_omcat_refusals(obj, members, reason, code):
    with pytest.raises(DataError, match=rf"^parts/data-0\.tar:k1: {reason}") as err:
        omcat_cook(obj, members)
    assert err.value.code == code


# -- through the real Energon loader -----------------------------------------------------------

def test_audio_conversation_jsonl_through_the_loader(tmp_path, demo_tokenizer):
    from energon_data import energon

    folder = media_folder(tmp_path)
    rows = [{"conversations": turns(("human", f"<image> What is shown? <video-sound> Row {i}."),
                                    ("gpt", f"Answer {i}.")),
             "image": "imgs/a.png" if i % 2 else "imgs/b.jpg", "vis_video": "clips/v.mp4",
             "vis_sound": "clips/v.wav"} for i in range(3)]
    (folder / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    energon("prepare", str(folder / "chat.jsonl"))
    cfg = loader_yaml(folder / "l.yaml", {"path": "chat.jsonl"}, packing=PACKING, seq_length=2048,
                      prompt_format="nemotron-h", extra_options=SMALL_MEDIA, default_cooker=AUDIO)
    keys, visual, audio = read_epoch(cfg, demo_tokenizer)
    assert (len(keys), visual, audio) == (3, 6, 3)        # per row: an image and a video, one audio


def read_epoch(cfg, demo_tokenizer) -> tuple[list, int, int]:
    """(sample keys, visual items, audio items) of one epoch, each batch checked (``check_batch``)."""
    vocab = demo_tokenizer.get_vocab()
    visual = audio = 0
    keys = []
    for batch in build_train_loader(cfg, repeat=False):
        v, a = check_batch(batch, vocab)
        visual, audio = visual + v, audio + a
        keys += [k for row in batch.sample_keys for k in row]
    return keys, visual, audio


def test_omcat_webdataset_through_the_loader(tmp_path, demo_tokenizer):
    samples = [(f"omcat-{i}", {"json": json.dumps({"conversations": turns(
        ("human", f"<speech>\nTranscribe clip {i}."), ("gpt", f"clip {i}")), "speech": f"{i}.wav"}).encode(),
        "wav": make_audio(0.5 + i / 4, 16000, 1, seed=i, container="wav")}) for i in range(2)]
    samples.append(("omcat-img", {"json": json.dumps({"conversations": turns(
        ("human", "<images> What colour?"), ("gpt", "Many."))}).encode(), "png": PNG}))
    write_shards(tmp_path / "ds", samples)
    prepare(tmp_path / "ds", {"cooker": OMCAT})
    cfg = loader_yaml(tmp_path / "l.yaml", {"path": "ds"}, packing=PACKING, seq_length=2048,
                      prompt_format="nemotron-h", extra_options=SMALL_MEDIA)
    keys, visual, audio = read_epoch(cfg, demo_tokenizer)
    assert sorted(keys) == [f"ds/parts/data-0.tar:{k}" for k in ("omcat-0", "omcat-1", "omcat-img")] and (visual, audio) == (1, 2)
