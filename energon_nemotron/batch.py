"""``PackedBatch``: the one output type of the library, produced by both input paths.

A micro-batch of packed rows ready for a Megatron model with ``qkv_format="thd"``: the token
tensors, the segment boundaries, and per row the sources and media it holds (``MediaSpan``: where
each media item sits; ``BatchMedia``: the items' processed tensors). What a consumer derives from
it (megatron-core ``PackedSeqParams``, multi-token-prediction targets, a context-parallel slice, a
TP broadcast) lives in ``parallel/``; the Megatron-Bridge step dicts in ``integrations/``.
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import torch

from energon_nemotron.tensors import PackedTensor
from energon_nemotron.tensors.flat import pack, unpack

#: the label of a position that is not trained
IGNORE_INDEX = -100

__all__ = ["PackedBatch", "MediaSpan", "BatchMedia", "IGNORE_INDEX", "MEDIA_KINDS"]

#: the ``PackedBatch`` fields pickled in one flat buffer
_FLAT_FIELDS = ("tokens", "labels", "loss_mask", "position_ids", "cu_seqlens", "cu_seqlens_padded")
#: the kinds of media item; ``image`` and ``video`` are the visual ones
MEDIA_KINDS = ("image", "video", "audio")


@dataclass(frozen=True)
class MediaSpan:
    """One media item of a packed row: where its placeholder sits and what it holds.

    - ``kind``: ``image``, ``video`` or ``audio``; ``sample_key``: the key of the source it is in.
    - ``token_start``: row position of the placeholder's first id; ``placeholder_len``: ids of the
      whole placeholder (``<img>`` … ``</img>``, a video's frame texts, ``<so_start>`` … ``<so_end>``).
    - ``num_tokens``: embedding tokens (placeholder ids the model replaces with embeddings).
    - ``runs``: ``(offset from token_start, length)`` of each run of embedding placeholder ids, in
      order (one per image, tile set or video tubelet; one per audio); the lengths sum to ``num_tokens``.
    - ``grid``: ``(grid_h, grid_w)`` patch grid of each unit (image, tile or frame; visual kinds);
      ``tiles``: units of a tiled image (only when more than one); ``frames``: a video's frames;
      ``clips``: an audio's clips.

    Lists given for ``runs`` and ``grid`` are stored as tuples (of ints: ``TypeError`` otherwise).
    """

    kind: str
    sample_key: str
    token_start: int
    num_tokens: int
    placeholder_len: int
    runs: tuple[tuple[int, int], ...]
    grid: Optional[tuple[int, int]] = None
    tiles: Optional[int] = None
    frames: Optional[int] = None
    clips: Optional[int] = None

    def __post_init__(self) -> None:
        if self.kind not in MEDIA_KINDS:
            raise ValueError(f"MediaSpan of {self.sample_key}: kind must be one of {MEDIA_KINDS}, got {self.kind!r}")
        index = operator.index                 # ints only (TypeError for a float or a str)
        object.__setattr__(self, "runs", tuple((index(offset), index(n)) for offset, n in self.runs))
        if self.grid is not None:
            gh, gw = self.grid
            object.__setattr__(self, "grid", (index(gh), index(gw)))

    @property
    def is_audio(self) -> bool:
        return self.kind == "audio"

    def as_dict(self) -> dict[str, Any]:
        """The span as the plain dict the preview prints (its JSON ``media`` entries, the text
        view): ``kind``, ``num_tokens``, ``placeholder_len``, ``runs`` (lists), then ``grid`` and
        ``tiles`` (image), ``frames`` and ``grid`` (video) or ``clips`` (audio) where set, then
        ``sample_key`` and ``token_start``."""
        out: dict[str, Any] = {"kind": self.kind, "num_tokens": self.num_tokens,
                               "placeholder_len": self.placeholder_len, "runs": [list(r) for r in self.runs]}
        order = ("frames", "grid", "tiles", "clips") if self.kind == "video" else ("grid", "tiles", "frames", "clips")
        for name in order:
            value = getattr(self, name)
            if value is not None:
                out[name] = list(value) if name == "grid" else value
        out["sample_key"] = self.sample_key
        out["token_start"] = self.token_start
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "MediaSpan":
        """Inverse of :meth:`as_dict` (``TypeError`` on a missing or unknown key)."""
        return cls(**d)


#: the tensor fields of ``BatchMedia`` (what its dict-style view holds), in order
_MEDIA_TENSORS = ("pixel_values", "image_sizes", "num_frames", "sound_features", "sound_lengths")


@dataclass(frozen=True, eq=False)
class BatchMedia:
    """The processed media items of a batch, every row's: row after row, each row's items in the
    order of its ``media_spans``. Visual items (image and video spans) are in the first four fields,
    audio items in the last two; the fields of a kind the batch lacks are None. Energon path only.

    - ``pixel_values``: ``PackedTensor``, per visual item float32 [P_i, 3·p·p] (p = ``patch_size``;
      rows are patches of C·p·p values, (C, p, p) flattened, raster order; deduplicated: an image
      used twice or a video's repeated frames are stored once).
    - ``image_sizes``: ``PackedTensor``, per visual item int32 [units_i, 2]: the (grid_h, grid_w)
      patch grid of each image, tile or frame.
    - ``num_frames``: int32 [N_visual]: units per visual item.
    - ``patch_size``: p, pixels per patch side of ``pixel_values`` (as the media options set it).
    - ``sound_features``: ``PackedTensor``, per audio item float32 [clips_i, F, mel] (F: the
      batch's longest clip, shorter ones zero-padded; deduplicated).
    - ``sound_lengths``: ``PackedTensor``, per audio item int64 [clips_i]: mel frames of each clip.

    Read-only dict-style access (``media["pixel_values"]``, ``keys()``, ``values()``, ``items()``,
    ``in``, ``len``, truth) covers the tensor fields that are set, as the dict this type replaced
    held them; ``patch_size`` is an attribute only. :meth:`PackedBatch.media_items` says which
    items are a row's.
    """

    pixel_values: Optional[PackedTensor] = None
    image_sizes: Optional[PackedTensor] = None
    num_frames: Optional[torch.Tensor] = None
    patch_size: Optional[int] = None
    sound_features: Optional[PackedTensor] = None
    sound_lengths: Optional[PackedTensor] = None

    @property
    def num_visual(self) -> int:
        """Visual items (image and video) of the batch."""
        return 0 if self.pixel_values is None else len(self.pixel_values)

    @property
    def num_audio(self) -> int:
        """Audio items of the batch."""
        return 0 if self.sound_features is None else len(self.sound_features)

    def present(self) -> list[tuple[str, Any]]:
        """``(field name, value)`` of every field that is set (``patch_size`` too), in field order."""
        return [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self) if getattr(self, f.name) is not None]

    def map(self, fn: Callable[[Any], Any]) -> "BatchMedia":
        """A copy with ``fn`` applied to every tensor and ``PackedTensor`` that is set."""
        return dataclasses.replace(self, **{k: fn(v) for k, v in self.items()})

    # -- read-only dict-style view of the tensor fields ------------------------------------------
    def keys(self) -> list[str]:
        return [k for k in _MEDIA_TENSORS if getattr(self, k) is not None]

    def values(self) -> list[Any]:
        return [getattr(self, k) for k in self.keys()]

    def items(self) -> list[tuple[str, Any]]:
        return [(k, getattr(self, k)) for k in self.keys()]

    def get(self, name: str, default: Any = None) -> Any:
        return getattr(self, name) if name in self else default

    def __getitem__(self, name: str) -> Any:
        if name not in self:
            raise KeyError(name)
        return getattr(self, name)

    def __contains__(self, name: object) -> bool:
        return name in _MEDIA_TENSORS and getattr(self, str(name)) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())


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
        tensors = [self.tokens, self.labels, self.loss_mask, self.position_ids, *self.cu_seqlens,
                   *self.cu_seqlens_padded]
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
        """Check the contract (dtypes, shapes, boundaries, media against their spans: see
        :func:`_check_media`); raise ``ValueError`` on a violation."""
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
        if len(self.media_spans) != b:
            raise ValueError(f"PackedBatch.media_spans: expected {b} rows")
        _check_media(self)

    def media_items(self, row: int) -> list[tuple[MediaSpan, int]]:
        """Row ``row``'s spans in stored (placeholder) order, each with the index of its item in
        ``media``: in the visual fields (``pixel_values``, ``image_sizes``, ``num_frames``) for an
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
            position_ids=fn(self.position_ids), cu_seqlens=[fn(c) for c in self.cu_seqlens],
            cu_seqlens_padded=[fn(c) for c in self.cu_seqlens_padded],
            media=self.media.map(fn),
            max_seqlen=list(self.max_seqlen), sample_keys=[list(k) for k in self.sample_keys],
            is_padding=list(self.is_padding), skipped=dict(self.skipped))


# -- validate(): the media against their spans --------------------------------------------------------
def _span_error(row: int, span: MediaSpan, what: str) -> ValueError:
    return ValueError(f"row {row}, {span.kind} of {span.sample_key}: {what}")


def _check_span(row: int, span: MediaSpan, keys: list[str], seq: int, after: int) -> None:
    """``span`` against its row: its sample is one of the row's ``keys``, its placeholder lies in
    the row (``seq`` positions) at or after ``after`` (the previous span's end), its runs inside
    the placeholder holding ``num_tokens``, and it has the fields of its kind."""
    end = span.token_start + span.placeholder_len
    if span.sample_key not in keys:
        raise _span_error(row, span, f"not a sample of the row ({keys})")
    if span.token_start < after or end > seq:
        raise _span_error(row, span, f"placeholder [{span.token_start}, {end}) is not inside the row of {seq} "
                                     f"positions, after the previous span (ending at {after})")
    for offset, n in span.runs:
        if n < 1 or offset < 0 or offset + n > span.placeholder_len:
            raise _span_error(row, span, f"run ({offset}, {n}) is not inside its placeholder of "
                                         f"{span.placeholder_len} ids")
    if sum(n for _, n in span.runs) != span.num_tokens:
        raise _span_error(row, span, f"runs {[list(r) for r in span.runs]} do not hold its {span.num_tokens} tokens")
    if (span.clips is None) == span.is_audio or (span.grid is None) != span.is_audio:
        raise _span_error(row, span, "an audio span needs clips, an image or video span a grid")


def _run_id(row: int, span: MediaSpan, ids: list[int]) -> int:
    """The one token id of ``span``'s embedding runs in the row's ``ids``."""
    found: set[int] = set()
    for offset, n in span.runs:
        start = span.token_start + offset
        run = set(ids[start:start + n])
        if len(run) != 1:
            raise _span_error(row, span, f"positions {start}..{start + n - 1} are not one run of a placeholder id")
        found |= run
    if len(found) != 1:
        raise _span_error(row, span, f"its runs hold different ids {sorted(found)}")
    return found.pop()


def _check_rows(batch: "PackedBatch") -> None:
    """Every span against its row (:func:`_check_span`); every embedding run one id, the same for
    every visual span of the batch and the same for every audio span."""
    first: dict[bool, tuple[int, int, str]] = {}          # is_audio -> (id, row, sample key) of the first span
    for r, spans in enumerate(batch.media_spans):
        if not spans:
            continue
        ids, after = batch.tokens[r].tolist(), 0
        for span in spans:
            _check_span(r, span, batch.sample_keys[r], batch.seq_length, after)
            after = span.token_start + span.placeholder_len
            got = _run_id(r, span, ids)
            want = first.setdefault(span.is_audio, (got, r, span.sample_key))
            if got != want[0]:
                raise _span_error(r, span, f"embedding id {got}, but {want[2]} (row {want[1]}) has {want[0]}")


def _count(value: Any) -> int:
    if value is None:
        return 0
    return int(value.numel()) if isinstance(value, torch.Tensor) else len(value)


def _check_counts(label: str, spans: list[tuple[int, MediaSpan]], media: BatchMedia, names: tuple[str, ...]) -> None:
    """Each field of ``names`` holds one item per span of ``spans`` (``(row, span)``, batch order)."""
    for name in names:
        n = _count(getattr(media, name))
        if n < len(spans):
            r, span = spans[n]
            raise _span_error(r, span, f"no {label} item {n} in media.{name}, which holds {n}")
        if n > len(spans):
            raise ValueError(f"media.{name} holds {n} {label} items, the media spans name {len(spans)}")


def _check_visual(visual: list[tuple[int, MediaSpan]], media: BatchMedia) -> None:
    """Each visual item against its span: units (``num_frames``, ``image_sizes``), their grid, the
    tiles of an image or frames of a video, its patch rows; ``patch_size`` against the rows' width."""
    p = media.patch_size
    if not isinstance(p, int) or isinstance(p, bool) or p < 1:
        raise ValueError(f"media.patch_size must be a positive int with visual items, got {p!r}")
    if media.pixel_values.feature_shape != (3 * p * p,):
        raise ValueError(f"media.pixel_values rows are {list(media.pixel_values.feature_shape)}, "
                         f"patches of {p} px are [{3 * p * p}]")
    units_of, rows_of = media.image_sizes.lengths().tolist(), media.pixel_values.lengths().tolist()
    frames_of = media.num_frames.reshape(-1).tolist()
    for k, (r, span) in enumerate(visual):
        units, (gh, gw) = units_of[k], span.grid
        grids = media.image_sizes[k].tolist()
        if frames_of[k] != units:
            raise _span_error(r, span, f"media.num_frames says {frames_of[k]} units, image_sizes holds {units}")
        if any(g != [gh, gw] for g in grids):
            raise _span_error(r, span, f"image_sizes {grids} are not its grid {[gh, gw]}")
        if span.kind == "image" and units != (span.tiles or 1):
            raise _span_error(r, span, f"{units} units in image_sizes, its tiles are {span.tiles or 1}")
        if span.kind == "video" and (span.frames is None or units < span.frames):
            raise _span_error(r, span, f"{units} frames in image_sizes, fewer than its {span.frames}")
        if rows_of[k] != units * gh * gw:
            raise _span_error(r, span, f"{rows_of[k]} patch rows in media.pixel_values; {units} units of "
                                       f"{gh}x{gw} patches are {units * gh * gw}")


def _check_audio(audio: list[tuple[int, MediaSpan]], media: BatchMedia) -> None:
    """Each audio item holds its span's clips (``sound_features`` and ``sound_lengths``)."""
    features, lengths = media.sound_features.lengths().tolist(), media.sound_lengths.lengths().tolist()
    for k, (r, span) in enumerate(audio):
        if features[k] != span.clips or lengths[k] != span.clips:
            raise _span_error(r, span, f"{span.clips} clips, media holds {features[k]} in sound_features and "
                                       f"{lengths[k]} in sound_lengths")


def _check_media(batch: "PackedBatch") -> None:
    """The media spans against the rows (:func:`_check_rows`) and the media items against the
    spans: one visual item per image or video span, one audio item per audio span, in batch order,
    each with what its span says (:func:`_check_visual`, :func:`_check_audio`)."""
    _check_rows(batch)
    spans = [(r, s) for r, row in enumerate(batch.media_spans) for s in row]
    visual = [(r, s) for r, s in spans if not s.is_audio]
    audio = [(r, s) for r, s in spans if s.is_audio]
    _check_counts("visual", visual, batch.media, ("pixel_values", "image_sizes", "num_frames"))
    _check_counts("audio", audio, batch.media, ("sound_features", "sound_lengths"))
    if visual:
        _check_visual(visual, batch.media)
    if audio:
        _check_audio(audio, batch.media)
