"""NeMo-RL's Nemotron prompt formats by their names: ``nemotron6-moe`` and ``nemotron-h-5p5-reasoning``.

Token for token what NeMo-RL's ``nemotron_multimodal`` task encoder produces (its
``nemotron_tokenization.tokenize_nemotron_conversation`` after ``_normalize_assistant_thinking``),
tested against NeMo-RL's own output (``tests/test_nemo_rl_prompt_formats.py``). NeMo-RL finds the
trained tokens by token ids after rendering; these formats give the same tokens as character spans
of their own rendering.

Options (``get_prompt_format(name, tokenizer, **options)``; ``task_encoder.options``):

- ``thinking_trace_format``: ``default`` = ``normalized`` (None: ``normalized``) or ``ultra``, how
  assistant thinking traces are rewritten (``tokenization.thinking``);
- ``relax_thinking_trace_check``: assistant texts are taken as they are (no rewrite, no check);
- ``tool_response_as_turn_boundary`` (``nemotron6-moe`` only, with last-turn-only training): tool
  results also end the trained tail (NeMo-RL's subflavor of that name).

A message's text is what NeMo-RL calls its content; a ``reasoning`` R is written in front as
``<think>R</think>``. A ``train`` flag on an assistant turn is NeMo-RL's explicit per-turn loss
(``nemotron6-moe`` only; unset turns trained). Where NeMo-RL would silently drop or mis-train part
of a conversation, these formats refuse it (``DataError``): see each class.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional, Sequence

from energon_nemotron.errors import ConfigError, DataError
from energon_nemotron.registry import PROMPT_FORMATS
from energon_nemotron.tokenization.formats import NemotronHFormat, PromptFormat, Rendered, _Pieces
from energon_nemotron.tokenization.thinking import THINKING_TRACE_FORMATS, has_reasoning, normalize_thinking
from energon_nemotron.tokenization.tool_rendering import nemotron6_call
from energon_nemotron.types import MEDIA_MARKER, Message

#: what ``_validate_nemotron6_tokenizer`` requires of a ``nemotron6-moe`` tokenizer: ids -> text
NEMOTRON6_LAYOUT = {(10,): "<|im_start|>", (11,): "<|im_end|>", (16,): "<tool_response>", (1010,): "\n",
                    (1503, 19464): "assistant", (3263,): "user"}


def content_of(m: Message) -> str:
    """A message's text as NeMo-RL's content: ``<think>{reasoning}</think>`` in front when set."""
    return m.text if m.reasoning is None else f"<think>{m.reasoning}</think>{m.text}"


def check_tool_ids(messages: Sequence[Message], key: str) -> None:
    """NeMo-RL's message checks: every tool call has an id, every tool result answers an earlier call."""
    ids: set[str] = set()
    for i, m in enumerate(messages):
        for c in m.tool_calls:
            if c.id is None:
                raise DataError(key, f"message {i}: a tool call without an id")
            ids.add(c.id)
        if m.role == "tool" and m.tool_call_id not in ids:
            raise DataError(key, f"message {i}: the tool result answers no earlier tool call ({m.tool_call_id!r})")


class NemoRLFormat(PromptFormat):
    """What both formats share: the options, thinking normalisation, NeMo-RL's checks and the
    preformatted rendering."""

    options: tuple[str, ...] = ("thinking_trace_format", "relax_thinking_trace_check")
    #: what normalisation writes for a turn without tags, and after ``</think>``
    empty_trace, separator = "<think></think>", "\n"

    def __init__(self, tokenizer: Any, thinking_trace_format: Optional[str] = None,
                 relax_thinking_trace_check: bool = False, tool_response_as_turn_boundary: bool = False) -> None:
        super().__init__(tokenizer)
        if thinking_trace_format not in (None, *THINKING_TRACE_FORMATS):
            raise ConfigError(f"thinking_trace_format {thinking_trace_format!r}: one of "
                              f"{', '.join(THINKING_TRACE_FORMATS)} (prompt_format {self.name!r})")
        for option, value in (("relax_thinking_trace_check", relax_thinking_trace_check),
                              ("tool_response_as_turn_boundary", tool_response_as_turn_boundary)):
            if not isinstance(value, bool):
                raise ConfigError(f"{option} must be true or false, got {value!r} (prompt_format {self.name!r})")
        self.ultra = thinking_trace_format == "ultra"
        self.relax = relax_thinking_trace_check
        self.tool_boundary = tool_response_as_turn_boundary

    def render(self, messages: list[Message], key: str, tools: Sequence[dict] = ()) -> Rendered:
        return self.render_sample(messages, key, tools=tools)

    def render_sample(self, messages: list[Message], key: str, preformatted: bool = False,
                      last_only: bool = False, tools: Sequence[dict] = (), tool_boundary: bool = False) -> Rendered:
        """As ``PromptFormat.render_sample``; ``tool_boundary``: the sample's subflavor
        ``tool_response_as_turn_boundary`` (or the format option of that name)."""
        boundary = self.tool_boundary or tool_boundary
        if boundary and "tool_response_as_turn_boundary" not in self.options:
            raise DataError(key, f"subflavor tool_response_as_turn_boundary is read by nemotron6-moe only, not by "
                                 f"{self.name!r}")
        if tools:
            raise DataError(key, f"has tool definitions: NeMo-RL's {self.name} renders none (its encoder passes no "
                                 "tools to the template)")
        check_tool_ids(messages, key)
        for i, m in enumerate(messages):
            if m.role != "assistant" and m.train:
                raise DataError(key, f"message {i} ({m.role}) is marked trained: {self.name} trains assistant "
                                     "turns only")
        explicit = any(m.train is not None for m in messages if m.role == "assistant")
        if explicit and (last_only or preformatted or boundary or self.name != "nemotron6-moe"):
            raise DataError(key, f"per-turn train flags (explicit assistant loss) go with {self.name} only "
                                 "without train_only_on_last_assistant_turn, skip_chat_template and "
                                 "tool_response_as_turn_boundary, and in nemotron6-moe only")
        if boundary and (preformatted or not last_only):
            raise DataError(key, "tool_response_as_turn_boundary needs train_only_on_last_assistant_turn and "
                                 "a templated sample (not skip_chat_template)")
        if preformatted:
            return self._preformatted(messages, key, last_only)
        return self._templated(messages, key, last_only, boundary)

    def _templated(self, messages: list[Message], key: str, last_only: bool,
                   boundary: bool = False) -> Rendered:  # pragma: no cover
        raise NotImplementedError

    def texts(self, messages: Sequence[Message], key: str) -> list[str]:
        """NeMo-RL's contents of the messages, assistant texts normalised (unless relaxed)."""
        out = []
        for i, m in enumerate(messages):
            text = content_of(m)
            if m.role == "assistant":
                if MEDIA_MARKER in text:
                    raise DataError(key, f"message {i}: an assistant turn with media ({self.name} has none)")
                if not self.relax:
                    text = normalize_thinking(text, key, f"message {i}", empty=self.empty_trace,
                                              separator=self.separator, ultra=self.ultra)
            out.append(text)
        return out

    def _preformatted(self, messages: list[Message], key: str, last_only: bool) -> Rendered:
        """``skip_chat_template``: the contents concatenated, assistant turns trained. Refused: an
        empty turn and media (as NeMo-RL), tool calls (NeMo-RL drops them) and last-turn-only
        training (NeMo-RL's nemotron6-moe trains every assistant turn of a preformatted sample)."""
        if last_only:
            raise DataError(key, f"train_only_on_last_assistant_turn with a preformatted sample: NeMo-RL's {self.name} "
                                 "trains every assistant turn of it (or refuses it); drop one of the two")
        if any(m.tool_calls for m in messages):
            raise DataError(key, "has tool calls, but skip_chat_template is set: preformatted text must hold its tool "
                                 "calls as text (NeMo-RL drops them)")
        out = _Pieces()
        for i, m in enumerate(messages):
            text = content_of(m)
            if not text or MEDIA_MARKER in text:
                raise DataError(key, f"message {i}: a preformatted turn must be non-empty text without media")
            out.add(text, m.role == "assistant")
        return out.result()


@PROMPT_FORMATS.register("nemotron6-moe")
class Nemotron6MoeFormat(NemoRLFormat):
    """NeMo-RL's ``nemotron6-moe``: the Nemotron 3 (Nano) chat template with
    ``truncate_history_thinking=False`` and no tools, on normalised assistant texts.

    - ``<|im_start|>system\\n{system or ""}<|im_end|>\\n``, then user and later system turns as
      ``<|im_start|>{role}\\n{text}<|im_end|>\\n``; consecutive tool results as one
      ``<|im_start|>user\\n<tool_response>\\n{r}\\n</tool_response>\\n…<|im_end|>\\n`` turn;
    - assistant: ``<|im_start|>assistant\\n{c.strip()}<|im_end|>\\n``, ``c`` the text with
      ``<think></think>`` in front when it has no think tag; with tool calls
      ``{c.strip()}\\n`` then each call (``tokenization.tool_rendering``) before ``<|im_end|>``.
    - Trained: everything of an assistant turn after ``<|im_start|>assistant\\n``, ``<|im_end|>``
      included (think tags too). With last-turn-only training, NeMo-RL's rule: every assistant
      turn, unless a turn holds a non-blank trace, in which case the turns after the last user turn
      (one not opening with ``<tool_response>``); with ``tool_response_as_turn_boundary`` the
      tool-result turns count as user turns as well.

    The tokenizer must have the ids NeMo-RL checks (:data:`NEMOTRON6_LAYOUT`; ``ConfigError``).
    """

    name = "nemotron6-moe"
    options = (*NemoRLFormat.options, "tool_response_as_turn_boundary")

    def __init__(self, tokenizer: Any, **options: Any) -> None:
        super().__init__(tokenizer, **options)
        for ids, want in NEMOTRON6_LAYOUT.items():
            got = tokenizer.decode(list(ids), clean_up_tokenization_spaces=False)
            if got != want:
                raise ConfigError(f"prompt_format 'nemotron6-moe' needs a Nemotron 3 tokenizer: ids {list(ids)} decode "
                                  f"to {got!r} in {getattr(tokenizer, 'name_or_path', '') or 'this tokenizer'}, "
                                  f"NeMo-RL requires {want!r}")

    def _templated(self, messages: list[Message], key: str, last_only: bool, boundary: bool = False) -> Rendered:
        texts = self.texts(messages, key)
        out = _Pieces()
        head = 1 if messages and messages[0].role == "system" else 0
        out.add(f"<|im_start|>system\n{texts[0] if head else ''}<|im_end|>\n")
        turns: dict[int, tuple[int, int]] = {}
        for i in range(head, len(messages)):
            m, c = messages[i], texts[i]
            if m.role == "assistant":
                if "<think>" not in c and "</think>" not in c:
                    c = "<think></think>" + c
                out.add("<|im_start|>assistant\n")
                body = c.strip()
                if m.tool_calls:
                    body = (body + "\n" if body else "<think></think>") + "".join(nemotron6_call(x) for x in m.tool_calls)
                start = out.length
                out.add(body + "<|im_end|>")
                turns[i] = (start, out.length)
                out.add("\n")
            elif m.role == "tool":
                out.add("<|im_start|>user\n" if i > head and messages[i - 1].role != "tool" else "")
                out.add(f"<tool_response>\n{c}\n</tool_response>\n")
                out.add("<|im_end|>\n" if i + 1 == len(messages) or messages[i + 1].role != "tool" else "")
            else:
                out.add(f"<|im_start|>{m.role}\n{c}<|im_end|>\n")
        trained = self._trained(messages, texts, head, sorted(turns), key, boundary) if last_only else \
            [i for i in sorted(turns) if messages[i].train is not False]
        return Rendered(out.result().text, [turns[i] for i in trained])

    def _trained(self, messages: list[Message], texts: list[str], head: int, assistants: list[int],
                 key: str, boundary: bool) -> list[int]:
        """The assistant turns last-turn-only training keeps (NeMo-RL's rule, see the class)."""
        users = [(i, messages[i].role == "tool" or texts[i].startswith("<tool_response>"), messages[i].role == "tool")
                 for i in range(head, len(messages))
                 if messages[i].role == "user" or (messages[i].role == "tool" and i > head
                                                   and messages[i - 1].role != "tool")]
        native = [m.role == "tool" for k, m in enumerate(messages)
                  if m.role == "user" or (m.role == "tool" and (k == 0 or messages[k - 1].role != "tool"))]
        use_native = boundary and any(native)
        if use_native and len(native) != len(users):
            raise DataError(key, "tool results that do not render as user turns (tool_response_as_turn_boundary)")
        thinking = any(has_reasoning(texts[i]) for i in assistants)
        if not users or not (thinking or use_native):
            return assistants
        bounds = [i for i, tool_opened, is_tool in users if (thinking and not tool_opened) or (use_native and is_tool)]
        return [i for i in assistants if not bounds or i > bounds[-1]]


@PROMPT_FORMATS.register("nemotron-h-5p5-reasoning")
class NemotronH5p5Format(NemoRLFormat):
    """NeMo-RL's ``nemotron-h-5p5-reasoning``: ``nemotron-h``'s rendering (``NemotronHFormat``) of
    system, user and assistant turns on normalised assistant texts (``<think></think>\\n\\n`` in front
    of a turn without tags, ``\\n\\n`` after ``</think>``); trained: each assistant turn after its
    ``<SPECIAL_11>Assistant\\n`` header.

    NeMo-RL's template renders no tool turn, tool call or tool definition, and its mask counts
    ``<SPECIAL_11>`` positions, right only for alternating user and assistant turns. Refused
    (``DataError``): tools of any kind; turns other than system that do not alternate user,
    assistant, …, assistant; a system turn at the end, or (with no system turn first) a first system
    turn after an assistant turn (NeMo-RL would train it); last-turn-only training and train flags
    (NeMo-RL refuses them for this format).
    """

    name = "nemotron-h-5p5-reasoning"
    empty_trace, separator = "<think></think>\n\n", "\n\n"

    def __init__(self, tokenizer: Any, **options: Any) -> None:
        super().__init__(tokenizer, **options)
        self.layout = NemotronHFormat(tokenizer)

    def _templated(self, messages: list[Message], key: str, last_only: bool, boundary: bool = False) -> Rendered:
        if last_only:
            raise DataError(key, "train_only_on_last_assistant_turn: NeMo-RL supports it for nemotron6-moe only")
        if any(m.role == "tool" or m.tool_calls for m in messages):
            raise DataError(key, "has tool calls or tool results: NeMo-RL's nemotron-h-5p5-reasoning template renders "
                                 "neither (it would drop them)")
        problem = self.shape_problem(messages)
        if problem:
            raise DataError(key, f"{problem}: NeMo-RL's nemotron-h-5p5-reasoning mask (by <SPECIAL_11> positions) "
                                 "would not be the assistant turns")
        texts = self.texts(messages, key)
        normalised = [replace(m, content=[t], reasoning=None) for m, t in zip(messages, texts)]
        return self.layout.render(normalised, key)

    @staticmethod
    def shape_problem(messages: Sequence[Message]) -> str:
        """Why NeMo-RL's positional mask would misread this conversation's turns ("" if it would not)."""
        roles = [m.role for m in messages if m.role != "system"]
        if not roles or roles != ["user", "assistant"] * (len(roles) // 2) or len(roles) % 2:
            return "the turns other than system do not alternate user, assistant, …, assistant"
        if messages[-1].role == "system":
            return "a system turn ends the conversation"
        first = next((i for i, m in enumerate(messages) if m.role == "system"), 0)
        before = [m.role for m in messages[:first] if m.role != "system"]
        if before and before[-1] == "assistant":
            return "the first system turn follows an assistant turn"
        return ""
