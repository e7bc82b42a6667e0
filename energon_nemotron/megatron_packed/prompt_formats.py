"""Megatron-LM ``SFTTokenizer`` prompt formats (Megatron-LM main d98e8a64dd).

Each format renders one message at a time; a conversation's text is the concatenation of its
messages' renderings (the Jinja templates of ``SFTTokenizer`` are plain per-message loops, so this
is exact; the tests check it against ``transformers``' ``apply_chat_template``). ``default`` uses
the tokenizer's own chat template on the whole conversation and trains every token.

| format | system | user | assistant | prefix masked | pad token |
|---|---|---|---|---|---|
| identity | content | content | content | 0 | ``<unk>`` |
| nemotron-h-aligned | ``<SPECIAL_10>System\\n{c.strip()}\\n`` | ``<SPECIAL_11>User\\n{c.strip()}\\n<SPECIAL_11>Assistant\\n`` | ``{c.strip()}\\n`` | 0 | ``<SPECIAL_233>`` |
| nemotron-nano-v2 | ``<SPECIAL_10>System\\n{c'}\\n`` | ``<SPECIAL_11>User\\n{c'}\\n`` | ``<SPECIAL_11>Assistant\\n{c.strip()}\\n<SPECIAL_12>\\n`` | 3 | ``<unk>`` |
| default | tokenizer chat template (whole conversation) | | | nothing masked | pad, else EOS |

``c'`` = content without ``/think`` and ``/no_think``, stripped. A ``tool`` message renders as
nothing in the two Nemotron formats (as in Megatron-LM) and as its content in ``identity``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from energon_nemotron.registry import MEGATRON_PROMPT_FORMATS

#: Roles a message may have on this path (Megatron-LM masks system/user/tool, trains assistant).
ROLES = ("system", "user", "assistant", "tool")
PROMPT_ROLES = ("system", "user", "tool")


@dataclass(frozen=True)
class MegatronPromptFormat:
    """One ``SFTTokenizer`` prompt format.

    ``render(role, content) -> str`` renders one message (None for ``default``, which renders the
    whole conversation with the tokenizer's chat template). ``masked``: prompt turns get label -100
    (checked per turn); ``assistant_prefix_len``: leading tokens of every assistant turn that are
    masked; ``pad_token``: the token whose id pads (None: the tokenizer's pad, else EOS).
    """

    name: str
    render: Optional[Callable[[str, str], str]]
    masked: bool
    assistant_prefix_len: int
    pad_token: Optional[str]

    def render_conversation(self, messages: list[dict]) -> list[str]:
        """The rendering of every message, in order (their concatenation is the conversation)."""
        if self.render is None:
            raise TypeError(f"prompt format {self.name!r} renders whole conversations only")
        render = self.render
        return [render(m["role"], m["content"]) for m in messages]


def _identity(role: str, content: str) -> str:
    return content


def _nemotron_h_aligned(role: str, content: str) -> str:
    if role == "system":
        return "<SPECIAL_10>System\n" + content.strip() + "\n"
    if role == "user":
        return "<SPECIAL_11>User\n" + content.strip() + "\n<SPECIAL_11>Assistant\n"
    if role == "assistant":
        return content.strip() + "\n"
    return ""


def _without_think(content: str) -> str:
    return content.replace("/think", "").replace("/no_think", "").strip()


def _nemotron_nano_v2(role: str, content: str) -> str:
    if role == "system":
        return "<SPECIAL_10>System\n" + _without_think(content) + "\n"
    if role == "user":
        return "<SPECIAL_11>User\n" + _without_think(content) + "\n"
    if role == "assistant":
        return "<SPECIAL_11>Assistant\n" + content.strip() + "\n<SPECIAL_12>\n"
    return ""


for _fmt in (
    MegatronPromptFormat("identity", _identity, masked=True, assistant_prefix_len=0, pad_token="<unk>"),
    MegatronPromptFormat("nemotron-h-aligned", _nemotron_h_aligned, masked=True,
                         assistant_prefix_len=0, pad_token="<SPECIAL_233>"),
    MegatronPromptFormat("nemotron-nano-v2", _nemotron_nano_v2, masked=True,
                         assistant_prefix_len=3, pad_token="<unk>"),
    MegatronPromptFormat("default", None, masked=False, assistant_prefix_len=0, pad_token=None),
):
    MEGATRON_PROMPT_FORMATS.register(_fmt.name, _fmt)

#: The ``identity`` format of Megatron-LM core_v0.18.x–v0.19.x: every token trained.
IDENTITY_UNMASKED = MegatronPromptFormat("identity", _identity, masked=False,
                                         assistant_prefix_len=0, pad_token="<unk>")


def get_prompt_format(name: str) -> MegatronPromptFormat:
    """The registered format ``name`` (``KeyError`` listing the known names otherwise)."""
    return MEGATRON_PROMPT_FORMATS.get(name)
