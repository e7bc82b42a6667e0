"""Conversation cookers. Each reads the sample's JSON object and returns a ``Conversation``.

| name | schema |
|---|---|
| ``nemotron_conversation`` | ``{"conversation": [{"sender": ..., "fragments": [str or {"t": "text"/"image"/"video"/"audio", "value": ..., "metadata": {...}}]}]}`` |
| ``general_conversations`` | LLaVA style ``{"conversations": [{"from": "system"/"human"/"gpt", "value": ...}]}`` with ``<image>``/``<video>``/``<audio>`` tags |
| ``openai_messages``, ``openai_messages_offline_packed`` | OpenAI chat rows (``cookers.openai_messages``) |

Media: a fragment's ``value`` names a member of the WebDataset sample (e.g. ``"0.jpg"``) or a path
(found in the dataset folder, the media roots or the dataset's aux source: ``cookers.media``); ``general_conversations`` tags take the sample's media members of
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
CONVERSATION_SUBFLAVORS = {"train_only_on_last_assistant_turn": bool, "tool_response_as_turn_boundary": bool}


def role_of(value, where: str, i: int) -> str:
    """The canonical role (``ROLE_ALIASES``) of turn ``i``; unknown is ``unknown_role``."""
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


def make_conversation(sample: dict, messages: list[Message], segments: list[int], where: str,
                      media: list | None = None, tools: list | None = None,
                      format_last_only: bool = False) -> Conversation:
    """The cooked sample: each segment checked (``check_messages``) and, with the subflavor
    ``train_only_on_last_assistant_turn``, trained on its last assistant turn only. That is left to
    the prompt format instead (``Conversation.last_only``; NeMo-RL's formats have their own rule)
    with ``format_last_only`` (the NeMo-RL-named cookers) or with ``tool_response_as_turn_boundary``
    (the format reads both)."""
    bounds = segments + [len(messages)]
    last_only = subflavor_flag(sample, "train_only_on_last_assistant_turn", where)
    boundary = subflavor_flag(sample, "tool_response_as_turn_boundary", where)
    to_format = format_last_only or boundary
    for a, b in zip(bounds, bounds[1:]):
        check_messages(messages[a:b], where)
        if last_only and not to_format:
            apply_last_turn_only(messages[a:b])
    return Conversation(**basic_sample_keys(sample), messages=messages, media=list(media or []),
                        segments=segments, preformatted=subflavor_flag(sample, "skip_chat_template", where),
                        tools=list(tools or []), last_only=last_only and to_format, tool_boundary=boundary)


@register("nemotron_conversation", {**CONVERSATION_SUBFLAVORS, "cook": str})   # NeMo-RL's blends select it by cook
@stateless
def cook_nemotron_conversation(sample: dict, **aux) -> Conversation:
    """``{"conversation": [{"sender", "fragments": [str | {"t", "value", "metadata"}]}]}``."""
    where = sample_where(sample)
    turns = field_list(payload(sample, where), "conversation", where)
    messages, media, members_used = [], [], []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise DataError(where, f"turn {i} must be an object with 'sender' and 'fragments'")
        role = role_of(turn.get("sender"), where, i)
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
                extra = sorted(set(frag) - {"t", "value", "metadata"})
                if extra:      # e.g. NeMo-RL's clip timing (start_time, end_time): not read, so not dropped
                    raise DataError(where, f"turn {i} fragment {j}: keys {extra} are not read by this cooker (a "
                                           f"{frag['t']} fragment has 't', 'value', 'metadata'); clip timing is not "
                                           "supported: cut the clip, or drop the keys")
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
        if "loss" in turn:
            raise DataError(where, f"turn {i} has an explicit 'loss' field, which this cooker does not read (NeMo-RL "
                                   "refuses it too); per-turn loss: nemotron_general_conversations_jsonl_explicit_loss_v1")
        messages.append(Message(role, merge_text(parts)))
    check_members_used(sample, members_used, where)
    return make_conversation(sample, messages, [0], where, media)


def check_members_used(sample: dict, used: list[str], where: str) -> None:
    """Every media member of a WebDataset sample must be referenced (``media_reference``)."""
    unused = [r.name for m in MODALITIES for r in member_media(sample, m) if r.name not in used]
    if unused:
        raise DataError(where, f"media members {unused} are never referenced: every media item must be referenced once",
                        "media_reference")


def merge_text(parts: list) -> list:
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
        role = role_of(turn.get("from"), where, i)
        text = text_of(turn.get("value"), where, f"turn {i} value")
        messages.append(Message(role, _tagged_parts(text, queue)))
    return make_conversation(sample, messages, [0], where, queue.finish())
