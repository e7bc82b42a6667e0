"""``PackedBatch``: a micro-batch of packed rows (see the package docstring)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from energon_nemotron.batch.checks import check_media
from energon_nemotron.batch.media import BatchMedia, MediaSpan
from energon_nemotron.batch.padding import alignment_padding
from energon_nemotron.tensors.flat import pack, unpack

#: the label of a position that is not trained
IGNORE_INDEX = -100
#: the ``PackedBatch`` fields pickled in one flat buffer
_FLAT_FIELDS = ("tokens", "labels", "loss_mask", "position_ids", "padding_mask", "cu_seqlens", "cu_seqlens_padded")

__all__ = ["PackedBatch", "IGNORE_INDEX"]


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
    - ``padding_mask``: bool [B, S], True at every position that holds no token of a segment
      (alignment padding and the row's tail; ``batch.padding``): never trained, and excluded from
      a mixture-of-experts router's statistics. Derived from the boundaries when not given (the
      Energon layout); the Megatron-LM path gives it (its pads sit inside the segments).
    - ``media``: the media items' tensors (:class:`BatchMedia`; Energon path, empty on the
      Megatron-LM path).
    - ``media_spans``: per row, one :class:`MediaSpan` per media item, in placeholder order
      (row position); ``media`` holds the items in the same order, row after row.
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
    padding_mask: Any = None
    media: BatchMedia = field(default_factory=BatchMedia)
    #: per-reason counts of samples skipped since the previous batch of the same worker
    skipped: dict[str, int] = field(default_factory=dict)
    #: per row, one ``MediaSpan`` per media item in placeholder order
    media_spans: list[list[MediaSpan]] = field(default_factory=list)
    #: multi-token-prediction layers of the model (0: none); ``parallel.mtp_targets`` accepts depths up to it
    mtp_num_layers: int = 0
    #: set by Energon's batching so a batch can be restored from its samples
    __restore_key__: tuple = ()

    def __post_init__(self) -> None:
        if not self.is_padding:
            self.is_padding = [False] * self.tokens.shape[0]
        if self.padding_mask is None:
            s = self.tokens.shape[1]
            self.padding_mask = torch.stack([alignment_padding(c, p, s) for c, p in
                                             zip(self.cu_seqlens, self.cu_seqlens_padded)]).to(self.tokens.device) \
                if self.cu_seqlens else torch.zeros(self.tokens.shape, dtype=torch.bool)
        if not self.media_spans:
            self.media_spans = [[] for _ in range(self.tokens.shape[0])]
        if not isinstance(self.media, BatchMedia):
            raise TypeError(f"PackedBatch.media must be a BatchMedia, got {type(self.media).__name__} "
                            "(a dict of its fields: BatchMedia(**d))")
        for row in self.media_spans:
            for span in row:
                if not isinstance(span, MediaSpan):
                    raise TypeError(f"PackedBatch.media_spans holds MediaSpans, got {type(span).__name__}")

    def __getstate__(self) -> dict:
        """Pickled with its token tensors in one flat buffer (``flat_tensors``): a batch leaves a
        ``DataLoader`` worker by value (up to 1 MiB) or as one shared-memory segment, instead of
        one segment per tensor. ``media`` (a ``BatchMedia``) pickles as its ``PackedTensor``s do."""
        state = dict(self.__dict__)
        rows = len(self.cu_seqlens)
        tensors = [self.tokens, self.labels, self.loss_mask, self.position_ids, self.padding_mask,
                   *self.cu_seqlens, *self.cu_seqlens_padded]
        packed = pack(tensors) if len(self.cu_seqlens_padded) == rows else None
        if packed is not None:
            for name in _FLAT_FIELDS:
                del state[name]
            state["_flat"] = (*packed, rows)
        return state

    def __setstate__(self, state: dict) -> None:
        flat = state.pop("_flat", None)
        if flat is not None:
            buffer, layout, rows = flat
            views = unpack(buffer, layout)
            state.update(tokens=views[0], labels=views[1], loss_mask=views[2], position_ids=views[3],
                         padding_mask=views[4], cu_seqlens=views[5:5 + rows],
                         cu_seqlens_padded=views[5 + rows:5 + 2 * rows])
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
        """Check the contract (dtypes, shapes, boundaries, media against their spans: see
        :func:`~energon_nemotron.batch.checks.check_media`); raise ``ValueError`` on a violation."""
        b, s = self.tokens.shape
        for name, dtype in (("tokens", torch.int64), ("labels", torch.int64), ("loss_mask", torch.float32),
                            ("position_ids", torch.int64), ("padding_mask", torch.bool)):
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
        if bool(((self.loss_mask != 0) & self.padding_mask).any()):
            raise ValueError("loss_mask is 1 at a position padding_mask marks as padding")
        if len(self.media_spans) != b:
            raise ValueError(f"PackedBatch.media_spans: expected {b} rows")
        check_media(self)

    def media_items(self, row: int) -> list[tuple[MediaSpan, int]]:
        """Row ``row``'s spans in stored (placeholder) order, each with the index of its item in
        ``media``: in the visual fields (``pixel_values``, ``image_sizes``, ``num_frames``, ``num_units``) for an
        image or video, in the audio fields (``sound_features``, ``sound_lengths``) for audio.
        ``media`` lists every row's items row after row, each row's in its spans' order (what
        ``validate`` checks), so a row's items follow those of the rows before it."""
        visual = sum(1 for r in range(row) for s in self.media_spans[r] if not s.is_audio)
        audio = sum(1 for r in range(row) for s in self.media_spans[r] if s.is_audio)
        out = []
        for span in self.media_spans[row]:
            if span.is_audio:
                out.append((span, audio))
                audio += 1
            else:
                out.append((span, visual))
                visual += 1
        return out

    def row(self, i: int) -> dict[str, Any]:
        """Row ``i`` as a dict of 1-D tensors and metadata."""
        return {
            "tokens": self.tokens[i],
            "labels": self.labels[i],
            "loss_mask": self.loss_mask[i],
            "position_ids": self.position_ids[i],
            "padding_mask": self.padding_mask[i],
            "cu_seqlens": self.cu_seqlens[i],
            "cu_seqlens_padded": self.cu_seqlens_padded[i],
            "max_seqlen": self.max_seqlen[i],
            "sample_keys": self.sample_keys[i],
            "is_padding": self.is_padding[i],
            "media_spans": self.media_spans[i],
        }

    def replace(self, **changes: Any) -> "PackedBatch":
        """A shallow copy with some fields replaced (``__restore_key__`` kept)."""
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
        return self.replace(
            tokens=fn(self.tokens), labels=fn(self.labels), loss_mask=fn(self.loss_mask),
            position_ids=fn(self.position_ids), padding_mask=fn(self.padding_mask),
            cu_seqlens=[fn(c) for c in self.cu_seqlens],
            cu_seqlens_padded=[fn(c) for c in self.cu_seqlens_padded],
            media=self.media.map(fn),
            max_seqlen=list(self.max_seqlen), sample_keys=[list(k) for k in self.sample_keys],
            is_padding=list(self.is_padding), skipped=dict(self.skipped))
