"""NeMo-RL's ``generic_conversation`` cooker (its default): canonical messages plus a media manifest.

A sample's JSON (the ``json`` member, or the JSONL line) is ``{"messages": [...], "media": [...]?,
"tools": [...]?}``:

- a message has ``role`` (``system``, ``user``, ``assistant``, ``tool``), ``content`` (a string or a
  list of ``{"type": "text", "text": str}`` and ``{"type": "image"|"video"|"audio", "media_index": i}``
  parts), optionally ``train_on_message`` (bool: its train flag), ``tool_calls`` (OpenAI form) and
  ``tool_call_id``;
- ``media`` lists the items: a member name (``"0.jpg"``; its kind from the extension) or
  ``{"member": NAME, "type"?: KIND, "metadata"?: {...}}`` or ``{"value": PATH, "type": KIND}`` (a path,
  found as ``cookers.media`` finds paths). A member is found as named, by its file name, by its
  extension, or without the sample key in front.

Every item is referenced by exactly one ``media_index`` part (NeMo-RL passes unreferenced items on
to the encoder, which fails later or drops them; here it is a ``media_reference`` error).
"""

from __future__ import annotations

import posixpath
from typing import Any, Optional

from megatron.energon import stateless

from energon_nemotron.cookers.base import field_list, payload, register, sample_where, text_of
from energon_nemotron.cookers.conversations import CONVERSATION_SUBFLAVORS, make_conversation
from energon_nemotron.cookers.media import media_ref, modality_of, path_media
from energon_nemotron.cookers.openai_messages import tool_calls_of, tools_of
from energon_nemotron.errors import DataError
from energon_nemotron.types import MODALITIES, Conversation, MediaPart, MediaRef, Message

ROLES = ("system", "user", "assistant", "tool")
SCHEMA = ('{"messages": [{"role", "content": str | [{"type": "text", "text"} | {"type": "image"|"video"|"audio", '
          '"media_index": i}], "train_on_message"?}], "media"?: [MEMBER | {"member"|"value", "type"?, "metadata"?}], '
          '"tools"?} (NeMo-RL\'s canonical sample)')


def _member(sample: dict, name: str, where: str) -> str:
    key = str(sample.get("__key__", ""))
    base = posixpath.basename(name)
    for candidate in (name, base, base.rsplit(".", 1)[-1], name[len(key) + 1:] if name.startswith(key + ".") else ""):
        if candidate and candidate in sample and not candidate.startswith("__"):
            return candidate
    members = sorted(k for k in sample if not k.startswith("__"))
    raise DataError(where, f"media member {name!r} is not in the sample (members: {members})", "missing_media")


def manifest_item(sample: dict, entry: Any, where: str, i: int) -> MediaRef:
    """One entry of the ``media`` manifest as a ``MediaRef``."""
    entry = {"member": entry} if isinstance(entry, str) else entry
    if not isinstance(entry, dict):
        raise DataError(where, f"media entry {i} must be a member name or an object, got {type(entry).__name__}")
    kind: Optional[str] = entry.get("type")
    if "value" in entry:
        if kind not in MODALITIES:
            raise DataError(where, f"media entry {i} needs 'type' (one of {', '.join(MODALITIES)}), got {kind!r}")
        ref = path_media(sample, text_of(entry["value"], where, f"media entry {i} value"), kind, where)
        return media_ref(sample, ref.name, kind, where, entry.get("metadata")) if entry.get("metadata") else ref
    member = _member(sample, text_of(entry.get("member"), where, f"media entry {i} member"), where)
    kind = kind or modality_of(member)
    if kind not in MODALITIES:
        raise DataError(where, f"media entry {i} ({member!r}): unknown kind {kind!r}; set 'type' to one of "
                               f"{', '.join(MODALITIES)}", "unsupported_media")
    return media_ref(sample, member, kind, where, entry.get("metadata"))


def canonical_messages(obj: dict, items: list[MediaRef], where: str) -> tuple[list[Message], list[MediaRef]]:
    """The messages and the media in reference order (each manifest item referenced once)."""
    messages, order = [], []
    for i, m in enumerate(field_list(obj, "messages", where)):
        what = f"message {i}"
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise DataError(where, f"{what} must be an object with a role of {', '.join(ROLES)}", "unknown_role")
        content = m.get("content")
        parts: list = []
        for j, part in enumerate(content if isinstance(content, list) else [text_of(content or "", where, what)]):
            if isinstance(part, str) or (isinstance(part, dict) and part.get("type") == "text"):
                parts.append(part if isinstance(part, str) else text_of(part.get("text"), where, f"{what} part {j}"))
                continue
            index = part.get("media_index") if isinstance(part, dict) else None
            if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(items):
                raise DataError(where, f"{what} part {j} must be text or {{'type', 'media_index'}} naming one of the "
                                       f"{len(items)} media entries, got {part!r:.80}", "media_reference")
            if index in order or part.get("type") != items[index].modality:
                raise DataError(where, f"{what} part {j}: media entry {index} referenced twice or as another kind "
                                       f"({part.get('type')!r}, the entry is {items[index].modality})", "media_reference")
            order.append(index)
            parts.append(MediaPart(items[index].modality, len(order) - 1))
        train = m.get("train_on_message")
        if train is not None and not isinstance(train, bool):
            raise DataError(where, f"{what} train_on_message must be true or false, got {train!r}")
        messages.append(Message(m["role"], parts or [""], train=train, tool_calls=tool_calls_of(m.get("tool_calls"), where, what),
                                tool_call_id=m.get("tool_call_id")))
    if len(order) != len(items):
        missing = sorted(set(range(len(items))) - set(order))
        raise DataError(where, f"media entries {missing} are never referenced: every item must be referenced once",
                        "media_reference")
    return messages, [items[k] for k in order]


@register("generic_conversation", CONVERSATION_SUBFLAVORS, schema=SCHEMA)
@stateless
def cook_generic_conversation(sample: dict, **aux) -> Conversation:
    """NeMo-RL's ``generic_conversation`` (see the module docstring)."""
    where = sample_where(sample)
    obj = payload(sample, where)
    manifest = obj.get("media") or []
    if not isinstance(manifest, list):
        raise DataError(where, f"'media' must be a list, got {type(manifest).__name__}")
    items = [manifest_item(sample, e, where, i) for i, e in enumerate(manifest)]
    messages, media = canonical_messages(obj, items, where)
    return make_conversation(sample, messages, [0], where, media, tools_of(obj, where))
