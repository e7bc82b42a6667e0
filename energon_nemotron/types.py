"""The samples of the Energon path, from cooked to packed (the output type is ``batch.PackedBatch``).

A cooker turns a crude sample into a ``Conversation`` (messages + lazy ``MediaRef``s, nothing
decoded); the task encoder turns it into an ``EncodedSample`` (tokens, trained-token flags,
packing cost, media plans), packs those into ``PackedRow``s and batches them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

import numpy as np
import torch
from megatron.energon import Sample, edataclass

#: a private-use character that stands for a media reference while a conversation is rendered
MEDIA_MARKER = "\ue000"
ROLES = ("system", "user", "assistant", "tool")
MODALITIES = ("image", "video", "audio")


@dataclass(frozen=True)
class MediaPart:
    """A reference, inside a message, to the ``index``-th media item of its conversation."""

    modality: str
    index: int


@dataclass(frozen=True)
class ToolCall:
    """A function call of an assistant turn: ``arguments`` is the JSON object of the call (parsed
    when the data holds a JSON string; ``raw`` then keeps that string for formats that render it
    verbatim); ``id`` pairs it with the ``tool`` message that answers it."""

    name: str
    arguments: dict
    id: Optional[str] = None
    raw: Optional[str] = None

    def as_dict(self) -> dict:
        """The OpenAI / Hugging Face chat-template shape:
        ``{"type": "function", "id"?, "function": {"name", "arguments": {...}}}``."""
        out: dict[str, Any] = {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        if self.id is not None:
            out["id"] = self.id
        return out


@dataclass
class Message:
    """One turn. ``content`` is a list of text strings and ``MediaPart``s, in order.

    ``reasoning`` is an assistant's reasoning trace (rendered by prompt formats that know one);
    ``train`` overrides role-based loss masking for this message (None: assistant turns trained);
    ``tool_calls``: the function calls of an assistant turn; ``tool_call_id``: the call a ``tool``
    message answers.
    """

    role: str
    content: list[Union[str, MediaPart]]
    reasoning: Optional[str] = None
    train: Optional[bool] = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: Optional[str] = None

    @property
    def text(self) -> str:
        """The content as one string, each media part as ``MEDIA_MARKER`` (prompt formats render
        this; the marker becomes the media placeholder after tokenization)."""
        return "".join(p if isinstance(p, str) else MEDIA_MARKER for p in self.content)

    @property
    def media_parts(self) -> list[MediaPart]:
        return [p for p in self.content if isinstance(p, MediaPart)]


@dataclass(frozen=True)
class MediaRef:
    """A media item, not decoded: ``payload`` is lazy (bytes, a file path, or an object with
    ``.get()``); ``metadata`` holds what is known without decoding (width/height, duration, fps,
    sample rate, ...); ``name`` (member name or path) is for messages."""

    modality: str
    payload: Any
    metadata: dict = field(default_factory=dict)
    name: str = ""


@edataclass
class Conversation(Sample):
    """A cooked sample: messages and the media they reference (each exactly once, in order).

    ``segments`` lists the index of the first message of each conversation when one crude row holds
    several (offline-packed rows); they stay separate sources inside a pack. ``preformatted``:
    message texts are already rendered with the chat template (``subflavors.skip_chat_template``).
    ``tools``: the function definitions offered to the model (OpenAI ``tools``), rendered by the
    prompt format (every segment of the row gets them). ``last_only`` / ``tool_boundary``: per-sample
    rendering flags the prompt format reads (see the fields).
    """

    messages: list[Message]
    media: list[MediaRef] = field(default_factory=list)
    segments: list[int] = field(default_factory=lambda: [0])
    preformatted: bool = False
    tools: list[dict] = field(default_factory=list)
    #: ``train_only_on_last_assistant_turn`` left to the prompt format (the NeMo-RL-named cookers set
    #: it instead of train flags: NeMo-RL's formats have their own last-turn rule)
    last_only: bool = False
    #: the subflavor ``tool_response_as_turn_boundary`` (read by the ``nemotron6-moe`` format only)
    tool_boundary: bool = False

    def segment_messages(self) -> list[list[Message]]:
        """The messages of each segment."""
        bounds = list(self.segments) + [len(self.messages)]
        return [self.messages[a:b] for a, b in zip(bounds, bounds[1:])]


@dataclass
class EncodedSource:
    """One source of a pack: ``tokens`` int64 [n]; ``trained`` bool [n], True where token j is a
    trained target (so the label at position j-1 is ``tokens[j]``); ``key`` names it in
    ``sample_keys``."""

    key: str
    tokens: np.ndarray
    trained: np.ndarray


@edataclass
class EncodedSample(Sample):
    """A tokenized sample: its sources (one per segment), the pack positions they take
    (``cost``: each source rounded up to the pad multiple), one media plan per media item (phase 1),
    the media references themselves and, after phase 2, the processed media tensors."""

    sources: list[EncodedSource]
    cost: int
    media_plans: list = field(default_factory=list)
    media_patches: int = 0          # vision-encoder patches of its images and video frames
    media: list = field(default_factory=list)
    media_tensors: list = field(default_factory=list)
    #: set while only prepared (rendered, not yet tokenized): a :class:`Pending`
    pending: Any = None


@dataclass
class Pending:
    """What a prepared sample still needs: the tokenizer's input (``prepared``, a
    ``tokenization.conversation.Prepared``) and the cooked sample (``origin``), which errors name."""

    prepared: Any
    origin: Any


@edataclass
class PackedRow(Sample):
    """One row: ``tokens``, ``labels``, ``position_ids`` int64 [S], ``loss_mask`` float32 [S],
    ``cu_seqlens``, ``cu_seqlens_padded`` int32 [k+1], ``max_seqlen``, ``keys`` (one per source)."""

    tokens: torch.Tensor
    labels: torch.Tensor
    loss_mask: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    cu_seqlens_padded: torch.Tensor
    max_seqlen: int
    keys: list
    visual: list = field(default_factory=list)       # per image/video: {"pixels", "sizes", "keys", "frames"}
    audio: list = field(default_factory=list)        # per audio: {"features", "lengths", "keys"}
    media_spans: list = field(default_factory=list)  # per item, placeholder order (see PackedBatch)
