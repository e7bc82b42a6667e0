"""Text cookers: schemas, subflavors, and errors that name the sample key."""

from __future__ import annotations

import json

import pytest

from energon_nemotron.cookers import build_cookers
from energon_nemotron.errors import ConfigError, DataError
from energon_nemotron.registry import COOKERS


def crude(obj, subflavors=None, key="000007", raw=False):
    data = json.dumps(obj).encode() if raw else obj
    return {"__key__": key, "__restore_key__": ("x", 7), "__shard__": "parts/data-0.tar",
            "__subflavors__": subflavors, "__sources__": (), "json": data}


def cook(name, obj, **kw):
    return COOKERS.get(name)(crude(obj, **kw))


def roles_texts(conv):
    return [(m.role, m.text) for m in conv.messages]


def test_registered_names_and_stateless():
    assert COOKERS.names() == ["general_conversations", "generic_conversation", "granary_asr",
                               "nemotron_audio_conversation_jsonl", "nemotron_conversation",
                               "nemotron_general_conversations_jsonl",
                               "nemotron_general_conversations_jsonl_explicit_loss_v1",
                               "nemotron_general_conversations_webdataset", "nemotron_granary_english_jsonl",
                               "nemotron_granary_english_webdataset", "nemotron_nano_openai_messages_jsonl",
                               "nemotron_nano_openai_messages_offline_packed_jsonl",
                               "nemotron_omcat_legacy_conversation_monolithic", "openai_messages",
                               "openai_messages_offline_packed"]
    for name in COOKERS.names():
        assert getattr(COOKERS.get(name), "__stateless__", False), name


def test_nemotron_conversation():
    conv = cook("nemotron_conversation", {"conversation": [
        {"sender": "system", "fragments": ["Be kind."]},
        {"sender": "user", "fragments": ["Hi ", {"t": "text", "value": "there"}]},
        {"sender": "assistant", "fragments": ["Hello"]}]}, raw=True)
    assert roles_texts(conv) == [("system", "Be kind."), ("user", "Hi there"), ("assistant", "Hello")]
    assert conv.__key__ == "000007" and conv.__restore_key__ == ("x", 7) and conv.segments == [0]


def test_general_conversations_and_subflavors():
    conv = cook("general_conversations", {"conversations": [
        {"from": "human", "value": "q1"}, {"from": "gpt", "value": "a1"},
        {"from": "human", "value": "q2"}, {"from": "gpt", "value": "a2"}]},
        subflavors={"cooker": "general_conversations", "train_only_on_last_assistant_turn": True,
                    "skip_chat_template": True})
    assert roles_texts(conv) == [("user", "q1"), ("assistant", "a1"), ("user", "q2"), ("assistant", "a2")]
    assert [m.train for m in conv.messages] == [None, False, None, True]
    assert conv.preformatted and conv.__subflavors__["cooker"] == "general_conversations"


def test_openai_messages_and_offline_packed():
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "a"},
                                                                             {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": "c", "reasoning_content": "think"},
            {"role": "system", "content": "t"}, {"role": "user", "content": "d"},
            {"role": "assistant", "content": "e"}]
    conv = cook("openai_messages", {"messages": msgs})
    assert conv.segments == [0] and conv.messages[1].text == "ab" and conv.messages[2].reasoning == "think"
    packed = cook("openai_messages_offline_packed", {"messages": msgs})
    assert packed.segments == [0, 3]
    assert [[m.text for m in seg] for seg in packed.segment_messages()] == [["s", "ab", "c"], ["t", "d", "e"]]


@pytest.mark.parametrize("name, obj, reason", [
    ("openai_messages", {"msgs": []}, r"missing 'messages' \(keys: \['msgs'\]\)"),
    ("openai_messages", {"messages": []}, r"'messages' must be a non-empty list"),
    ("openai_messages", {"messages": [{"role": "narrator", "content": "x"}]}, r"turn 0 has unknown role 'narrator'"),
    ("openai_messages", {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": 5}]},
     r"message 1 content must be a string, got int"),
    ("openai_messages", {"messages": [{"role": "user", "content": [{"type": "file", "file": {"file_id": "x"}}]}]},
     r"message 0 content part 0 has type 'file'; known part types: text, input_text"),
    ("openai_messages", {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "  "}]},
     r"message 1 is an empty assistant turn"),
    ("openai_messages", {"messages": [{"role": "user", "content": "q"}]}, r"the conversation has no assistant turn"),
    ("general_conversations", {"conversations": [{"from": "human", "value": "<image>\nwhat?"},
                                                 {"from": "gpt", "value": "a"}]}, r"more image references than image items \(0\)"),
    ("nemotron_conversation", {"conversation": [{"sender": "user", "fragments": 3}]}, r"turn 0 'fragments' must be a list"),
])
def test_errors_name_key_and_reason(name, obj, reason):
    with pytest.raises(DataError, match=rf"^parts/data-0\.tar:000007: {reason}"):
        cook(name, obj)


def test_bad_json_and_subflavor_types():
    sample = crude({"messages": []})
    sample["json"] = b"{oops"
    with pytest.raises(DataError, match=r"json is not valid JSON"):
        COOKERS.get("openai_messages")(sample)
    del sample["json"]
    sample["txt"] = b"x"
    with pytest.raises(DataError, match=r"no \.json member \(members: \['txt'\]\)"):
        COOKERS.get("openai_messages")(sample)
    good = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    with pytest.raises(DataError, match=r"subflavor 'skip_chat_template' must be true or false, got 'yes'"):
        cook("openai_messages", good, subflavors={"skip_chat_template": "yes"})


def test_build_cookers_selection():
    cookers = build_cookers("openai_messages")
    assert all(c.has_subflavors == {"cooker": c.has_subflavors["cooker"]} for c in cookers[:-1])
    assert cookers[-1].has_subflavors is None
    named = {c.has_subflavors["cooker"]: c for c in cookers[:-1]}
    assert named["general_conversations"].is_match({"cooker": "general_conversations", "x": 1})
    assert not named["general_conversations"].is_match({"cooker": "openai_messages"})
    assert not named["general_conversations"].is_match(None)       # a standalone JSONL dataset
    assert cookers[-1].is_match(None) and cookers[-1].cook is COOKERS.get("openai_messages")
    with pytest.raises(ConfigError, match="default_cooker: unknown cooker 'nope'"):
        build_cookers("nope")


# -- media -------------------------------------------------------------------------------------

from pathlib import Path  # noqa: E402

from megatron.energon.epathlib import EPath  # noqa: E402
from megatron.energon.source_info import SourceInfo  # noqa: E402

from energon_nemotron.types import MediaPart  # noqa: E402


def wds_sample(obj, members, key="k1"):
    s = crude(obj, key=key, raw=True)
    s.update(members)
    return s


def jsonl_sample(obj, folder: Path, key="3"):
    s = crude(obj, key=key)
    s["__sources__"] = (SourceInfo(dataset_path=EPath(folder / "data.jsonl"), index=3, shard_name="data.jsonl",
                                   file_names=("3.json",)),)
    return s


def test_general_conversations_members_in_name_order():
    obj = {"conversations": [{"from": "human", "value": "<image> and <image>, hear <audio>?"},
                             {"from": "gpt", "value": "ok"}]}
    conv = COOKERS.get("general_conversations")(wds_sample(obj, {"10.jpg": b"B", "2.jpg": b"A", "wav": b"W"}))
    assert conv.messages[0].content == [MediaPart("image", 0), " and ", MediaPart("image", 1), ", hear ",
                                        MediaPart("audio", 2), "?"]
    assert [(m.modality, m.payload, m.name) for m in conv.media] == [("image", b"A", "2.jpg"), ("image", b"B", "10.jpg"),
                                                                     ("audio", b"W", "wav")]
    with pytest.raises(DataError, match=r"^parts/data-0\.tar:k1: 1 image references but 2 image items"):
        obj1 = {"conversations": [{"from": "human", "value": "<image>"}, {"from": "gpt", "value": "ok"}]}
        COOKERS.get("general_conversations")(wds_sample(obj1, {"0.jpg": b"A", "1.jpg": b"B"}))


def test_jsonl_paths_resolve_inside_the_dataset_folder(tmp_path):
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "a.png").write_bytes(b"png")
    (tmp_path.parent / "outside.png").write_bytes(b"x")
    ok = {"conversations": [{"from": "human", "value": "<image> what?"}, {"from": "gpt", "value": "a"}],
          "image": "imgs/a.png"}
    conv = COOKERS.get("general_conversations")(jsonl_sample(ok, tmp_path))
    assert conv.media[0].payload == (tmp_path / "imgs" / "a.png").resolve()
    with pytest.raises(DataError, match=r"image path '\.\./outside\.png' escapes the dataset folder"):
        COOKERS.get("general_conversations")(jsonl_sample({**ok, "image": "../outside.png"}, tmp_path))
    with pytest.raises(DataError, match=r"image file 'imgs/b\.png' not found under the dataset folder"):
        COOKERS.get("general_conversations")(jsonl_sample({**ok, "image": "imgs/b.png"}, tmp_path))


def test_nemotron_conversation_fragments_reference_members_once():
    obj = {"conversation": [{"sender": "user", "fragments": ["Look: ", {"t": "image", "value": "0.jpg",
                                                                          "metadata": {"width": 64, "height": 32}},
                                                             " and listen ", {"t": "audio", "value": "flac"}]},
                            {"sender": "assistant", "fragments": ["Nice."]}]}
    conv = COOKERS.get("nemotron_conversation")(wds_sample(obj, {"0.jpg": b"I", "flac": b"F"}))
    assert conv.messages[0].content == ["Look: ", MediaPart("image", 0), " and listen ", MediaPart("audio", 1)]
    assert conv.media[0].metadata == {"width": 64, "height": 32}
    with pytest.raises(DataError, match=r"media members \['1\.jpg'\] are never referenced"):
        COOKERS.get("nemotron_conversation")(wds_sample(obj, {"0.jpg": b"I", "1.jpg": b"J", "flac": b"F"}))
    twice = {"conversation": [{"sender": "user", "fragments": [{"t": "image", "value": "0.jpg"},
                                                               {"t": "image", "value": "0.jpg"}]},
                              {"sender": "assistant", "fragments": ["x"]}]}
    with pytest.raises(DataError, match=r"references member '0\.jpg' a second time"):
        COOKERS.get("nemotron_conversation")(wds_sample(twice, {"0.jpg": b"I"}))


def test_granary_asr(tmp_path):
    (tmp_path / "a.wav").write_bytes(b"RIFF")
    conv = COOKERS.get("granary_asr")(jsonl_sample({"audio_filepath": "a.wav", "text": "hello world"}, tmp_path))
    assert conv.messages[0].content[0] == MediaPart("audio", 0) and conv.messages[1].text == "hello world"
    assert conv.media[0].payload == (tmp_path / "a.wav").resolve()
    member = COOKERS.get("granary_asr")(wds_sample({"text": "hi"}, {"flac": b"F"}))
    assert member.media[0].payload == b"F"
    with pytest.raises(DataError, match=r"expected one audio item .* found 2"):
        COOKERS.get("granary_asr")(wds_sample({"text": "hi"}, {"0.flac": b"F", "1.flac": b"G"}))
    with pytest.raises(DataError, match=r"'text' \(the transcript\) is empty"):
        COOKERS.get("granary_asr")(wds_sample({"text": " "}, {"flac": b"F"}))
