"""Conversation cookers. Each reads the sample's JSON object and returns a ``Conversation``.

| name | schema |
|---|---|
| ``nemotron_conversation`` | ``{"conversation": [{"sender": ..., "fragments": [str or {"t": "text"/"image"/"video"/"audio", "value": ..., "metadata": {...}}]}]}`` |
| ``general_conversations`` | LLaVA style ``{"conversations": [{"from": "system"/"human"/"gpt", "value": ...}]}`` with ``<image>``/``<video>``/``<audio>`` tags |
| ``openai_messages`` | ``{"messages": [{"role": ..., "content": str or [{"type": "text", "text": ...}]}]}`` (text) |
| ``openai_messages_offline_packed`` | as ``openai_messages``; a new conversation at each ``system`` message |

Media: a fragment's ``value`` names a member of the WebDataset sample (e.g. ``"0.jpg"``) or a path
relative to the dataset folder; ``general_conversations`` tags take the sample's media members of
that kind in name order (WebDataset) or the paths of the JSON fields ``image(s)``, ``video(s)``,
``audio(s)``/``sound`` (JSONL), in order. Every media item is referenced exactly once, in order.
Subflavors read by these cookers (``CONVERSATION_SUBFLAVORS``, checked at start): ``cooker``,
``skip_chat_template`` (texts are already rendered) and ``train_only_on_last_assistant_turn``.
"""

from __future__ import annotations

import re

from megatron.energon import basic_sample_keys, stateless

from energon_nemotron.cookers.base import (
    apply_last_turn_only,
    check_messages,
    field_list,
    payload,
    register,
    sample_where,
    subflavor_flag,
    text_of,
)
from energon_nemotron.cookers.media import MediaQueue, field_paths, media_ref, member_media, path_media
from energon_nemotron.errors import DataError
from energon_nemotron.types import MODALITIES, Conversation, MediaPart, Message

ROLE_ALIASES = {
    "system": "system", "user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant",
    "model": "assistant", "tool": "tool", "function": "tool", "observation": "tool",
}
MEDIA_TAG_RE = re.compile(r"<(image|video|audio)>")
#: subflavor keys these cookers read beyond ``cooker`` and ``skip_chat_template``
CONVERSATION_SUBFLAVORS = {"train_only_on_last_assistant_turn": bool}


def _role(value, where: str, i: int) -> str:
    role = ROLE_ALIASES.get(value) if isinstance(value, str) else None
    if role is None:
        raise DataError(where, f"turn {i} has unknown role {value!r} (known: {', '.join(sorted(ROLE_ALIASES))})",
                        "unknown_role")
    return role


def _tagged_parts(text: str, queue: MediaQueue) -> list:
    """Text with ``<image>``/``<video>``/``<audio>`` tags → text and ``MediaPart``s, in order."""
    parts: list = []
    at = 0
    for m in MEDIA_TAG_RE.finditer(text):
        if m.start() > at:
            parts.append(text[at:m.start()])
        parts.append(queue.take(m.group(1)))
        at = m.end()
    if at < len(text) or not parts:
        parts.append(text[at:])
    return parts


def _conversation(sample: dict, messages: list[Message], segments: list[int], where: str,
                  media: list | None = None) -> Conversation:
    bounds = segments + [len(messages)]
    for a, b in zip(bounds, bounds[1:]):
        check_messages(messages[a:b], where)
        if subflavor_flag(sample, "train_only_on_last_assistant_turn", where):
            apply_last_turn_only(messages[a:b])
    return Conversation(**basic_sample_keys(sample), messages=messages, media=list(media or []),
                        segments=segments, preformatted=subflavor_flag(sample, "skip_chat_template", where))


@register("nemotron_conversation", CONVERSATION_SUBFLAVORS)
@stateless
def cook_nemotron_conversation(sample: dict, **aux) -> Conversation:
    """``{"conversation": [{"sender", "fragments": [str | {"t", "value", "metadata"}]}]}``."""
    where = sample_where(sample)
    turns = field_list(payload(sample, where), "conversation", where)
    messages, media, members_used = [], [], []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise DataError(where, f"turn {i} must be an object with 'sender' and 'fragments'")
        role = _role(turn.get("sender"), where, i)
        fragments = turn.get("fragments")
        if isinstance(fragments, str):
            fragments = [fragments]
        if not isinstance(fragments, list):
            raise DataError(where, f"turn {i} 'fragments' must be a list, got {type(fragments).__name__}")
        parts = []
        for j, frag in enumerate(fragments):
            if isinstance(frag, str):
                parts.append(frag)
            elif isinstance(frag, dict) and frag.get("t") == "text":
                parts.append(text_of(frag.get("value"), where, f"turn {i} fragment {j} value"))
            elif isinstance(frag, dict) and frag.get("t") in MODALITIES:
                ref = media_ref(sample, frag.get("value"), frag["t"], where, frag.get("metadata"))
                if ref.name in members_used and ref.name in sample:
                    raise DataError(where, f"turn {i} fragment {j} references member {ref.name!r} a second time",
                                    "media_reference")
                members_used.append(ref.name)
                media.append(ref)
                parts.append(MediaPart(frag["t"], len(media) - 1))
            else:
                raise DataError(where, f"turn {i} fragment {j} must be a string or {{'t': 'text'|'image'|'video'|"
                                       f"'audio', 'value': ...}}, got {frag!r:.80}")
        messages.append(Message(role, _merge_text(parts)))
    unused = [r.name for m in ("image", "video", "audio") for r in member_media(sample, m) if r.name not in members_used]
    if unused:
        raise DataError(where, f"media members {unused} are never referenced: every media item must be referenced once",
                        "media_reference")
    return _conversation(sample, messages, [0], where, media)


def _merge_text(parts: list) -> list:
    """Adjacent text parts joined."""
    out: list = []
    for p in parts:
        if isinstance(p, str) and out and isinstance(out[-1], str):
            out[-1] += p
        else:
            out.append(p)
    return out or [""]


@register("general_conversations", CONVERSATION_SUBFLAVORS)
@stateless
def cook_general_conversations(sample: dict, **aux) -> Conversation:
    """LLaVA style ``{"conversations": [{"from", "value"}]}``."""
    where = sample_where(sample)
    obj = payload(sample, where)
    turns = field_list(obj, "conversations", where)
    queue = MediaQueue(where, {m: member_media(sample, m) + [path_media(sample, p, m, where)
                                                             for p in field_paths(obj, m, where)]
                               for m in MODALITIES})
    messages = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise DataError(where, f"turn {i} must be an object with 'from' and 'value'")
        role = _role(turn.get("from"), where, i)
        text = text_of(turn.get("value"), where, f"turn {i} value")
        messages.append(Message(role, _tagged_parts(text, queue)))
    return _conversation(sample, messages, [0], where, queue.finish())


def _openai_messages(sample: dict, where: str) -> list[Message]:
    messages = []
    for i, m in enumerate(field_list(payload(sample, where), "messages", where)):
        if not isinstance(m, dict):
            raise DataError(where, f"message {i} must be an object with 'role' and 'content'")
        role = _role(m.get("role"), where, i)
        content = m.get("content")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text":
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    raise DataError(where, f"message {i} content part {j} has type {kind!r}; this version's "
                                           "encoder handles text parts only")
                texts.append(text_of(part.get("text"), where, f"message {i} content part {j} text"))
            content = "".join(texts)
        text = text_of(content, where, f"message {i} content")
        reasoning = m.get("reasoning_content", m.get("reasoning"))
        if reasoning is not None:
            reasoning = text_of(reasoning, where, f"message {i} reasoning")
        messages.append(Message(role, [text], reasoning=reasoning))
    return messages


@register("openai_messages", CONVERSATION_SUBFLAVORS)
@stateless
def cook_openai_messages(sample: dict, **aux) -> Conversation:
    """``{"messages": [{"role", "content": str | [{"type": "text", "text"}]}]}``."""
    where = sample_where(sample)
    return _conversation(sample, _openai_messages(sample, where), [0], where)


@register("openai_messages_offline_packed", CONVERSATION_SUBFLAVORS)
@stateless
def cook_openai_messages_offline_packed(sample: dict, **aux) -> Conversation:
    """Several ``openai_messages`` conversations in one row, a new one at each ``system`` message
    (the messages before the first system message form the first). They stay separate sources."""
    where = sample_where(sample)
    messages = _openai_messages(sample, where)
    segments = [0] + [i for i, m in enumerate(messages) if m.role == "system" and i > 0]
    return _conversation(sample, messages, segments, where)
