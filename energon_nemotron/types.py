"""Data types shared by both input paths. ``PackedBatch`` is the one output type of the library.

Energon path: a cooker turns a crude sample into a ``Conversation`` (messages + lazy ``MediaRef``s,
nothing decoded); the task encoder turns it into an ``EncodedSample`` (tokens, trained-token flags,
packing cost, media plans), packs those and emits ``PackedBatch``es.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

import numpy as np
import torch
from megatron.energon import Sample, edataclass

IGNORE_INDEX = -100
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
    prompt format (every segment of the row gets them).
    """

    messages: list[Message]
    media: list[MediaRef] = field(default_factory=list)
    segments: list[int] = field(default_factory=lambda: [0])
    preformatted: bool = False
    tools: list[dict] = field(default_factory=list)

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
    visual: list = field(default_factory=list)       # per image/video: {"pixels", "sizes", "keys"}
    audio: list = field(default_factory=list)        # per audio: {"features", "lengths", "keys"}
    media_spans: list = field(default_factory=list)  # per item, placeholder order (see PackedBatch)


#: the ``PackedBatch`` fields pickled in one flat buffer
_FLAT_FIELDS = ("tokens", "labels", "loss_mask", "position_ids", "cu_seqlens", "cu_seqlens_padded")


@dataclass
class PackedBatch:
    """A micro-batch of packed rows, ready for a Megatron model with ``qkv_format="thd"``.

    B = rows in the micro-batch (usually 1), S = sequence length.

    - ``tokens``: int64 [B, S] input ids.
    - ``labels``: int64 [B, S] next-token targets, target-aligned; ``-100`` where not trained
      (the Megatron-LM path also keeps the pad id at pad positions, as Megatron-LM does).
    - ``loss_mask``: float32 [B, S], 1 where ``labels`` is trained; the authority for the loss.
    - ``position_ids``: int64 [B, S], restarting at 0 for every packed segment.
    - ``cu_seqlens``: per row, int32 [n_i + 1], true segment boundaries (first 0, last S).
    - ``cu_seqlens_padded``: per row, int32 [n_i + 1], boundaries including per-segment padding.
    - ``max_seqlen``: per row, the longest padded segment.
    - ``sample_keys``: per row, the key of every source in order.
    - ``is_padding``: per row, True for a row that only evens out data-parallel ranks
      (its ``loss_mask`` is all zero).
    - ``media``: named ``PackedTensor``s (Energon path; empty on the Megatron-LM path).
    """

    tokens: torch.Tensor
    labels: torch.Tensor
    loss_mask: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: list[torch.Tensor]
    cu_seqlens_padded: list[torch.Tensor]
    max_seqlen: list[int]
    sample_keys: list[list[str]]
    is_padding: list[bool] = field(default_factory=list)
    media: dict[str, Any] = field(default_factory=dict)
    #: per-reason counts of samples skipped since the previous batch of the same worker
    skipped: dict[str, int] = field(default_factory=dict)
    #: per row, one dict per media item in placeholder order: kind, sample_key, token_start (first
    #: placeholder id), num_tokens (embedding tokens), placeholder_len, runs ([offset from
    #: token_start, length] of each run of embedding placeholders), and grid / frames / clips
    media_spans: list[list[dict]] = field(default_factory=list)
    #: multi-token-prediction layers of the model (0: none); ``mtp_targets`` accepts depths up to it
    mtp_num_layers: int = 0
    #: set by Energon's batching so a batch can be restored from its samples
    __restore_key__: tuple = ()

    def __post_init__(self) -> None:
        if not self.is_padding:
            self.is_padding = [False] * self.tokens.shape[0]
        if not self.media_spans:
            self.media_spans = [[] for _ in range(self.tokens.shape[0])]

    def __getstate__(self) -> dict:
        """Pickled with its token tensors in one flat buffer (``flat_tensors``): a batch leaves a
        ``DataLoader`` worker by value (up to 1 MiB) or as one shared-memory segment, instead of
        one segment per tensor. ``media`` pickles as its ``PackedTensor``s do."""
        from energon_nemotron.tensors.flat import pack

        state = dict(self.__dict__)
        rows = len(self.cu_seqlens)
        tensors = [self.tokens, self.labels, self.loss_mask, self.position_ids, *self.cu_seqlens,
                   *self.cu_seqlens_padded]
        packed = pack(tensors) if len(self.cu_seqlens_padded) == rows else None
        if packed is not None:
            for name in _FLAT_FIELDS:
                del state[name]
            state["_flat"] = (*packed, rows)
        return state

    def __setstate__(self, state: dict) -> None:
        from energon_nemotron.tensors.flat import unpack

        flat = state.pop("_flat", None)
        if flat is not None:
            buffer, layout, rows = flat
            views = unpack(buffer, layout)
            state.update(tokens=views[0], labels=views[1], loss_mask=views[2], position_ids=views[3],
                         cu_seqlens=views[4:4 + rows], cu_seqlens_padded=views[4 + rows:4 + 2 * rows])
        self.__dict__.update(state)

    @property
    def batch_size(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def seq_length(self) -> int:
        return int(self.tokens.shape[1])

    @property
    def num_valid_tokens(self) -> int:
        """Number of trained label positions (``loss_mask.sum()``)."""
        return int(self.loss_mask.sum().item())

    def validate(self) -> None:
        """Check the contract (dtypes, shapes, boundaries); raise ``ValueError`` on a violation."""
        b, s = self.tokens.shape
        for name, dtype in (("tokens", torch.int64), ("labels", torch.int64),
                            ("loss_mask", torch.float32), ("position_ids", torch.int64)):
            t = getattr(self, name)
            if t.dtype != dtype or tuple(t.shape) != (b, s):
                raise ValueError(f"PackedBatch.{name}: expected {dtype} [{b}, {s}], "
                                 f"got {t.dtype} {list(t.shape)}")
        for name in ("cu_seqlens", "cu_seqlens_padded", "max_seqlen", "sample_keys", "is_padding"):
            if len(getattr(self, name)) != b:
                raise ValueError(f"PackedBatch.{name}: expected {b} rows")
        for i in range(b):
            padded = self.cu_seqlens_padded[i]
            cu = self.cu_seqlens[i]
            for label, c in (("cu_seqlens", cu), ("cu_seqlens_padded", padded)):
                if c.dtype != torch.int32 or c.dim() != 1 or c.numel() < 2:
                    raise ValueError(f"row {i}: {label} must be a 1-D int32 tensor with >= 2 entries")
                if int(c[0]) != 0 or bool((c[1:] < c[:-1]).any()):
                    raise ValueError(f"row {i}: {label} must start at 0 and not decrease")
            if int(padded[-1]) != s:
                raise ValueError(f"row {i}: cu_seqlens_padded must end at {s}, got {int(padded[-1])}")
            if cu.numel() != padded.numel() or bool((cu > padded).any()):
                raise ValueError(f"row {i}: cu_seqlens must pair with cu_seqlens_padded")
            longest = int((padded[1:] - padded[:-1]).max())
            if self.max_seqlen[i] != longest:
                raise ValueError(f"row {i}: max_seqlen {self.max_seqlen[i]} != longest segment {longest}")
        if bool(((self.loss_mask != 0) & (self.labels == IGNORE_INDEX)).any()):
            raise ValueError("loss_mask is 1 at a position whose label is -100")

    def row(self, i: int) -> dict[str, Any]:
        """Row ``i`` as a dict of 1-D tensors and metadata."""
        return {
            "tokens": self.tokens[i],
            "labels": self.labels[i],
            "loss_mask": self.loss_mask[i],
            "position_ids": self.position_ids[i],
            "cu_seqlens": self.cu_seqlens[i],
            "cu_seqlens_padded": self.cu_seqlens_padded[i],
            "max_seqlen": self.max_seqlen[i],
            "sample_keys": self.sample_keys[i],
            "is_padding": self.is_padding[i],
            "media_spans": self.media_spans[i],
        }

    def mtp_targets(self, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Labels int64 [B, S] and loss mask float32 [B, S] of multi-token-prediction depth
        ``depth`` (1-based), as megatron-core's per-segment roll derives them from ``labels`` and
        ``loss_mask`` (``parallel.mtp.roll_targets`` per row over ``cu_seqlens_padded``): no target
        crosses a segment boundary. For inspection and non-Megatron consumers; megatron-core
        computes these itself from the plain labels."""
        from energon_nemotron.parallel.mtp import roll_targets

        if depth < 1 or (self.mtp_num_layers and depth > self.mtp_num_layers):
            raise ValueError(f"MTP depth must be in 1..{self.mtp_num_layers or 'inf'}, got {depth}")
        rolled = [roll_targets(self.labels[i], self.loss_mask[i], self.cu_seqlens_padded[i], depth)
                  for i in range(self.batch_size)]
        return torch.stack([r[0] for r in rolled]), torch.stack([r[1] for r in rolled])

    def _replace(self, **changes: Any) -> "PackedBatch":
        """A shallow copy with some fields replaced (``__restore_key__`` kept)."""
        import dataclasses

        out = dataclasses.replace(self, **changes)
        out.__restore_key__ = self.__restore_key__
        return out

    def pin_memory(self) -> "PackedBatch":
        """Page-locked copies of the tensors (what a ``DataLoader`` with ``pin_memory`` calls)."""
        return self._map(lambda t: t.pin_memory())

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "PackedBatch":
        """Copy the tensors to ``device`` (boundaries stay int32, loss_mask stays float32)."""
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def _map(self, fn) -> "PackedBatch":
        """A copy with ``fn`` applied to every tensor and ``PackedTensor`` (rows, boundaries, media)."""
        return self._replace(
            tokens=fn(self.tokens), labels=fn(self.labels), loss_mask=fn(self.loss_mask),
            position_ids=fn(self.position_ids), cu_seqlens=[fn(c) for c in self.cu_seqlens],
            cu_seqlens_padded=[fn(c) for c in self.cu_seqlens_padded],
            media={k: fn(v) for k, v in self.media.items()},
            max_seqlen=list(self.max_seqlen), sample_keys=[list(k) for k in self.sample_keys],
            is_padding=list(self.is_padding), skipped=dict(self.skipped))

    def packed_seq_params(self, i: int = 0, exact_lengths: bool = False, **kwargs: Any):
        """megatron-core ``PackedSeqParams`` (``qkv_format="thd"``) for row ``i``.

        Default (safe for multi-token prediction and context parallelism): ``cu_seqlens_q`` =
        ``cu_seqlens_q_padded`` = the padded boundaries. megatron-core's MTP roll
        (``roll_tensor`` over ``packed_seq_params``) reads ``cu_seqlens_q`` as physical offsets, and
        with CP divides them by the CP size, so real lengths there would roll trained targets onto
        pads and across segments. Causal attention over a segment's trailing pads leaves its real
        tokens unchanged (Megatron-LM's SFT path keeps its pads inside the segments the same way).
        ``exact_lengths=True``: ``cu_seqlens_q`` = the real lengths and ``cu_seqlens_q_padded`` the
        padded ones where they differ (attention skips the pads; only for models without MTP).
        ``total_tokens`` (the row width; megatron-core derives the Mamba layers' ``seq_idx`` from
        it) is set when the installed megatron-core's ``PackedSeqParams`` has the field.
        Needs the ``megatron`` extra.
        """
        import dataclasses

        from megatron.core.packed_seq_params import PackedSeqParams

        from energon_nemotron.parallel.packed_seq_params import to_packed_seq_params

        padded = self.cu_seqlens_padded[i]
        same = torch.equal(padded, self.cu_seqlens[i])
        if "total_tokens" in {f.name for f in dataclasses.fields(PackedSeqParams)}:
            kwargs.setdefault("total_tokens", self.seq_length)
        if not exact_lengths:
            return to_packed_seq_params(padded, self.max_seqlen[i], cu_seqlens_padded=padded, **kwargs)
        return to_packed_seq_params(self.cu_seqlens[i], self.max_seqlen[i],
                                    cu_seqlens_padded=None if same else padded, **kwargs)
