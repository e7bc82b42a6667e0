"""NeMo-RL's registered cooker names: its Nemotron general-conversations schema (tag and field
aliases, ``<video-sound>``, explicit per-turn loss), Granary, the Nano text normalisation, the
canonical ``generic_conversation``; the subflavors they read (``aux_data_prefixes``, the
``media_source`` aux name, ``tool_response_as_turn_boundary``), and where they refuse what NeMo-RL
silently drops."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from megatron.energon.cache.file_store import SystemFileStore
from megatron.energon.epathlib import EPath
from megatron.energon.source_info import SourceInfo

from energon_nemotron.cookers.media_sources import AuxMedia, check_binding, media_scope
from energon_nemotron.cookers.nano_messages import EMPTY_SYSTEM_CONTENT, LEGACY_SYSTEM_CONTENT, normalize
from energon_nemotron.cookers.nemotron_general import GRANARY_ENGLISH_PROMPT
from energon_nemotron.errors import ConfigError, DataError
from energon_nemotron.registry import COOKERS
from energon_nemotron.types import MediaPart

WDS = "nemotron_general_conversations_webdataset"
JSONL = "nemotron_general_conversations_jsonl"
EXPLICIT = "nemotron_general_conversations_jsonl_explicit_loss_v1"
EXPLICIT_SUB = {"cook": "general_conversations_jsonl_explicit_loss_v1", "loss_mask_mode": "explicit_assistant_turns",
                "assistant_loss_mask_field": "conversations[*].loss"}


def crude(obj: dict, members: dict | None = None, subflavors: dict | None = None, folder: Path | None = None,
          key: str = "s1") -> dict:
    sources = () if folder is None else (SourceInfo(dataset_path=EPath(folder / "d.jsonl"), index=3,
                                                    shard_name="d.jsonl", file_names=("3.json",)),)
    return {"__key__": key, "__restore_key__": ("x", 3), "__shard__": "parts/data-0.tar",
            "__subflavors__": subflavors, "__sources__": sources, "json": json.dumps(obj).encode(), **(members or {})}


def cook(name: str, sample: dict, **aux):
    return COOKERS.get(name)(sample, **aux)


def turns(*values: str) -> list[dict]:
    return [{"from": "human" if i % 2 == 0 else "gpt", "value": v} for i, v in enumerate(values)]


def test_webdataset_tags_aliases_and_video_sound():
    obj = {"conversations": turns("<image>\nLook <speech> and <video-sound>", "Fine."), "images": ["0.jpg"],
           "speech": "clip.wav", "video-sound": {"member": "movie.mp4", "metadata": {"fps": 2}}}
    conv = cook(WDS, crude(obj, {"0.jpg": b"I", "wav": b"W", "mp4": b"V"}))
    assert conv.messages[0].content == [MediaPart("image", 0), "\nLook ", MediaPart("audio", 1), " and ",
                                        MediaPart("video", 2), MediaPart("audio", 3)]
    assert [(m.modality, m.payload, m.name) for m in conv.media] == [
        ("image", b"I", "0.jpg"), ("audio", b"W", "wav"), ("video", b"V", "mp4"), ("audio", b"V", "mp4")]
    assert conv.media[2].metadata == {"fps": 2} and conv.messages[1].text == "Fine."
    assert not conv.last_only and not conv.tool_boundary and conv.segments == [0]


def test_text_less_turn_gets_a_space_and_blank_text_is_dropped():
    obj = {"conversations": turns("<image>\n \n", "A cat."), "image": "x.png"}
    conv = cook(WDS, crude(obj, {"png": b"P"}))
    assert conv.messages[0].content == [MediaPart("image", 0), " "]


def test_webdataset_default_member_fallback_and_unused_members():
    obj = {"conversations": turns("<image><image>", "Two."), "image": ["a", "b"]}
    conv = cook(WDS, crude(obj, {"png": b"1", "jpg": b"2"}))
    assert [m.name for m in conv.media] == ["png", "jpg"]          # each default extension once, in order
    with pytest.raises(DataError, match=r"s1.*media members \['wav'\] are never referenced"):
        cook(WDS, crude({"conversations": turns("<image>", "One."), "image": "a.png"}, {"png": b"1", "wav": b"W"}))


@pytest.mark.parametrize("obj, message", [
    ({"conversations": turns("<image>", "x"), "image": ["a.png", "b.png"]}, r"media entries no tag uses: \{'image': 1\}"),
    ({"conversations": turns("<image><image>", "x"), "image": "a.png"}, r"tag <image> has no image entry left"),
    ({"conversations": turns("<audio>", "x"), "sound": "a.wav", "speech": "b.wav"}, r"fields 'sound' and 'speech'"),
    ({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "x", "loss": True}]},
     r"turn 1 has an explicit 'loss' field"),
    ({"conversations": [{"from": "robot", "value": "hi"}]}, r"turn 0 has unknown role 'robot'"),
    ({"conversations": []}, r"'conversations' must be a non-empty list"),
])
def test_refusals_name_the_sample(obj, message):
    with pytest.raises(DataError, match=r"^parts/data-0\.tar:s1: .*" + message):
        cook(WDS, crude(obj, {"png": b"1", "wav": b"2"}))


def test_jsonl_paths_resolve_in_the_dataset_folder(tmp_path):
    (tmp_path / "clips").mkdir()
    (tmp_path / "clips" / "a.wav").write_bytes(b"RIFF")
    conv = cook(JSONL, crude({"conversations": turns("<sound> what?", "Rain."), "audio": "clips/a.wav"},
                             folder=tmp_path))
    assert conv.media[0].modality == "audio" and Path(conv.media[0].payload) == tmp_path / "clips" / "a.wav"
    with pytest.raises(DataError, match=r"audio file 'clips/b.wav' not found"):
        cook(JSONL, crude({"conversations": turns("<sound>", "x"), "audio": "clips/b.wav"}, folder=tmp_path))


def test_explicit_loss_flags_and_subflavor_contract(tmp_path):
    obj = {"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b", "loss": False},
                             {"from": "human", "value": "c"}, {"from": "gpt", "value": "d", "loss": True}]}
    conv = cook(EXPLICIT, crude(obj, subflavors=EXPLICIT_SUB, folder=tmp_path))
    assert [m.train for m in conv.messages] == [None, False, None, True]
    with pytest.raises(DataError, match=r"needs the subflavors loss_mask_mode: 'explicit_assistant_turns'$"):
        cook(EXPLICIT, crude(obj, subflavors={**EXPLICIT_SUB, "loss_mask_mode": None}, folder=tmp_path))
    with pytest.raises(DataError, match=r"and not train_only_on_last_assistant_turn"):
        cook(EXPLICIT, crude(obj, subflavors={**EXPLICIT_SUB, "train_only_on_last_assistant_turn": True},
                             folder=tmp_path))
    none = json.loads(json.dumps(obj))
    none["conversations"][3]["loss"] = False
    with pytest.raises(DataError, match=r"no assistant turn has loss: true"):
        cook(EXPLICIT, crude(none, subflavors=EXPLICIT_SUB, folder=tmp_path))
    missing = json.loads(json.dumps(obj))
    del missing["conversations"][1]["loss"]
    with pytest.raises(DataError, match=r"turn 1 \(assistant\) needs 'loss': true or false"):
        cook(EXPLICIT, crude(missing, subflavors=EXPLICIT_SUB, folder=tmp_path))
    with pytest.raises(DataError, match=r"select explicit per-turn loss: use the cooker"):
        cook(JSONL, crude({"conversations": turns("a", "b")}, subflavors=EXPLICIT_SUB, folder=tmp_path))


def test_granary_prompt_and_audio():
    conv = cook("nemotron_granary_english_webdataset", crude({"audio_filepath": "x.flac", "text": "hello"},
                                                             {"flac": b"F"}))
    assert conv.messages[0].content == [MediaPart("audio", 0), GRANARY_ENGLISH_PROMPT[len("<audio>"):]]
    assert conv.messages[1].text == "hello" and conv.media[0].payload == b"F"


def test_subflavors_reach_the_prompt_format():
    sub = {"train_only_on_last_assistant_turn": True, "tool_response_as_turn_boundary": True,
           "skip_chat_template": False}
    conv = cook(WDS, crude({"conversations": turns("a", "b", "c", "d")}, subflavors=sub))
    assert conv.last_only and conv.tool_boundary and [m.train for m in conv.messages] == [None] * 4
    # the library's own cookers: last-turn flags as before, unless the boundary rule asks for the format's
    plain = COOKERS.get("general_conversations")(crude({"conversations": turns("a", "b", "c", "d")},
                                                       subflavors={"train_only_on_last_assistant_turn": True}))
    assert [m.train for m in plain.messages if m.role == "assistant"] == [False, True] and not plain.last_only


def test_nano_normalisation():
    got = normalize([["human", "hi"], ["gpt", "\nyes  \n\n"], ["tool", "r"], ["assistant", "done"]])
    assert got == [["system", EMPTY_SYSTEM_CONTENT], ["human", "hi"], ["gpt", "\nyes  \n\n"],
                   ["user", "r"], ["assistant", "done\n"]]
    assert normalize([["system", LEGACY_SYSTEM_CONTENT], ["user", "q"]])[0] == ["system", EMPTY_SYSTEM_CONTENT]
    joined = normalize([["user", "q<|im_end|>\n<|im_start|>assistant\n<think>\n"], ["assistant", "\n</think>\n\nA"]])
    assert joined[1:] == [["user", "q<|im_end|>\n<|im_start|>assistant\n<think></think>"], ["assistant", "A\n"]]
    stripped = normalize([["user", "q\n"], ["assistant", "\nA"]])
    assert stripped[2] == ["assistant", "A\n"]
    assert normalize([["user", EMPTY_SYSTEM_CONTENT + "q"]])[1] == ["user", "q"]


def test_nano_cookers_segments_and_refusals():
    rows = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, "b"]},
                         {"role": "assistant", "content": "c"},
                         {"role": "system", "content": "S"}, {"role": "user", "content": "d"},
                         {"role": "assistant", "content": "e"}]}
    packed = cook("nemotron_nano_openai_messages_offline_packed_jsonl",
                  crude(rows, subflavors={"skip_chat_template": True}))
    assert packed.segments == [0, 3] and packed.preformatted
    assert [(m.role, m.text) for m in packed.messages] == [
        ("system", EMPTY_SYSTEM_CONTENT), ("user", "ab"), ("assistant", "c\n"), ("system", "S"), ("user", "d"),
        ("assistant", "e\n")]
    with pytest.raises(DataError, match=r"a later system message"):
        cook("nemotron_nano_openai_messages_jsonl", crude(rows))
    with pytest.raises(DataError, match=r"message 0 part 0: the Nano text cookers read text parts only"):
        cook("nemotron_nano_openai_messages_jsonl",
             crude({"messages": [{"role": "user", "content": [{"type": "image", "image": "x"}]}]}))
    with pytest.raises(DataError, match=r"message 1 has a 'loss' field"):
        cook("nemotron_nano_openai_messages_jsonl",
             crude({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "loss": 1}]}))


def test_generic_conversation_manifest():
    obj = {"messages": [{"role": "user", "content": [{"type": "text", "text": "see "},
                                                     {"type": "audio", "media_index": 1},
                                                     {"type": "image", "media_index": 0}]},
                        {"role": "assistant", "content": "ok", "train_on_message": False},
                        {"role": "user", "content": "and?"}, {"role": "assistant", "content": "fine"}],
           "media": ["s1.jpg", {"member": "sound.wav", "type": "audio"}]}
    conv = cook("generic_conversation", crude(obj, {"jpg": b"J", "wav": b"W"}))
    assert conv.messages[0].content == ["see ", MediaPart("audio", 0), MediaPart("image", 1)]
    assert [m.payload for m in conv.media] == [b"W", b"J"]
    assert [m.train for m in conv.messages] == [None, False, None, None]
    unused = {**obj, "media": obj["media"] + ["x.png"]}
    with pytest.raises(DataError, match=r"media member 'x.png' is not in the sample"):
        cook("generic_conversation", crude(unused, {"jpg": b"J", "wav": b"W"}))
    with pytest.raises(DataError, match=r"media entries \[2\] are never referenced"):
        cook("generic_conversation", crude(unused, {"jpg": b"J", "wav": b"W", "png": b"P"}))
    twice = json.loads(json.dumps(obj))
    twice["messages"][2]["content"] = [{"type": "image", "media_index": 0}]
    with pytest.raises(DataError, match=r"media entry 0 referenced twice"):
        cook("generic_conversation", crude(twice, {"jpg": b"J", "wav": b"W"}))


def test_aux_named_media_source_and_aux_data_prefixes(tmp_path):
    (tmp_path / "pool" / "imgs").mkdir(parents=True)
    (tmp_path / "pool" / "imgs" / "a.png").write_bytes(b"P")
    (tmp_path / "other").mkdir()
    pool, other = SystemFileStore(EPath(tmp_path / "pool")), SystemFileStore(EPath(tmp_path / "other"))
    obj = {"conversations": turns("<image>", "x"), "image": "imgs/a.png"}
    # NeMo-RL's aux name wins among several aux sources, without a media_source subflavor
    with media_scope(aux={"other": other, "media_source": pool}):
        ref = cook(JSONL, crude(obj, folder=tmp_path), other=other, media_source=pool).media[0]
    assert isinstance(ref.payload, AuxMedia) and ref.payload.source == "media_source"
    # aux_data_prefixes: the prefix picks the source and is stripped
    sub = {"aux_data_prefixes": {"s3://bucket/": "pool"}}
    prefixed = {**obj, "image": "s3://bucket/imgs/a.png"}
    with media_scope(aux={"other": other, "pool": pool}):
        ref = cook(JSONL, crude(prefixed, subflavors=sub, folder=tmp_path), other=other, pool=pool).media[0]
    assert ref.payload.source == "pool" and ref.payload.key == "imgs/a.png"
    with pytest.raises(ConfigError, match=r"aux_data_prefixes: 's3://bucket/': 'pool' names no aux source"):
        check_binding({"other": other}, sub, "ds")


def test_nemotron_conversation_refuses_what_it_would_drop():
    """NeMo-RL's fragment extras (clip timing) and ``video_frame`` fragments are refused by name, not
    dropped; so is a turn's explicit loss."""
    timed = {"conversation": [{"sender": "user", "fragments": [{"t": "video", "value": "a.mp4", "start_time": 1.0}]},
                              {"sender": "assistant", "fragments": ["ok"]}]}
    with pytest.raises(DataError, match=r"turn 0 fragment 0: keys \['start_time'\] are not read by this cooker"):
        cook("nemotron_conversation", crude(timed, {"mp4": b"V"}))
    frame = {"conversation": [{"sender": "user", "fragments": [{"t": "video_frame", "value": "f.jpg"}]},
                              {"sender": "assistant", "fragments": ["ok"]}]}
    with pytest.raises(DataError, match=r"turn 0 fragment 0 must be a string or"):
        cook("nemotron_conversation", crude(frame, {"jpg": b"J"}))
    loss = {"conversation": [{"sender": "user", "fragments": ["q"]},
                             {"sender": "assistant", "fragments": ["a"], "loss": True}]}
    with pytest.raises(DataError, match=r"turn 1 has an explicit 'loss' field"):
        cook("nemotron_conversation", crude(loss))

