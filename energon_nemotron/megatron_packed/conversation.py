"""Reading one Megatron-LM offline-packed row: validate its messages, split it into conversations."""

from __future__ import annotations

from typing import Any

from energon_nemotron.errors import DataError
from energon_nemotron.megatron_packed.prompt_formats import ROLES


def row_messages(row: Any, chat_key: str, where: str | None) -> list[dict]:
    """The validated message list of ``row[chat_key]``.

    Every message must be a dict with a ``role`` in ``ROLES`` and a string ``content``; assistant
    content must not be empty (Megatron-LM's ``len(content) == 0`` test). Raises ``DataError``
    naming ``where`` and the message index otherwise.
    """
    if not isinstance(row, dict):
        raise DataError(where, f"row must be a JSON object, got {type(row).__name__}")
    if chat_key not in row:
        raise DataError(where, f"row has no {chat_key!r} key (keys: {sorted(row)})")
    messages = row[chat_key]
    if not isinstance(messages, list):
        raise DataError(where, f"{chat_key!r} must be a list of messages, got {type(messages).__name__}")
    if not messages:
        raise DataError(where, f"{chat_key!r} is empty")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise DataError(where, f"message {i} must be an object with 'role' and 'content', "
                                   f"got {type(m).__name__}")
        role = m.get("role")
        if role not in ROLES:
            raise DataError(where, f"message {i} has unknown role {role!r} (expected one of {', '.join(ROLES)})", "unknown_role")
        content = m.get("content")
        if not isinstance(content, str):
            kind = "missing" if content is None and "content" not in m else type(content).__name__
            raise DataError(where, f"message {i} ({role}) content must be a string, got {kind}: "
                                   "multimodal content is not supported on the megatron_sft_packed path")
        if role == "assistant" and len(content) == 0:
            raise DataError(where, f"message {i} is an empty assistant turn", "empty_assistant")
    return messages


def split_conversations(messages: list[dict]) -> list[list[dict]]:
    """Split a row at every ``system`` message (each starts a new conversation).

    Messages before the first ``system`` message form the first conversation, as in Megatron-LM's
    ``SFTDataset._split_conversations``.
    """
    conversations: list[list[dict]] = []
    current: list[dict] = []
    for m in messages:
        if m["role"] == "system" and current:
            conversations.append(current)
            current = []
        current.append(m)
    if current:
        conversations.append(current)
    return conversations


def check_turn_order(conversation: list[dict], where: str | None) -> None:
    """Every assistant turn must follow a user or tool turn (Megatron-LM asserts this)."""
    for i, m in enumerate(conversation):
        if m["role"] == "assistant" and (i == 0 or conversation[i - 1]["role"] not in ("user", "tool")):
            before = conversation[i - 1]["role"] if i else "nothing"
            raise DataError(where, f"assistant turn {i} follows {before}, not a user or tool turn")
