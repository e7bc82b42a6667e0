"""NeMo-RL's thinking-trace normalisation of Nemotron assistant texts (``thinking_trace_format``).

The rule NeMo-RL's ``nemotron_multimodal`` encoder applies to every assistant text before the
``nemotron6-moe`` and ``nemotron-h-5p5-reasoning`` prompt formats render it (Megatron-LM's Nemotron
spacing), unless ``relax_thinking_trace_check`` is set or the sample is preformatted:

- no ``<think>`` and no ``</think>``: ``{empty}{text.strip()}``, ``empty`` being ``<think></think>``
  (``nemotron6-moe``) or ``<think></think>\\n\\n`` (``nemotron-h-5p5-reasoning``);
- else exactly one ``<think>`` and one ``</think>``, in that order (anything else is a
  ``DataError``, reason ``invalid_thinking``); the block becomes ``<think>\\n{inner.strip()}\\n</think>``
  (``ultra``: no newline before ``</think>``; an empty or blank inner: ``<think></think>``), and the
  white space after ``</think>`` becomes ``separator``: ``\\n`` (``nemotron6-moe``), ``\\n\\n``
  (``nemotron-h-5p5-reasoning``), nothing with ``ultra``. Text before ``<think>`` stays as it is.

``default`` and ``normalized`` are the same (``default`` is NeMo-RL's older name).
"""

from __future__ import annotations

import re

from energon_nemotron.errors import DataError

#: the values of ``thinking_trace_format``
THINKING_TRACE_FORMATS = ("default", "normalized", "ultra")

_BLOCK = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_AFTER_CLOSE = re.compile(r"</think>\s*")


def normalize_thinking(text: str, key: str, where: str, *, empty: str, separator: str, ultra: bool) -> str:
    """The normalised assistant ``text`` (see the module docstring); ``key`` and ``where`` (e.g.
    ``"message 3"``) name the sample and the turn in errors. Pure string function."""
    opened, closed = text.count("<think>"), text.count("</think>")
    if not opened and not closed:
        return empty + text.strip()
    if opened != 1 or closed != 1:
        raise DataError(key, f"{where}: an assistant turn needs exactly one <think>…</think> pair "
                             f"(found {opened} <think> and {closed} </think>)", "invalid_thinking")
    if text.find("<think>") > text.find("</think>"):
        raise DataError(key, f"{where}: </think> comes before <think>", "invalid_thinking")

    def block(match: re.Match) -> str:
        inner = match.group(1).strip()
        return f"<think>\n{inner}{'' if ultra else chr(10)}</think>" if inner else "<think></think>"

    return _AFTER_CLOSE.sub("</think>" + ("" if ultra else separator), _BLOCK.sub(block, text))


def has_reasoning(text: str) -> bool:
    """Whether a (normalised) assistant text holds a non-blank trace: between its first ``<think>``
    and the first ``</think>`` after it (NeMo-RL's test for last-turn-only training)."""
    if "<think>" not in text or "</think>" not in text:
        return False
    return bool(text.split("<think>", 1)[1].split("</think>", 1)[0].strip())
