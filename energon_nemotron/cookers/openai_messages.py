"""The ``openai_messages`` cookers: OpenAI chat / fine-tuning rows → ``Conversation``.

A row is ``{"messages": [...], "tools": [...]?}``. A message has ``role`` (``system``, ``user``,
``assistant``, ``tool``; the aliases of ``ROLE_ALIASES``) and ``content``: a string, ``null``
(an assistant turn that only calls tools) or a list of parts, in any order:

- ``{"type": "text" | "input_text" | "output_text" | "refusal", "text" (or "refusal"): str}``
- ``{"type": "image_url", "image_url": {"url": U}}`` and ``{"type": "input_image", "image_url": U}``
  (``U`` a string or ``{"url": U}``)
- ``{"type": "input_audio", "input_audio": {"data": BASE64, "format": "wav" | "mp3" | ...}}``
- ``{"type": "image" | "video" | "audio", "path" | "url" | "image"/"video"/"audio": U}``

``U`` is a ``data:MIME;base64,...`` URL (the bytes are the item), a member of the WebDataset sample
(``"0.jpg"``), a path (resolved as ``cookers.media`` resolves paths), or ``file://PATH``; a remote URL
(``http://``, ``https://``, ...) is an error, nothing is downloaded. Text parts are joined as they are.

Assistant turns may carry ``reasoning_content`` (or ``reasoning``), ``tool_calls``
(``[{"id", "type": "function", "function": {"name", "arguments": JSON string or object}}]``;
arguments must be a JSON object) and ``weight`` (0: not trained, 1: trained; OpenAI's fine-tuning
format); ``tool`` messages may carry ``tool_call_id``. The row's ``tools`` (OpenAI function
definitions) go to the prompt format (``apply_chat_template(..., tools=...)`` for the tokenizer's
own template).
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any, Optional

from megatron.energon import stateless

from energon_nemotron.cookers.base import field_list, payload, register, sample_where, text_of
from energon_nemotron.cookers.conversations import (
    CONVERSATION_SUBFLAVORS,
    check_members_used,
    make_conversation,
    merge_text,
    role_of,
)
from energon_nemotron.cookers.media import check_path_length, media_ref
from energon_nemotron.errors import DataError
from energon_nemotron.guards.json_safety import parse_json
from energon_nemotron.types import MODALITIES, Conversation, MediaPart, MediaRef, Message, ToolCall

TEXT_PARTS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal"}
DATA_URL_RE = re.compile(r"data:([\w.+-]+/[\w.+-]+)?((?:;[\w.+-]+=[^;,]*)*);base64,", re.ASCII)
PART_TYPES = (*TEXT_PARTS, "image_url", "input_image", "input_audio", *MODALITIES)
SCHEME_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")

SCHEMA = ('{"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": str | null | [parts], '
          '"reasoning_content"?, "tool_calls"?, "tool_call_id"?, "weight"?: 0|1}], "tools"?: [...]}; parts: '
          '{"type": "text", "text"}, {"type": "image_url", "image_url": {"url": PATH | MEMBER | data:...;base64}}, '
          '{"type": "input_image", "image_url": ...}, {"type": "input_audio", "input_audio": {"data": BASE64, '
          '"format"}}, {"type": "image"|"video"|"audio", "path": ...}')


def _decode_base64(data: Any, where: str, what: str) -> bytes:
    if not isinstance(data, str) or not data:
        raise DataError(where, f"{what} must be a non-empty base64 string, got {type(data).__name__}")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as e:
        raise DataError(where, f"{what} is not valid base64 ({e})", "corrupt_media") from None


def media_item(sample: dict, value: Any, modality: str, where: str, what: str) -> MediaRef:
    """A media item named by a string ``value``: a base64 data URL (its bytes), a member of the sample,
    ``file://PATH`` or a path; a remote URL is ``missing_media`` (nothing is downloaded)."""
    if isinstance(value, dict) and "url" in value:
        value = value["url"]
    if not isinstance(value, str) or not value:
        raise DataError(where, f"{what} must name the {modality} (a path, a sample member or a data URL), "
                               f"got {value!r:.60}")
    if value.startswith("data:"):
        m = DATA_URL_RE.match(value)
        if m is None:
            raise DataError(where, f"{what}: only base64 data URLs are supported (data:MIME;base64,...), got "
                                   f"{value[:40]!r}...", "corrupt_media")
        kind = (m.group(1) or "").split("/")[0]
        if kind not in ("", modality, "application"):
            raise DataError(where, f"{what}: a data URL of type {m.group(1)!r} given as {modality}", "corrupt_media")
        return MediaRef(modality, _decode_base64(value[m.end():], where, what), {}, name=f"{what} (data URL)")
    if value.startswith("file://"):
        value = value[len("file://"):]
    elif SCHEME_RE.match(value):
        check_path_length(value, modality, where)
        raise DataError(where, f"{what}: remote {modality} {value[:80]!r} is not fetched (nothing is downloaded "
                               "while training); store the file with the dataset and name its path", "missing_media")
    return media_ref(sample, value, modality, where)


def _part(sample: dict, part: Any, where: str, what: str) -> Optional[tuple[str, Any]]:
    """("text", str) or (modality, MediaRef) of one content part."""
    if not isinstance(part, dict):
        raise DataError(where, f"{what} must be an object with a 'type', got {type(part).__name__}")
    kind = part.get("type")
    if kind in TEXT_PARTS:
        return "text", text_of(part.get(TEXT_PARTS[kind]), where, f"{what} {TEXT_PARTS[kind]}")
    if kind == "image_url":
        return "image", media_item(sample, part.get("image_url"), "image", where, what)
    if kind == "input_image":
        if "image_url" not in part:
            raise DataError(where, f"{what} (input_image) needs 'image_url' (file ids are not supported)")
        return "image", media_item(sample, part["image_url"], "image", where, what)
    if kind == "input_audio":
        audio = part.get("input_audio")
        if not isinstance(audio, dict):
            raise DataError(where, f"{what} (input_audio) needs 'input_audio': {{'data': BASE64, 'format': ...}}")
        fmt = audio.get("format")
        data = _decode_base64(audio.get("data"), where, f"{what} input_audio.data")
        return "audio", MediaRef("audio", data, {}, name=f"{what} (input_audio {fmt})")
    if kind in MODALITIES:
        key = next((k for k in ("path", "url", kind) if k in part), None)
        if key is None:
            raise DataError(where, f"{what} ({kind}) needs 'path' (or 'url' / {kind!r})")
        return kind, media_item(sample, part[key], kind, where, what)
    raise DataError(where, f"{what} has type {kind!r}; known part types: {', '.join(PART_TYPES)}")


def tool_calls_of(value: Any, where: str, what: str) -> list[ToolCall]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise DataError(where, f"{what} tool_calls must be a list, got {type(value).__name__}")
    calls = []
    for k, call in enumerate(value):
        at = f"{what} tool_calls[{k}]"
        if not isinstance(call, dict):
            raise DataError(where, f"{at} must be an object, got {type(call).__name__}")
        if call.get("type", "function") != "function":
            raise DataError(where, f"{at} has type {call.get('type')!r}; only function calls are supported")
        fn = call.get("function", call)
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise DataError(where, f"{at} needs function.name (a non-empty string)")
        args, raw = fn.get("arguments", {}), None
        if isinstance(args, str):
            raw = args
            args = parse_json(args, where, f"{at} function.arguments") if args.strip() else {}
        if not isinstance(args, dict):
            raise DataError(where, f"{at} function.arguments must be a JSON object, got {type(args).__name__}")
        call_id = call.get("id")
        if call_id is not None and not isinstance(call_id, str):
            raise DataError(where, f"{at} id must be a string, got {type(call_id).__name__}")
        calls.append(ToolCall(fn["name"], args, call_id, raw))
    return calls


def _weight(m: dict, role: str, where: str, what: str) -> Optional[bool]:
    """``train`` of a message from OpenAI's ``weight`` (assistant turns only; 0 or 1)."""
    if "weight" not in m:
        return None
    w = m["weight"]
    if role != "assistant":
        raise DataError(where, f"{what} ({role}) has a weight; weights apply to assistant messages only")
    if isinstance(w, bool) or w not in (0, 1):
        raise DataError(where, f"{what} weight must be 0 or 1, got {w!r}")
    return bool(w)


def tools_of(obj: dict, where: str) -> list[dict]:
    tools = obj.get("tools")
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise DataError(where, f"'tools' must be a list of function definitions, got {type(tools).__name__}")
    for k, tool in enumerate(tools):
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise DataError(where, f"tools[{k}] must be a function definition with a 'name' "
                                   "({'type': 'function', 'function': {'name', 'description', 'parameters'}})")
        params = fn.get("parameters")
        if params is not None and (not isinstance(params, dict) or params.get("type", "object") != "object"):
            raise DataError(where, f"tools[{k}] ({fn['name']}): 'parameters' must be a JSON schema object "
                                   f"({{'type': 'object', 'properties': ...}}), got {params!r:.60}")
    return tools


def check_tool_use(messages: list[Message], tools: list[dict], where: str) -> None:
    """Tool results answer earlier calls (by ``tool_call_id``, when set) and, when the row defines
    ``tools``, every call names one of them: else the row is mis-paired data a model would learn."""
    names = {(t.get("function", t) or {}).get("name") for t in tools}
    ids: set = set()
    for i, m in enumerate(messages):
        for c in m.tool_calls:
            if tools and c.name not in names:
                raise DataError(where, f"message {i} calls tool {c.name!r}, which the row's tools do not define "
                                       f"({', '.join(sorted(map(str, names)))})")
            if c.id is not None:
                ids.add(c.id)
        if m.role == "tool" and m.tool_call_id is not None and m.tool_call_id not in ids:
            raise DataError(where, f"message {i} is the result of tool call {m.tool_call_id!r}, which no earlier "
                                   "assistant message made")


def openai_conversation(sample: dict, where: str) -> tuple[list[Message], list[MediaRef], list[dict]]:
    """(messages, media in reference order, tools) of one OpenAI row."""
    obj = payload(sample, where)
    messages, media, members = [], [], []
    for i, m in enumerate(field_list(obj, "messages", where)):
        what = f"message {i}"
        if not isinstance(m, dict):
            raise DataError(where, f"{what} must be an object with 'role' and 'content'")
        role = role_of(m.get("role"), where, i)
        content = m.get("content")
        if content is None and role == "assistant":
            content = ""
        parts: list = []
        if isinstance(content, list):
            for j, part in enumerate(content):
                kind, value = _part(sample, part, where, f"{what} content part {j}")
                if kind == "text":
                    parts.append(value)
                    continue
                if value.name in sample and value.name in members:
                    raise DataError(where, f"{what} content part {j} references member {value.name!r} a second time",
                                    "media_reference")
                members.append(value.name)
                media.append(value)
                parts.append(MediaPart(kind, len(media) - 1))
        else:
            parts.append(text_of(content, where, f"{what} content"))
        reasoning = m.get("reasoning_content", m.get("reasoning"))
        if reasoning is not None:
            reasoning = text_of(reasoning, where, f"{what} reasoning")
        calls = tool_calls_of(m.get("tool_calls"), where, what)
        if calls and role != "assistant":
            raise DataError(where, f"{what} ({role}) has tool_calls; only assistant messages call tools")
        call_id = m.get("tool_call_id")
        if call_id is not None and not isinstance(call_id, str):
            raise DataError(where, f"{what} tool_call_id must be a string, got {type(call_id).__name__}")
        messages.append(Message(role, merge_text(parts), reasoning=reasoning, train=_weight(m, role, where, what),
                                tool_calls=calls, tool_call_id=call_id))
    check_members_used(sample, members, where)
    tools = tools_of(obj, where)
    check_tool_use(messages, tools, where)
    return messages, media, tools


@register("openai_messages", CONVERSATION_SUBFLAVORS, schema=SCHEMA)
@stateless
def cook_openai_messages(sample: dict, **aux) -> Conversation:
    """An OpenAI chat row (see the module docstring)."""
    where = sample_where(sample)
    messages, media, tools = openai_conversation(sample, where)
    return make_conversation(sample, messages, [0], where, media, tools)


@register("openai_messages_offline_packed", CONVERSATION_SUBFLAVORS,
          schema=SCHEMA + "; several conversations in one row, a new one at each system message")
@stateless
def cook_openai_messages_offline_packed(sample: dict, **aux) -> Conversation:
    """Several ``openai_messages`` conversations in one row, a new one at each ``system`` message
    (the messages before the first system message form the first). They stay separate sources; the
    row's ``tools`` are offered in each."""
    where = sample_where(sample)
    messages, media, tools = openai_conversation(sample, where)
    segments = [0] + [i for i, m in enumerate(messages) if m.role == "system" and i > 0]
    return make_conversation(sample, messages, segments, where, media, tools)
