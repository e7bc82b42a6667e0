"""Prompt formats of the Energon path, by name: messages → rendered text + trained character spans.

A format renders a conversation to one string and says which character spans are trained (the
assistant output). Tokenization then maps the spans to tokens through the tokenizer's offsets
(``tokenization.conversation``).

- ``tokenizer``: the tokenizer's own chat template. With ``{% generation %}`` markers the spans are
  the template's generation spans, exactly as Hugging Face's ``return_assistant_tokens_mask``.
  Without markers, each assistant turn's span is derived by rendering the conversation up to the
  turn with the generation prompt (its prefix) and up to and including the turn; an inconsistent
  template (a prefix that is not a prefix) is an error.
- ``nemotron6``: Nemotron 3 ChatML with thinking normalisation (see :class:`Nemotron6Format`).
- ``nemotron-h``: Nemotron-H / Nano v2 ``<SPECIAL_1x>`` format (see :class:`NemotronHFormat`).
- preformatted (``subflavors.skip_chat_template``, not a named format): message texts are already
  rendered; they are concatenated and assistant messages are the trained spans.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from energon_nemotron.errors import ConfigError, DataError
from energon_nemotron.registry import PROMPT_FORMATS
from energon_nemotron.tokenization.tool_rendering import (
    nemotron6_call,
    nemotron6_tool_result,
    nemotron6_tools,
    nemotron_h_calls,
    nemotron_h_tools,
)
from energon_nemotron.types import Message


@dataclass
class Rendered:
    """A rendered conversation: ``text``; ``spans`` (start, end) of trained characters, one per
    trained turn, in order; ``strict``: every span boundary must fall between tokens (else the
    sample is rejected), False only where Hugging Face's overlap rule is the reference."""

    text: str
    spans: list[tuple[int, int]] = field(default_factory=list)
    strict: bool = True


def is_trained(message: Message) -> bool:
    """Role-based default (assistant turns), unless the message overrides it."""
    return message.train if message.train is not None else message.role == "assistant"


class _Pieces:
    """Builds a rendering piece by piece, recording trained spans."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.spans: list[tuple[int, int]] = []
        self.length = 0

    def add(self, text: str, trained: bool = False) -> None:
        if trained and text:
            self.spans.append((self.length, self.length + len(text)))
        self.parts.append(text)
        self.length += len(text)

    def result(self) -> Rendered:
        return Rendered("".join(self.parts), self.spans)


def render_preformatted(messages: list[Message]) -> Rendered:
    """Already-rendered turns: concatenated; assistant (or ``train=True``) turns are trained."""
    out = _Pieces()
    for m in messages:
        out.add(m.text, is_trained(m))
    return out.result()


THINK_RE = re.compile(r"<think>(.*?)</think>", re.DOTALL)


def split_thinking(content: str, reasoning: Optional[str], key: str) -> tuple[str, str]:
    """(reasoning, answer) of an assistant turn: ``reasoning`` if given, else one leading
    ``<think>…</think>`` block of the content. More than one block, or a stray tag, is an error."""
    if reasoning is not None:
        if "<think>" in content or "</think>" in content:
            raise DataError(key, "assistant turn has both a reasoning field and <think> tags in its content",
                            "invalid_thinking")
        return reasoning, content
    blocks = THINK_RE.findall(content)
    if not blocks:
        if "<think>" in content or "</think>" in content:
            raise DataError(key, "assistant turn has an unmatched <think> or </think> tag", "invalid_thinking")
        return "", content
    if len(blocks) > 1 or not content.lstrip().startswith("<think>"):
        raise DataError(key, "assistant turn must have at most one <think>…</think> block, at its start",
                        "invalid_thinking")
    body = THINK_RE.sub("", content, count=1)
    if "<think>" in body or "</think>" in body:
        raise DataError(key, "assistant turn has an unmatched <think> or </think> tag", "invalid_thinking")
    return blocks[0].strip("\n"), body.lstrip("\n")


class PromptFormat:
    """A named prompt format: ``render(messages, key) -> Rendered``; the encoder calls
    :meth:`render_sample`, which also handles preformatted samples and last-turn-only training.

    ``options``: the format options the class takes as keyword arguments (``get_prompt_format``
    refuses any other)."""

    name = ""
    options: tuple[str, ...] = ()

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def render(self, messages: list[Message], key: str, tools: Sequence[dict] = ()) -> Rendered:  # pragma: no cover
        """``tools``: the function definitions offered (a format without tool support may omit the
        parameter; it is then called without it and conversations with tools are an error)."""
        raise NotImplementedError

    def render_sample(self, messages: list[Message], key: str, preformatted: bool = False,
                      last_only: bool = False, tools: Sequence[dict] = (), tool_boundary: bool = False) -> Rendered:
        """One conversation as the encoder hands it over: rendered by :meth:`render`, or
        concatenated when ``preformatted`` (``subflavors.skip_chat_template``; tool calls and tool
        definitions are then an error); ``last_only``: only the last trained span is kept;
        ``tool_boundary`` (the subflavor ``tool_response_as_turn_boundary``) is NeMo-RL's
        ``nemotron6-moe`` rule, an error here."""
        if tool_boundary:
            raise DataError(key, f"subflavor tool_response_as_turn_boundary is read by the nemotron6-moe prompt format "
                                 f"only, not by {self.name!r}")
        if preformatted:
            if tools or any(m.tool_calls for m in messages):
                raise DataError(key, "has tool calls or tool definitions, but skip_chat_template is set: preformatted "
                                     "text must hold its tool calls as text (or drop skip_chat_template)")
            rendered = render_preformatted(messages)
        else:
            rendered = self.render(messages, key, tools=tools) if tools else self.render(messages, key)
        if last_only:
            rendered.spans = rendered.spans[-1:]
        return rendered


@PROMPT_FORMATS.register("nemotron6")
class Nemotron6Format(PromptFormat):
    """Nemotron 3 ChatML: ``<|im_start|>{role}\\n{content}<|im_end|>\\n``.

    - A conversation without a leading system message gets an empty one (as the Nemotron 3
      template renders it); ``tools`` are appended to the system text (``\\n\\n`` after a non-empty
      one) as the template's ``# Tools`` block (``tokenization.tool_rendering``).
    - Assistant: ``<|im_start|>assistant\\n<think>\\n{reasoning}\\n</think>{answer}<|im_end|>\\n``, and
      ``<think></think>{answer}`` when the turn has no reasoning (thinking normalisation).
      Trained: what the model generates after the generation prompt — ``{answer}<|im_end|>`` (with
      reasoning: ``{reasoning}\\n</think>{answer}<|im_end|>``); the header, the ``<think>\\n`` or
      empty ``<think></think>`` prefix and the newline after ``<|im_end|>`` are not.
    - Assistant with tool calls, as the template: ``<think></think>{answer.rstrip()}\\n`` (with
      reasoning ``<think>\\n{reasoning}\\n</think>\\n{answer.rstrip()}\\n``, the answer's newline
      dropped when it is empty), then each call, then ``<|im_end|>``; trained from the same point.
    - Tool results: consecutive ``tool`` messages form one user turn,
      ``<|im_start|>user\\n<tool_response>\\n{result}\\n</tool_response>\\n…<|im_end|>\\n`` (masked).
    """

    name = "nemotron6"

    def render(self, messages: list[Message], key: str, tools: Sequence[dict] = ()) -> Rendered:
        out = _Pieces()
        head = messages[0] if messages and messages[0].role == "system" else None
        system = head.text if head is not None else ""
        if tools:
            system += ("\n\n" if system else "") + nemotron6_tools(tools)
        out.add(f"<|im_start|>system\n{system}<|im_end|>\n", head is not None and is_trained(head))
        rest = messages[1:] if head is not None else messages
        for i, m in enumerate(rest):
            if m.role == "assistant":
                self._assistant(out, m, key)
            elif m.role == "tool":
                first = i == 0 or rest[i - 1].role != "tool"
                last = i == len(rest) - 1 or rest[i + 1].role != "tool"
                out.add("<|im_start|>user\n" if first else "")
                out.add(nemotron6_tool_result(m.text), is_trained(m))
                out.add("<|im_end|>\n" if last else "")
            else:
                out.add(f"<|im_start|>{m.role}\n{m.text}<|im_end|>\n", is_trained(m))
        return out.result()

    @staticmethod
    def _assistant(out: _Pieces, m: Message, key: str) -> None:
        reasoning, answer = split_thinking(m.text, m.reasoning, key)
        out.add("<|im_start|>assistant\n")
        train = is_trained(m)
        if m.tool_calls:
            calls = "".join(nemotron6_call(c) for c in m.tool_calls)
            if reasoning:
                out.add("<think>\n")
                body = f"{reasoning}\n</think>\n{answer}".rstrip() + "\n"
            else:
                out.add("<think></think>")
                body = answer.rstrip() + "\n"
            out.add(f"{body}{calls}<|im_end|>", train)
        elif reasoning:
            out.add("<think>\n")
            out.add(f"{reasoning}\n</think>{answer}<|im_end|>", train)
        else:
            out.add("<think></think>")
            out.add(f"{answer}<|im_end|>", train)
        out.add("\n")


def _without_think_switches(text: str) -> str:
    return text.replace("/think", "").replace("/no_think", "").strip()


@PROMPT_FORMATS.register("nemotron-h")
class NemotronHFormat(PromptFormat):
    """Nemotron-H / Nano v2: ``<SPECIAL_10>System\\n{c}\\n``, ``<SPECIAL_11>User\\n{c}\\n``,
    ``<SPECIAL_11>Assistant\\n{c}\\n<SPECIAL_12>\\n`` (system and user with ``/think`` and
    ``/no_think`` removed, all stripped, as Megatron-LM's ``nemotron-nano-v2``). Trained: everything
    of an assistant turn after its ``<SPECIAL_11>Assistant\\n`` header.

    Tools, as the Nano v2 chat template renders them: ``tools`` as ``<AVAILABLE_TOOLS>[…]`` text in the
    system turn (one is added when there is none; ``\\n\\n`` after a non-empty system text); an
    assistant turn's calls as ``{c}\\n\\n<TOOLCALL>[…]</TOOLCALL>`` (no blank line when ``c`` is empty);
    consecutive ``tool`` messages as one ``<SPECIAL_11>User\\n<TOOL_RESPONSE>[r1, r2]</TOOL_RESPONSE>\\n``
    turn (masked)."""

    name = "nemotron-h"

    def render(self, messages: list[Message], key: str, tools: Sequence[dict] = ()) -> Rendered:
        out = _Pieces()
        if tools and (not messages or messages[0].role != "system"):
            out.add(f"<SPECIAL_10>System\n{nemotron_h_tools(tools)}\n")
        for i, m in enumerate(messages):
            if m.role == "system":
                text = _without_think_switches(m.text)
                if tools and i == 0:
                    text += ("\n\n" if text else "") + nemotron_h_tools(tools)
                out.add(f"<SPECIAL_10>System\n{text}\n", is_trained(m))
            elif m.role == "assistant":
                out.add("<SPECIAL_11>Assistant\n")
                text = m.text.strip()
                if m.tool_calls:
                    text += ("\n\n" if text else "") + nemotron_h_calls(m.tool_calls)
                out.add(f"{text}\n<SPECIAL_12>\n", is_trained(m))
            elif m.role == "tool":
                first = i == 0 or messages[i - 1].role != "tool"
                last = i == len(messages) - 1 or messages[i + 1].role != "tool"
                out.add("<SPECIAL_11>User\n<TOOL_RESPONSE>[" if first else ", ")
                out.add(m.text, is_trained(m))
                out.add("]</TOOL_RESPONSE>\n" if last else "")
            else:
                out.add(f"<SPECIAL_11>User\n{_without_think_switches(m.text)}\n", is_trained(m))
        return out.result()


GENERATION_RE = re.compile(r"\{%-?\s*generation\s*-?%\}")


@PROMPT_FORMATS.register("tokenizer")
class TokenizerTemplateFormat(PromptFormat):
    """The tokenizer's own chat template (see the module docstring)."""

    name = "tokenizer"

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        template = getattr(tokenizer, "chat_template", None)
        if not template or not isinstance(template, str):
            raise ConfigError(f"prompt_format 'tokenizer' uses the tokenizer's chat template, and tokenizer "
                              f"{getattr(tokenizer, 'name_or_path', '') or '(object)'} has none (or several): add "
                              "chat_template.jinja to its folder, or set task_encoder.options.prompt_format to a "
                              f"named format ({', '.join(n for n in PROMPT_FORMATS.names() if n != 'tokenizer')})")
        self.template = template
        self.has_markers = bool(GENERATION_RE.search(template))

    def _render(self, dicts: list[dict], add_generation_prompt: bool, with_spans: bool, tools: Sequence[dict] = ()):
        from transformers.utils.chat_template_utils import render_jinja_template

        rendered, indices = render_jinja_template(
            conversations=[dicts], tools=list(tools) or None, chat_template=self.template,
            return_assistant_tokens_mask=with_spans, add_generation_prompt=add_generation_prompt,
            **self.tokenizer.special_tokens_map)
        return rendered[0], (indices[0] if with_spans else None)

    @staticmethod
    def as_dicts(messages: list[Message]) -> list[dict]:
        """The messages as a chat template reads them: ``role``, ``content`` (media as
        ``MEDIA_MARKER``), and where present ``reasoning_content``, ``tool_calls`` (OpenAI shape,
        arguments as objects) and ``tool_call_id``."""
        out = []
        for m in messages:
            d: dict[str, Any] = {"role": m.role, "content": m.text}
            if m.reasoning is not None:
                d["reasoning_content"] = m.reasoning
            if m.tool_calls:
                d["tool_calls"] = [c.as_dict() for c in m.tool_calls]
            if m.tool_call_id is not None:
                d["tool_call_id"] = m.tool_call_id
            out.append(d)
        return out

    def render(self, messages: list[Message], key: str, tools: Sequence[dict] = ()) -> Rendered:
        dicts = self.as_dicts(messages)
        rendered = self._render_spans(messages, dicts, key, tools)
        lost = dropped_content(messages, tools, rendered.text)
        if lost:
            raise DataError(key, f"the tokenizer's chat template does not render {'; '.join(lost)}: it would be lost "
                                 "from the training text (a template without that branch); use a template that "
                                 "renders it, or a named prompt format (nemotron6, nemotron-h)", "template_drops")
        return rendered

    def _render_spans(self, messages: list[Message], dicts: list[dict], key: str, tools: Sequence[dict]) -> Rendered:
        if self.has_markers:
            text, spans = self._render(dicts, False, True, tools)
            spans = [tuple(s) for s in spans]
            trained = [m for m in messages if m.role == "assistant"]
            if len(spans) == len(trained):      # per-turn overrides apply when spans map to turns
                spans = [s for s, m in zip(spans, trained) if is_trained(m)]
            return Rendered(text, spans, strict=False)
        text, _ = self._render(dicts, False, False, tools)
        spans = []
        for i, m in enumerate(messages):
            if not is_trained(m):
                continue
            if m.role != "assistant":
                raise DataError(key, f"message {i} ({m.role}) is marked trained, but without "
                                     "{% generation %} markers only assistant turns can be located")
            head, _ = self._render(dicts[:i], True, False, tools)
            upto, _ = self._render(dicts[:i + 1], False, False, tools)
            if not (upto.startswith(head) and text.startswith(upto)) or len(upto) == len(head):
                raise DataError(key, f"the chat template is not prefix-consistent at message {i}: the "
                                     "rendering up to an assistant turn is not a prefix of the whole "
                                     "conversation, so its span cannot be derived; add {% generation %} markers", "tokenization")
            spans.append((len(head), len(upto)))
        return Rendered(text, spans)


def _shown(text: str, rendered: str) -> bool:
    """Whether ``text`` (stripped) is in ``rendered`` as it is or JSON-escaped (``| tojson``)."""
    import json

    core = text.strip()
    return not core or core in rendered or json.dumps(core)[1:-1] in rendered


def dropped_content(messages: Sequence[Message], tools: Sequence[dict], rendered: str) -> list[str]:
    """What of a conversation a chat template left out of ``rendered``: the names of tool
    definitions and tool calls, tool results, reasoning (each named by its message); empty when all
    is there. A text counts as rendered when it appears stripped (or JSON-escaped)."""
    lost = []
    names = [(t.get("function", t) or {}).get("name", "") for t in tools]
    missing = [n for n in names if n and n not in rendered]
    if missing:
        lost.append(f"the tool definitions ({', '.join(missing)})")
    for i, m in enumerate(messages):
        if any(c.name not in rendered for c in m.tool_calls):
            lost.append(f"the tool calls of message {i}")
        if m.role == "tool" and not _shown(m.text, rendered):
            lost.append(f"the tool result of message {i}")
        if m.reasoning and not _shown(m.reasoning, rendered):
            lost.append(f"the reasoning of message {i}")
    return lost


def formats_taking(option: str) -> list[str]:
    """The names of the registered prompt formats that take the format option ``option``."""
    return [n for n in PROMPT_FORMATS.names() if option in getattr(PROMPT_FORMATS.get(n), "options", ())]


def get_prompt_format(name: str, tokenizer: Any, **format_options: Any) -> PromptFormat:
    """The registered format ``name`` for ``tokenizer``, with its ``format_options``
    (``thinking_trace_format``, ``relax_thinking_trace_check``, ...). An option set to None or False
    is not given; a format refuses any other option it does not take (``ConfigError`` naming the
    option and the formats that take it)."""
    try:
        cls = PROMPT_FORMATS.get(name)
    except KeyError as e:
        raise ConfigError(str(e.args[0])) from None
    given = {k: v for k, v in format_options.items() if v is not None and v is not False}
    for option in given:
        if option not in cls.options:
            takers = formats_taking(option)
            raise ConfigError(f"prompt_format {name!r} does not take the option {option!r} "
                              f"(task_encoder.options.{option}); " + (f"formats that do: {', '.join(takers)}"
                                                                      if takers else "no format does"))
    return cls(tokenizer, **given)
