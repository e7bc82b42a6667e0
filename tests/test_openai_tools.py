"""OpenAI messages as users have them: multimodal content parts, tool calls and results, a ``tools``
list, per-turn ``weight`` — from prepared JSONL and WebDataset shards to ``PackedBatch``es, with
assistant masks equal to Hugging Face's on a template that renders tools, and the Nemotron formats
rendering tools as their published chat templates do."""

from __future__ import annotations

import base64
import json
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import DEMO_TOKENIZER
from energon_data import energon, loader_yaml, prepare, shown_keys, write_shards
from energon_nemotron.cookers.openai_messages import cook_openai_messages
from energon_nemotron.demo.media import make_audio, make_image, make_video
from energon_nemotron.errors import DataError
from energon_nemotron.loading import build_train_loader
from energon_nemotron.tokenization import ConversationTokenizer
from energon_nemotron.tokenization.formats import TokenizerTemplateFormat
from energon_nemotron.types import Message, ToolCall

SMALL_MEDIA = {"image": {"min_patches": 64, "max_patches": 256},
               "video": {"target_patches": 64, "min_frames": 2, "max_frames": 4}}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": " Weather of a city ",
    "parameters": {"type": "object", "required": ["city"], "additionalProperties": False,
                   "properties": {"city": {"type": ["string", "null"], "description": "the city", "minLength": 1},
                                  "unit": {"type": "string", "enum": ["c", "f"], "x": {"a": 1}}}},
    "strict": True}}
NOARGS = {"name": "noargs"}

#: a ChatML template that renders tools, tool calls and tool results, with generation markers
TOOL_TEMPLATE = (
    "{%- if tools -%}{{ '<|im_start|>system\\n# Tools' }}{%- for t in tools -%}{{ '\\n' + (t | tojson) }}"
    "{%- endfor -%}{{ '<|im_end|>\\n' }}{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'assistant' -%}{{ '<|im_start|>assistant\\n' }}{% generation %}{{ m['content'] }}"
    "{%- for c in m.get('tool_calls', []) -%}{{ '<tool_call>' + ({'name': c['function']['name'], "
    "'arguments': c['function']['arguments']} | tojson) + '</tool_call>' }}{%- endfor -%}"
    "{{ '<|im_end|>\\n' }}{% endgeneration %}"
    "{%- elif m['role'] == 'tool' -%}{{ '<|im_start|>tool\\n[' + (m.get('tool_call_id') or '') + '] ' + "
    "m['content'] + '<|im_end|>\\n' }}"
    "{%- else -%}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endif -%}"
    "{%- endfor -%}{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def crude(obj, key="000003"):
    return {"__key__": key, "__restore_key__": ("x", 3), "__shard__": "parts/data-0.tar", "__subflavors__": None,
            "__sources__": (), "json": obj}


def trained_texts(batch, tokenizer) -> list[str]:
    """Decoded runs of trained labels of row 0."""
    labels, mask = batch.labels[0].tolist(), batch.loss_mask[0].tolist()
    runs, cur = [], []
    for lab, on in zip(labels, mask):
        if on:
            cur.append(lab)
        elif cur:
            runs.append(tokenizer.decode(cur))
            cur = []
    if cur:
        runs.append(tokenizer.decode(cur))
    return runs


# -- the Nemotron formats ---------------------------------------------------------------------------
TOOL_CONV = [
    Message("user", ["Weather in Paris?"]),
    Message("assistant", [""], tool_calls=[ToolCall("get_weather", {"city": "Paris", "n": [1, 2], "b": True,
                                                                    "o": {"k": "é"}, "z": None}, "c1")]),
    Message("tool", ['{"temp": 21}'], tool_call_id="c1"), Message("tool", ["ok"]),
    Message("assistant", ["It is 21C."])]

NEMOTRON6_TOOL_BLOCK = (
    "# Tools\n\nYou have access to the following functions:\n\n<tools>\n<function>\n<name>get_weather</name>\n"
    "<description>Weather of a city</description>\n<parameters>\n<parameter>\n<name>city</name>\n"
    "<type>['string', 'null']</type>\n<description>the city</description>\n<minLength>1</minLength>\n"
    "</parameter>\n<parameter>\n<name>unit</name>\n<type>string</type>\n<enum>[\"c\", \"f\"]</enum>\n"
    "<x>{\"a\": 1}</x>\n</parameter>\n<additionalProperties>False</additionalProperties>\n"
    "<required>[\"city\"]</required>\n</parameters>\n<strict>True</strict>\n</function>\n<function>\n"
    "<name>noargs</name>\n<parameters>\n</parameters>\n</function>\n</tools>\n\n"
    "If you choose to call a function ONLY reply in the following format with NO suffix:\n\n")


def test_nemotron6_renders_tools_as_the_nemotron3_template():
    """Expected text derived from the published Nemotron 3 Nano chat template (checked against it
    with transformers' renderer when written): tools block in the system turn, calls as
    <tool_call><function=…><parameter=…>, consecutive results in one user turn."""
    t = ConversationTokenizer(DEMO_TOKENIZER, "nemotron6")
    r = t.render([Message("system", ["Be brief."])] + TOOL_CONV, "k", tools=[WEATHER, NOARGS])
    assert r.text.startswith("<|im_start|>system\nBe brief.\n\n" + NEMOTRON6_TOOL_BLOCK)
    assert r.text.split("</IMPORTANT><|im_end|>\n", 1)[1] == (
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n<think></think>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
        "</parameter>\n<parameter=n>\n[1, 2]\n</parameter>\n<parameter=b>\nTrue\n</parameter>\n<parameter=o>\n"
        "{\"k\": \"é\"}\n</parameter>\n<parameter=z>\nNone\n</parameter>\n</function>\n</tool_call>\n<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response>\n<tool_response>\nok\n"
        "</tool_response>\n<|im_end|>\n"
        "<|im_start|>assistant\n<think></think>It is 21C.<|im_end|>\n")
    spans = [r.text[a:b] for a, b in r.spans]
    assert spans[0].startswith("\n<tool_call>\n<function=get_weather>") and spans[0].endswith("</tool_call>\n<|im_end|>")
    assert spans[1] == "It is 21C.<|im_end|>"
    # reasoning and text before calls; a call-only turn with reasoning; no system message
    msgs = [Message("user", ["q"]),
            Message("assistant", ["Let me check.  "], reasoning="need tool",
                    tool_calls=[ToolCall("noargs", {}), ToolCall("get_weather", {"city": "Rome"})]),
            Message("tool", ["r1"]), Message("assistant", [""], reasoning="more", tool_calls=[ToolCall("noargs", {})]),
            Message("tool", ["r2"]), Message("assistant", ["done"])]
    r = t.render(msgs, "k", tools=[NOARGS])
    assert r.text.startswith("<|im_start|>system\n# Tools\n\n")
    assert r.text.split("</IMPORTANT><|im_end|>\n", 1)[1] == (
        "<|im_start|>user\nq<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nneed tool\n</think>\nLet me check.\n<tool_call>\n<function=noargs>\n"
        "</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
        "</function>\n</tool_call>\n<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nmore\n</think>\n<tool_call>\n<function=noargs>\n</function>\n</tool_call>\n"
        "<|im_end|>\n<|im_start|>user\n<tool_response>\nr2\n</tool_response>\n<|im_end|>\n"
        "<|im_start|>assistant\n<think></think>done<|im_end|>\n")
    assert [r.text[a:b] for a, b in r.spans][0].startswith("need tool\n</think>\nLet me check.\n<tool_call>")


def test_nemotron_h_renders_tools_as_the_nano_v2_template():
    t = ConversationTokenizer(DEMO_TOKENIZER, "nemotron-h")
    raw = ToolCall("get_weather", {"city": "Paris"}, "c1", raw='{"city":"Paris"}')
    msgs = [Message("system", ["Be brief. /no_think"]), Message("user", ["Weather?"]),
            Message("assistant", ["Checking."], tool_calls=[raw, ToolCall("noargs", {})]),
            Message("tool", ['{"temp": 21}']), Message("tool", ["ok"]), Message("assistant", ["21C."])]
    r = t.render(msgs, "k", tools=[WEATHER, NOARGS])
    listed = json.dumps(WEATHER["function"], ensure_ascii=False) + ", " + json.dumps(NOARGS)
    assert r.text == (
        "<SPECIAL_10>System\nBe brief.\n\nYou can use the following tools to assist the user if required:\n"
        f"<AVAILABLE_TOOLS>[{listed}]</AVAILABLE_TOOLS>\n\n"
        "If you decide to call any tool(s), use the following format:\n"
        '<TOOLCALL>[{{"name": "tool_name1", "arguments": "tool_args1"}}, {{"name": "tool_name2", "arguments": '
        '"tool_args2"}}]</TOOLCALL>\n\nThe user will execute tool-calls and return responses from tool(s) in this '
        'format:\n<TOOL_RESPONSE>[{{"tool_response1"}}, {{"tool_response2"}}]</TOOL_RESPONSE>\n\nBased on the tool '
        "responses, you can call additional tools if needed, correct tool calls if any errors are found, or just "
        "respond to the user.\n"
        "<SPECIAL_11>User\nWeather?\n"
        '<SPECIAL_11>Assistant\nChecking.\n\n<TOOLCALL>[{"name": "get_weather", "arguments": {"city":"Paris"}}, '
        '{"name": "noargs", "arguments": {}}]</TOOLCALL>\n<SPECIAL_12>\n'
        "<SPECIAL_11>User\n<TOOL_RESPONSE>[{\"temp\": 21}, ok]</TOOL_RESPONSE>\n"
        "<SPECIAL_11>Assistant\n21C.\n<SPECIAL_12>\n")
    assert [r.text[a:b] for a, b in r.spans] == [
        'Checking.\n\n<TOOLCALL>[{"name": "get_weather", "arguments": {"city":"Paris"}}, {"name": "noargs", '
        '"arguments": {}}]</TOOLCALL>\n<SPECIAL_12>\n', "21C.\n<SPECIAL_12>\n"]
    # tools without a system message get a system turn of their own
    r = t.render(msgs[1:], "k", tools=[NOARGS])
    assert r.text.startswith('<SPECIAL_10>System\nYou can use the following tools to assist the user if required:\n'
                             '<AVAILABLE_TOOLS>[{"name": "noargs"}]</AVAILABLE_TOOLS>\n\n')


# -- Hugging Face parity on a template that renders tools -------------------------------------------
WORD = st.sampled_from(["a", "b c", " x", "Paris", "é", "12", "\n", "the"])
TEXT = st.lists(WORD, min_size=1, max_size=4).map("".join)


@st.composite
def tool_conversations(draw):
    msgs = [{"role": "system", "content": draw(TEXT)}] if draw(st.booleans()) else []
    for turn in range(draw(st.integers(1, 3))):
        msgs.append({"role": "user", "content": draw(TEXT)})
        if draw(st.booleans()):
            calls = [{"id": f"c{turn}{k}", "type": "function",
                      "function": {"name": draw(st.sampled_from(["get_weather", "noargs"])),
                                   "arguments": {"city": draw(TEXT)} if draw(st.booleans()) else {}}}
                     for k in range(draw(st.integers(1, 2)))]
            msgs.append({"role": "assistant", "content": draw(st.sampled_from(["", "Checking."])), "tool_calls": calls})
            msgs += [{"role": "tool", "tool_call_id": c["id"], "content": draw(TEXT)} for c in calls]
        msgs.append({"role": "assistant", "content": draw(TEXT.filter(str.strip))})
    tools = draw(st.sampled_from([[], [WEATHER, NOARGS], [NOARGS, WEATHER]]))   # every called tool defined
    return msgs, tools


@pytest.fixture(scope="module")
def tool_tokenizer_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tooltok") / "tok"
    shutil.copytree(DEMO_TOKENIZER, folder)
    for name in ("chat_template.jinja", "chat_template.json"):
        (folder / name).unlink(missing_ok=True)
    (folder / "chat_template.jinja").write_text(TOOL_TEMPLATE)
    return folder


#: a ChatML template with no tools branch: it renders role and content only
PLAIN_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                  "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_what_a_template_does_not_render_is_an_error(tmp_path):
    """The new user's case: ``prompt_format: tokenizer`` with a template that has no tools branch
    dropped the tools and the calls and trained the call-only turn as an empty one. Each thing the
    template leaves out is named (``template_drops``); a conversation it renders whole passes."""
    folder = tmp_path / "tok"
    shutil.copytree(DEMO_TOKENIZER, folder)
    for name in ("chat_template.jinja", "chat_template.json"):
        (folder / name).unlink(missing_ok=True)
    (folder / "chat_template.jinja").write_text(PLAIN_TEMPLATE)
    t = ConversationTokenizer(folder, "tokenizer")
    msgs = [Message("user", ["Weather?"]), Message("assistant", [""], tool_calls=[ToolCall("get_weather", {}, "c1")]),
            Message("tool", ['{"temp": 21}'], tool_call_id="c1"), Message("assistant", ["21C."], reasoning="hot")]
    with pytest.raises(DataError) as err:
        t.encode([msgs], "k", tools=[WEATHER])
    assert err.value.code == "template_drops" and str(err.value).startswith(
        "k: the tokenizer's chat template does not render the tool definitions (get_weather); the tool calls of "
        "message 1; the reasoning of message 3: it would be lost")
    [(tokens, trained)] = t.encode([[Message("user", ["q"]), Message("assistant", ["a"])]], "k")
    assert trained.any()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(case=tool_conversations())
def test_tool_masks_equal_hugging_face(case, tool_tokenizer_dir):
    """Cooked by ``openai_messages`` and tokenized with the tokenizer's template: tokens and trained
    flags equal ``apply_chat_template(..., tools=..., return_assistant_tokens_mask=True)``."""
    from transformers import AutoTokenizer

    msgs, tools = case
    hf = AutoTokenizer.from_pretrained(str(tool_tokenizer_dir))
    want = hf.apply_chat_template(msgs, tools=tools or None, tokenize=True, return_assistant_tokens_mask=True,
                                  return_dict=True)
    row = {"messages": [{**m, "tool_calls": [{**c, "function": {**c["function"],
                                                                "arguments": json.dumps(c["function"]["arguments"])}}
                                             for c in m["tool_calls"]]} if "tool_calls" in m else m for m in msgs]}
    if tools:
        row["tools"] = tools
    conv = cook_openai_messages(crude(row))      # arguments as JSON strings, as OpenAI data holds them
    assert TokenizerTemplateFormat.as_dicts(conv.messages) == [{**m, "content": m["content"]} for m in msgs]
    [(tokens, trained)] = ConversationTokenizer(hf, "tokenizer").encode([conv.messages], "k", tools=conv.tools)
    assert tokens.tolist() == list(want["input_ids"])
    assert trained.astype(int).tolist() == list(want["assistant_masks"])


def _call(name, call_id):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}


@pytest.mark.parametrize("row, message", [
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [_call(
        "get_weather", "c1")]}, {"role": "tool", "tool_call_id": "c9", "content": "21"},
        {"role": "assistant", "content": "ok"}]},
     r"message 2 is the result of tool call 'c9', which no earlier assistant message made"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [_call(
        "search", "c1")]}, {"role": "tool", "tool_call_id": "c1", "content": "r"}, {"role": "assistant", "content": "ok"}],
      "tools": [WEATHER]}, r"message 1 calls tool 'search', which the row's tools do not define \(get_weather\)"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "ok"}],
      "tools": [{"type": "function", "function": {"name": "f", "parameters": "a string"}}]},
     r"tools\[0\] \(f\): 'parameters' must be a JSON schema object"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "ok"}],
      "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
     r"tools\[0\] \(f\): 'parameters' must be a JSON schema object"),
], ids=["unanswered_result", "undefined_tool", "schema_not_object", "schema_wrong_type"])
def test_mis_paired_tool_data_is_refused(row, message):
    """What a model would learn wrong (a result of no call, a call of an undefined tool, a tools
    schema that is not one) is refused naming the sample, not trained on."""
    with pytest.raises(DataError, match=r"^parts/data-0\.tar:000003: " + message):
        cook_openai_messages(crude(row))


def test_weight_zero_turns_are_not_trained(tool_tokenizer_dir):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(tool_tokenizer_dir))
    msgs = [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "bad answer", "weight": 0},
            {"role": "user", "content": "q2"}, {"role": "assistant", "content": "good answer", "weight": 1}]
    for fmt, want in (("tokenizer", ["good answer<|im_end|>\n"]), ("nemotron6", ["good answer<|im_end|>"])):
        conv = cook_openai_messages(crude({"messages": msgs}))
        t = ConversationTokenizer(hf, fmt)
        [(tokens, trained)] = t.encode([conv.messages], "k")
        runs = [hf.decode(tokens[a:b]) for a, b in _runs(trained)]
        assert runs == want, fmt


def _runs(flags):
    out, start = [], None
    for i, on in enumerate(list(flags) + [False]):
        if on and start is None:
            start = i
        elif not on and start is not None:
            out.append((start, i))
            start = None
    return out


# -- end to end: JSONL and WebDataset shards → PackedBatch ----------------------------------------------
@pytest.fixture(scope="module")
def media_files():
    return {"png": make_image(96, 64, seed=1, fmt="PNG"), "jpg": make_image(80, 112, seed=2),
            "wav": make_audio(1.0, 16000, 1, seed=3), "mp4": make_video(128, 72, seconds=1.0, fps=8, seed=4)}


def rows(media_files, ref) -> list[dict]:
    """Five rows, every content part shape; ``ref(name)`` names a file (a path or a member)."""
    tool_turns = [
        {"role": "user", "content": [{"type": "audio", "path": ref("wav")}, {"type": "text", "text": "What city?"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
        {"role": "assistant", "content": "bad guess", "weight": 0},
        {"role": "user", "content": "Again?"},
        {"role": "assistant", "content": "It is 21C.", "weight": 1}]
    return [
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "Describe "},
                                                   {"type": "image_url", "image_url": {"url": ref("png")}}]},
                      {"role": "assistant", "content": "A pattern."}]},
        {"messages": [{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": b64(media_files["wav"]), "format": "wav"}},
            {"type": "input_text", "text": "Transcribe."}]}, {"role": "assistant", "content": "Tones."}]},
        {"messages": [{"role": "user", "content": [
            {"type": "video", "path": ref("mp4")}, {"type": "text", "text": "and"},
            {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64," + b64(media_files["jpg"])}}]},
            {"role": "assistant", "content": "A video and a photo."}]},
        {"messages": tool_turns, "tools": [WEATHER]},
        {"messages": [{"role": "user", "content": [{"type": "input_image", "image_url": ref("jpg")},
                                                   {"type": "text", "text": "Colour?"}]},
                      {"role": "assistant", "content": "Grey."}]},
    ]


MEDIA_KINDS = [["image"], ["audio"], ["video", "image"], ["audio"], ["image"]]


def check_epoch(cfg, keys, tokenizer) -> None:
    seen = {}
    for batch in build_train_loader(cfg, repeat=False):
        batch.validate()
        [[key]] = batch.sample_keys
        seen[key] = ([s.kind for s in batch.media_spans[0]], trained_texts(batch, tokenizer))
    assert sorted(seen) == sorted(keys)
    by_index = [seen[k] for k in keys]
    assert [kinds for kinds, _ in by_index] == MEDIA_KINDS
    texts = by_index[3][1]
    assert texts[0].startswith("\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>")
    assert texts[1:] == ["It is 21C.<|im_end|>"]          # the weight-0 turn is not trained
    assert by_index[0][1] == ["A pattern.<|im_end|>"]


@pytest.mark.parametrize("workers", [0, 2])
def test_jsonl_rows_flow_to_packed_batches(tmp_path, media_files, demo_tokenizer, workers):
    for ext, data in media_files.items():
        (tmp_path / "media").mkdir(exist_ok=True)
        (tmp_path / "media" / f"f.{ext}").write_bytes(data)
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows(media_files, lambda ext: f"media/f.{ext}")))
    energon("prepare", str(path))
    cfg = loader_yaml(tmp_path / "l.yaml", {"path": str(path)}, seq_length=2048, prompt_format="nemotron6",
                      workers=workers, extra_options=SMALL_MEDIA, default_cooker="openai_messages")
    check_epoch(cfg, [f"rows.jsonl:{i + 1}" for i in range(5)], demo_tokenizer)


@pytest.mark.parametrize("workers", [0, 2])
def test_webdataset_shards_flow_to_packed_batches(tmp_path, media_files, demo_tokenizer, workers):
    samples, keys = [], []
    for i, row in enumerate(rows(media_files, lambda ext: f"0.{ext}")):
        used = {ext for ext in media_files if f'"0.{ext}"' in json.dumps(row)}
        members = {f"0.{ext}": media_files[ext] for ext in used}
        keys.append(f"s{i}")
        samples.append((f"s{i}", {"json": json.dumps(row).encode(), **members}))
    folder = prepare(write_shards(tmp_path / "ds", samples, per_shard=3), {"cooker": "openai_messages"})
    cfg = loader_yaml(tmp_path / "l.yaml", {"path": str(folder)}, seq_length=2048, prompt_format="nemotron6",
                      workers=workers, extra_options=SMALL_MEDIA)
    check_epoch(cfg, shown_keys(folder, keys, 3), demo_tokenizer)


def test_a_member_referenced_twice_or_never_is_an_error():
    png = make_image(32, 32, fmt="PNG")
    twice = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "0.png"}}] * 2},
                          {"role": "assistant", "content": "x"}]}
    with pytest.raises(DataError, match=r"references member '0.png' a second time"):
        cook_openai_messages({**crude(twice), "0.png": png})
    never = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "x"}]}
    with pytest.raises(DataError, match=r"media members \['0.png'\] are never referenced"):
        cook_openai_messages({**crude(never), "0.png": png})


# -- errors ------------------------------------------------------------------------------------------
def _user(*parts):
    return {"messages": [{"role": "user", "content": list(parts)}, {"role": "assistant", "content": "a"}]}


@pytest.mark.parametrize("obj, reason, code", [
    (_user({"type": "image_url", "image_url": {"url": "https://example.com/x.png"}}),
     r"message 0 content part 0: remote image 'https://example.com/x.png' is not fetched", "missing_media"),
    (_user({"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}),
     r"message 0 content part 0 is not valid base64", "corrupt_media"),
    (_user({"type": "image_url", "image_url": {"url": "data:text/plain,hello"}}),
     r"only base64 data URLs are supported", "corrupt_media"),
    (_user({"type": "image_url", "image_url": {"url": "data:audio/wav;base64,AAAA"}}),
     r"a data URL of type 'audio/wav' given as image", "corrupt_media"),
    (_user({"type": "input_audio", "input_audio": {"format": "wav"}}),
     r"input_audio.data must be a non-empty base64 string", "invalid_sample"),
    (_user({"type": "input_image", "file_id": "file-1"}), r"needs 'image_url' \(file ids are not supported\)",
     "invalid_sample"),
    (_user({"type": "video"}), r"\(video\) needs 'path'", "invalid_sample"),
    ({"messages": [{"role": "user", "content": "q", "weight": 1}, {"role": "assistant", "content": "a"}]},
     r"message 0 \(user\) has a weight; weights apply to assistant messages only", "invalid_sample"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "weight": 0.5}]},
     r"message 1 weight must be 0 or 1, got 0.5", "invalid_sample"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "weight": True}]},
     r"message 1 weight must be 0 or 1, got True", "invalid_sample"),
    ({"messages": [{"role": "user", "content": "q", "tool_calls": [{"function": {"name": "f"}}]},
                   {"role": "assistant", "content": "a"}]}, r"message 0 \(user\) has tool_calls", "invalid_sample"),
    ({"messages": [{"role": "user", "content": "q"},
                   {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}]},
     r"message 1 tool_calls\[0\] function.arguments must be a JSON object, got list", "invalid_sample"),
    ({"messages": [{"role": "user", "content": "q"},
                   {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{bad"}}]}]},
     r"tool_calls\[0\] function.arguments", "invalid_json"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [{"type": "x"}]}]},
     r"tool_calls\[0\] has type 'x'; only function calls", "invalid_sample"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": None}]},
     r"message 1 is an empty assistant turn", "empty_assistant"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "tools": [{"x": 1}]},
     r"tools\[0\] must be a function definition with a 'name'", "invalid_sample"),
])
def test_bad_rows_name_the_key_and_reason(obj, reason, code):
    with pytest.raises(DataError, match=rf"^parts/data-0\.tar:000003: .*{reason}") as e:
        cook_openai_messages(crude(obj))
    assert e.value.code == code


def test_a_tool_call_only_turn_is_not_empty():
    conv = cook_openai_messages(crude({"messages": [
        {"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "f", "arguments": ""}}]}]}))
    assert conv.messages[1].tool_calls == [ToolCall("f", {}, "1", "")]


# -- hidden fields pass the reserved-tag check --------------------------------------------------------------
@pytest.mark.parametrize("row, where", [
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [
        {"function": {"name": "f", "arguments": '{"q": "look at <image>"}'}}]}]},
     r"message 1 \(assistant\) contains the reserved media tag <image> in its tool_calls\[0\].arguments.q"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [
        {"function": {"name": "f", "arguments": {"<so_start>": 1}}}]}]},
     r"message 1 \(assistant\) contains the reserved media tag <so_start> in its tool_calls\[0\].arguments.<so_start>"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                   {"role": "tool", "content": "result <img> here"}, {"role": "assistant", "content": "b"}]},
     r"message 2 \(tool\) contains the reserved media tag <img> in its text"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
      "tools": [{"type": "function", "function": {"name": "f", "description": "returns <image>"}}]},
     r"tools\[0\] contains the reserved media tag <image> in its .function.description"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning_content": "<so_end>"}]},
     r"message 1 \(assistant\) contains the reserved media tag <so_end> in its reasoning_content"),
])
@pytest.mark.parametrize("fmt", ["nemotron6", "nemotron-h", "tokenizer"])
def test_hidden_fields_are_checked_for_reserved_tags(row, where, fmt):
    conv = cook_openai_messages(crude(row))
    t = ConversationTokenizer(DEMO_TOKENIZER, fmt)
    with pytest.raises(DataError, match=rf"^k: {where}") as e:
        t.encode([conv.messages], "k", tools=conv.tools)
    assert e.value.code == "reserved_tag"


def test_preformatted_rows_with_tool_calls_are_an_error():
    conv = cook_openai_messages(crude({"messages": [{"role": "user", "content": "q"}, {
        "role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}]}))
    with pytest.raises(DataError, match=r"^k: has tool calls or tool definitions, but skip_chat_template is set"):
        ConversationTokenizer(DEMO_TOKENIZER, "nemotron6").encode([conv.messages], "k", preformatted=True)


def test_remote_urls_are_never_fetched_whatever_the_scheme():
    """A name with a scheme is not a path: ``s3://b/x.png`` is refused, not looked up on disk."""
    with pytest.raises(DataError, match=r"remote image 's3://b/x.png' is not fetched") as e:
        cook_openai_messages(crude(_user({"type": "image_url", "image_url": "s3://b/x.png"})))
    assert e.value.code == "missing_media"
