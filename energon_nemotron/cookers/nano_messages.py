"""NeMo-RL's Nemotron Nano text cookers: OpenAI-style ``messages`` rows normalised to Nano ChatML.

``nemotron_nano_openai_messages_jsonl``: ``{"messages": [{"role", "content"}]}``, text only
(``content`` a string, null, or a list of text parts ``{"type": "text", "text"|"content"|"value"}``
or strings); ``nemotron_nano_openai_messages_offline_packed_jsonl``: several such conversations in
one row, a new one at each ``system`` message (each a separate source of the pack). Roles ``system``,
``user``, ``assistant``, ``tool`` and the aliases ``human``, ``gpt``, ``function``.

The normalisation is NeMo-RL's (after Megatron-LM's Nano cookers), meant for preformatted samples
(``skip_chat_template``): the texts hold Nano ChatML.

- No leading system message: ``EMPTY_SYSTEM_CONTENT`` is put in front (and removed from the first
  message's text if it started with it); a leading system text equal to ``NO_TOOL_SYSTEM_CONTENT`` or
  ``LEGACY_SYSTEM_CONTENT`` becomes ``EMPTY_SYSTEM_CONTENT``.
- Tool messages become user messages; assistant texts are right-stripped and end with one ``\\n``; in
  a user text, ``<|im_end|>\\n<|im_start|>assistant\\n<think></think>\\n`` loses its last newline.
- A user text ending in ``<|im_end|>\\n<|im_start|>assistant\\n<think>\\n`` followed by an assistant
  text starting with ``\\n</think>`` is joined into an empty ``<think></think>`` (the assistant text
  then left-stripped); an assistant text starting with ``\\n`` after a text ending in ``\\n`` is
  left-stripped.

Refused: a ``loss`` field (NeMo-RL refuses it too), media or other part types, a later system message
in the single-conversation cooker.
"""

from __future__ import annotations

from typing import Any

from megatron.energon import stateless

from energon_nemotron.cookers.base import field_list, payload, register, sample_where
from energon_nemotron.cookers.conversations import make_conversation
from energon_nemotron.cookers.nemotron_general import NEMOTRON_SUBFLAVORS
from energon_nemotron.errors import DataError
from energon_nemotron.types import Conversation, Message

NO_TOOL_SYSTEM_CONTENT = ("<|im_start|>system\nYou are a helpful and harmless assistant.\n\n"
                          "You are not allowed to use any tools.<|im_end|>\n")
LEGACY_SYSTEM_CONTENT = "<|im_start|>system\nYou are a helpful and harmless assistant.<|im_end|>\n"
EMPTY_SYSTEM_CONTENT = "<|im_start|>system\n<|im_end|>\n"
ROLES = {"system": "system", "user": "user", "assistant": "assistant", "tool": "tool", "human": "user",
         "gpt": "assistant", "function": "tool"}
EMPTY_THINK = "<|im_end|>\n<|im_start|>assistant\n<think></think>\n"
OPEN_THINK = "<|im_end|>\n<|im_start|>assistant\n<think>\n"
CLOSE_THINK = "\n</think>"
SCHEMA = ('{"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": str | null | [text parts]}]} '
          '(text only; normalised to Nano ChatML, for skip_chat_template)')


def nano_text(content: Any, where: str, what: str) -> str:
    """The text of a Nano message's ``content``."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise DataError(where, f"{what} content must be a string, null or a list of text parts, got "
                               f"{type(content).__name__}")
    out = []
    for j, part in enumerate(content):
        if isinstance(part, str):
            out.append(part)
            continue
        kind = part.get("type", part.get("t")) if isinstance(part, dict) else "?"
        if kind not in (None, "text"):
            raise DataError(where, f"{what} part {j}: the Nano text cookers read text parts only, got {kind!r}",
                            "unsupported_media")
        text = part.get("text") or part.get("content") or part.get("value") or ""
        if not isinstance(text, str):
            raise DataError(where, f"{what} part {j}: text must be a string, got {type(text).__name__}")
        out.append(text)
    return "".join(out)


def read_messages(rows: list, where: str, offset: int = 0) -> list[list[str]]:
    """``[role, text]`` of each raw message (``offset``: the index of the first, for errors)."""
    out = []
    for i, m in enumerate(rows, offset):
        if not isinstance(m, dict):
            raise DataError(where, f"message {i} must be an object with 'role' and 'content'")
        if "loss" in m:
            raise DataError(where, f"message {i} has a 'loss' field: the Nano text cookers take no explicit loss")
        role = ROLES.get(m.get("role")) if isinstance(m.get("role"), str) else None
        if role is None:
            raise DataError(where, f"message {i} has unknown role {m.get('role')!r} (known: {', '.join(ROLES)})",
                            "unknown_role")
        out.append([role, nano_text(m.get("content"), where, f"message {i}")])
    return out


def normalize(messages: list[list[str]]) -> list[list[str]]:
    """NeMo-RL's Nano normalisation of ``[role, text]`` pairs (see the module docstring); a new list.
    Pure string function."""
    ms = [list(m) for m in messages]
    if ms[0][0] != "system":
        if ms[0][1].startswith(EMPTY_SYSTEM_CONTENT):
            ms[0][1] = ms[0][1].replace(EMPTY_SYSTEM_CONTENT, "")
        ms.insert(0, ["system", EMPTY_SYSTEM_CONTENT])
    elif ms[0][1] in (NO_TOOL_SYSTEM_CONTENT, LEGACY_SYSTEM_CONTENT):
        ms[0][1] = EMPTY_SYSTEM_CONTENT
    for m in ms:
        if m[0] == "tool":
            m[0] = "user"
        if m[0] == "user" and EMPTY_THINK in m[1]:
            m[1] = m[1].replace(EMPTY_THINK, EMPTY_THINK[:-1])
        elif m[0] == "assistant":
            m[1] = m[1].rstrip() + "\n"
    for i, m in enumerate(ms):
        if m[0] == "user" and i + 1 < len(ms):
            nxt = ms[i + 1]
            if m[1].endswith(OPEN_THINK) and nxt[1].startswith(CLOSE_THINK):
                m[1] = m[1][:-len(OPEN_THINK)] + EMPTY_THINK[:-1]
                nxt[1] = nxt[1][len(CLOSE_THINK):].lstrip()
        elif m[0] == "assistant" and i > 0 and m[1].startswith("\n") and ms[i - 1][1].endswith("\n"):
            m[1] = m[1].lstrip()
    return ms


def split_at_system(rows: list) -> list[tuple[int, list]]:
    """(index of the first, messages) of each conversation of an offline-packed row: a new one at
    each system message after the first message."""
    starts = [0] + [i for i, m in enumerate(rows) if i and isinstance(m, dict) and m.get("role") == "system"]
    return [(a, rows[a:b]) for a, b in zip(starts, starts[1:] + [len(rows)])]


def nano_conversation(sample: dict, packed: bool) -> Conversation:
    where = sample_where(sample)
    rows = field_list(payload(sample, where), "messages", where)
    messages: list[Message] = []
    segments: list[int] = []
    for start, part in (split_at_system(rows) if packed else [(0, rows)]):
        normalised = normalize(read_messages(part, where, start))
        if not packed and any(role == "system" for role, _ in normalised[1:]):
            raise DataError(where, "a later system message: nemotron_nano_openai_messages_jsonl takes one leading "
                                   "system message (the _offline_packed_jsonl cooker starts a conversation at each)")
        segments.append(len(messages))
        messages += [Message(role, [text]) for role, text in normalised]
    return make_conversation(sample, messages, segments, where, format_last_only=True)


@register("nemotron_nano_openai_messages_jsonl", NEMOTRON_SUBFLAVORS, schema=SCHEMA, modalities=())
@stateless
def cook_nemotron_nano_openai_messages_jsonl(sample: dict, **aux) -> Conversation:
    """NeMo-RL's cooker of that name: one Nano text conversation (see the module docstring)."""
    return nano_conversation(sample, packed=False)


@register("nemotron_nano_openai_messages_offline_packed_jsonl", NEMOTRON_SUBFLAVORS | {"offline_packed_messages": bool},
          schema=SCHEMA + "; several conversations in one row, a new one at each system message", modalities=())
@stateless
def cook_nemotron_nano_openai_messages_offline_packed_jsonl(sample: dict, **aux) -> Conversation:
    """NeMo-RL's cooker of that name: several Nano conversations in one row, each a source."""
    return nano_conversation(sample, packed=True)
