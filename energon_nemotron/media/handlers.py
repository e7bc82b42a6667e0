"""Media in the task encoder: metadata → plan → placeholder tokens (phase 1), decode → tensors (phase 2).

Phase 1 (``preencode_sample``) reads only headers: an image's size, a video's duration, frame count
and fps, an audio's duration and sample rate. The plan fixes every token count, so the packer sees
exact costs before anything is decoded. Phase 2 (``postencode_sample``) decodes only the media of
samples selected into a pack, and checks that what it produced matches the plan.

Placeholders (token ids spliced where a message references the item):

- image: ``<img>`` + ``<image>`` × tokens + ``</img>``
- video: per tubelet ``Frame 1 sampled at … seconds and frame 2 sampled at … seconds: `` + ``<img>`` +
  ``<image>`` × tokens + ``</img>``, tubelets separated by ``\\n`` (the Omni processor's layout); the
  ``bridge`` and ``midpoints`` samplings put ``This is a video:\\n`` first
- audio: ``<so_start>`` + ``<so_embedding>`` × tokens + ``<so_end>``

Each text piece is tokenized on its own, so nothing merges across a placeholder.

Provenance (``process`` returns ``keys``): a key names what a tensor was made from, so a batch
stores a segment used several times once (``tensors.from_keyed``): a digest of the payload
bytes (a file path: of its content as read) with the plan and options that shape the tensor (same
bytes, another plan: another key). An image or audio item is one segment; a video one segment per
frame (``"<video key>:<distinct frame>"``), so repeated frames and the same video twice share rows.
"""

from __future__ import annotations

import hashlib
import math
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import torch

from energon_nemotron.batch import MediaSpan
from energon_nemotron.errors import ConfigError, MediaError
from energon_nemotron.media.draws import uniforms
from energon_nemotron.telemetry import SharedCounter
from energon_nemotron.tokenization.reserved import PLACEHOLDER_TOKENS
from energon_nemotron.types import MediaRef

#: the placeholder tokens the items of each modality are spliced with
MODALITY_TOKENS = {"image": ("<img>", "<image>", "</img>"), "video": ("<img>", "<image>", "</img>"),
                   "audio": ("<so_start>", "<so_embedding>", "<so_end>")}
VIDEO_INTRO = "This is a video:\n"
#: columns of the media telemetry counter
MEDIA_COUNTERS = ("image", "video", "audio", "audio_truncated")


@dataclass
class PlannedMedia:
    """One media item after phase 1: its plan and the token ids of its placeholder.

    ``token_start`` (position of the placeholder's first id inside its source) and ``source`` are
    filled in by tokenization. ``runs``: ``(offset, length)`` inside ``placeholder`` of each run of
    ids the model replaces with embeddings (``<image>`` per image, tile set or tubelet;
    ``<so_embedding>`` per audio), in order. ``augment``: what the augmentation drew for the item,
    for people (``media.augment``; None: not augmented).
    """

    index: int
    modality: str
    plan: Any
    placeholder: list[int]
    num_tokens: int
    source: int = 0
    token_start: int = 0
    runs: list = field(default_factory=list)
    augment: Optional[str] = None

    def describe(self, sample_key: str, token_start: int) -> MediaSpan:
        """The item's span once placed: ``sample_key`` (its source's key), ``token_start`` (row
        position of the placeholder's first id), its kind, tokens, placeholder length, the
        embedding runs (offsets from ``token_start``), and grid / tiles / frames / clips."""
        p = self.plan
        common = {"kind": self.modality, "sample_key": sample_key, "token_start": int(token_start),
                  "num_tokens": self.num_tokens, "placeholder_len": len(self.placeholder), "runs": self.runs,
                  "augment": self.augment}
        if self.modality == "image":
            return MediaSpan(**common, grid=(p.grid_h, p.grid_w), tiles=p.num_units if p.num_units > 1 else None)
        if self.modality == "video":
            return MediaSpan(**common, frames=p.num_frames, grid=(p.grid_h, p.grid_w))
        return MediaSpan(**common, clips=p.num_clips)


def metadata_number(metadata: dict, name: str, kind: str, whole: bool = True) -> Any:
    """``metadata[name]`` when it is a positive finite number (``whole``: an integer value, returned
    as ``int``); else a ``MediaError`` naming the field and the value (reason ``invalid_sample``)."""
    value = metadata.get(name)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if not ok or (whole and not float(value).is_integer()):
        raise MediaError(f"{kind} metadata {name}: {value!r} is not a positive {'whole ' if whole else ''}number",
                         code="invalid_sample")
    return int(value) if whole else float(value)


def given_video_metadata(metadata: dict) -> dict:
    """A cooker's video metadata, checked field by field; without ``num_frames`` the count is
    ``round(duration * fps)`` (as read from a header that records none)."""
    out = dict(metadata)
    for name in ("width", "height"):
        out[name] = metadata_number(metadata, name, "video")
    for name in ("duration", "fps"):
        out[name] = metadata_number(metadata, name, "video", whole=False)
    if metadata.get("num_frames") is None:
        out["num_frames"] = max(1, round(out["duration"] * out["fps"]))
    else:
        out["num_frames"] = metadata_number(metadata, "num_frames", "video")
    return out


@contextmanager
def naming_origin(ref: MediaRef) -> Iterator[None]:
    """A ``MediaError`` raised inside, about ``ref``, says where its bytes were read from when the
    payload knows (an aux source entry's ``origin()``: its shard), so a damaged shard is named."""
    try:
        yield
    except MediaError as e:
        origin = getattr(ref.payload, "origin", None)
        where = origin() if callable(origin) else None
        if not where or where in str(e):
            raise
        raise MediaError(f"{e} (read from {where})", code=e.code) from None


def read_payload(ref: MediaRef, max_bytes: Optional[int] = None) -> bytes | str | os.PathLike:
    """The item's bytes or file path (an object with ``.get()``, e.g. an Energon ``Lazy``, is
    resolved); larger than ``max_bytes`` is a ``MediaError`` before anything is decoded."""
    payload = ref.payload
    known = payload.size() if hasattr(payload, "size") and callable(payload.size) else None
    if max_bytes is not None and known is not None and known > max_bytes:      # an aux entry: before reading it
        raise MediaError(f"{ref.modality} {ref.name}: {known} bytes, over max_media_bytes {max_bytes}",
                         code="media_too_large")
    if hasattr(payload, "get") and not isinstance(payload, (bytes, dict)):
        payload = payload.get()
    if isinstance(payload, (bytes, bytearray, memoryview)):
        payload = bytes(payload)
        size = len(payload)
    elif isinstance(payload, (str, os.PathLike)):
        try:
            size = os.path.getsize(payload)
        except OSError as e:
            raise MediaError(f"{ref.modality} {ref.name}: {e}") from None
    else:
        raise MediaError(f"{ref.modality} {ref.name or ''}: unsupported payload type {type(payload).__name__}")
    if max_bytes is not None and size > max_bytes:
        raise MediaError(f"{ref.modality} {ref.name}: {size} bytes, over max_media_bytes {max_bytes}",
                         code="media_too_large")
    return payload


def payload_digest(payload: bytes | str | os.PathLike) -> str:
    """Hex BLAKE2b-128 of the payload's bytes (a path: of the file's content, read in 1 MiB blocks)."""
    h = hashlib.blake2b(digest_size=16)
    if isinstance(payload, (bytes, bytearray, memoryview)):
        h.update(payload)
        return h.hexdigest()
    try:
        with open(payload, "rb") as f:
            for block in iter(lambda: f.read(2**20), b""):
                h.update(block)
    except OSError as e:
        raise MediaError(f"{payload}: {e}") from None
    return h.hexdigest()


def provenance_key(modality: str, digest: str, plan: Any, options: Any = None) -> str:
    """The key of a processed item: ``modality``, the payload ``digest`` and the ``repr`` of the
    (frozen dataclass) ``plan`` and ``options`` that shape its tensor, hashed (hex, 32 chars)."""
    text = "\x1f".join((modality, digest, repr(plan), repr(options)))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


@dataclass
class MediaHandlers:
    """Plans and processes media with per-modality options (dataclasses from ``media.image``,
    ``media.video`` and ``media.audio``)."""

    tokenizer: Any
    text: Any                                   # TextEncoder of the tokenizer
    image_options: Any
    video_options: Any
    audio_options: Any
    max_bytes: Optional[int] = None             # per media item, checked before any header is read
    #: media decoded (phase 2), by modality, and audio items cut by ``long_audio: truncate``: a
    #: ``telemetry.SharedCounter`` the loader may replace
    decodes: Any = field(default_factory=lambda: SharedCounter(MEDIA_COUNTERS))
    _ids: Optional[dict] = None
    #: modality -> the placeholder tokens it needs that the tokenizer lacks (resolved when built)
    missing_tokens: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        vocab = self.tokenizer.get_vocab()
        self._ids = {t: vocab[t] for t in PLACEHOLDER_TOKENS if t in vocab}
        missing = {kind: [t for t in tokens if t not in self._ids] for kind, tokens in MODALITY_TOKENS.items()}
        self.missing_tokens = {kind: tokens for kind, tokens in missing.items() if tokens}

    def require(self, modality: str, why: str) -> None:
        """A ``ConfigError`` when the tokenizer lacks a placeholder token of ``modality``; ``why``
        ends the first clause (", and the data has audio")."""
        if modality in self.missing_tokens:
            missing = self.missing_tokens[modality]
            name = getattr(self.tokenizer, "name_or_path", "") or type(self.tokenizer).__name__
            raise ConfigError(
                f"tokenizer {name}: no single token for {', '.join(missing)}, which {modality} placeholders "
                f"need{why}; add them as special tokens (tokenizer.add_special_tokens("
                f"{{'additional_special_tokens': {list(missing)}}}), then tokenizer.save_pretrained(FOLDER)) "
                "or use a Nemotron Omni tokenizer")

    def ids(self, modality: Optional[str] = None) -> dict[str, int]:
        """Ids of the placeholder tokens (each one token of the vocabulary): those of ``modality``
        (``image``, ``video``, ``audio``), else of every modality. A tokenizer without them is a
        ``ConfigError``, raised here by the first item of that modality (a tokenizer for image data
        need not have the audio tokens). This is the last line of defence: with
        ``task_encoder.options.modalities`` set, and for cookers whose every sample holds a
        modality (``register(requires=...)``), the tokens are checked when the encoder and its
        datasets are built (``encoders.modalities``)."""
        for kind in [modality] if modality else list(MODALITY_TOKENS):
            self.require(kind, f", and the data has {kind}" if modality else "")
        return self._ids

    # -- phase 1 ---------------------------------------------------------------------------------
    def plan(self, ref: MediaRef, index: int, draw: Optional[tuple] = None, tiling: bool = False) -> PlannedMedia:
        """Plan one item from its metadata (headers are read when the cooker did not provide them);
        a ``MediaError`` names where the item was read from (:func:`naming_origin`). ``draw``: the
        key of the sample's random draws (``media.draws``: seed, sample key, pass), to which the
        item's index is added; ``tiling``: an image gets NeMo-RL's tiling augmentation (a
        ``data_augment`` dataset in training)."""
        with naming_origin(ref):
            return self._plan(ref, index, None if draw is None else (*draw, index), tiling)

    def _plan(self, ref: MediaRef, index: int, draw: Optional[tuple] = None, tiling: bool = False) -> PlannedMedia:
        ids = self.ids(ref.modality) if ref.modality in MODALITY_TOKENS else {}
        if ref.modality == "image":
            from energon_nemotron.media.image import image_header_size, plan_image

            md = ref.metadata
            if "width" in md and "height" in md:
                width, height = (metadata_number(md, k, "image") for k in ("width", "height"))
            else:
                width, height = image_header_size(read_payload(ref, self.max_bytes))
            augment = tuple(uniforms((*draw, "tiling"), 3)) if tiling and draw is not None else None
            plan = plan_image(width, height, self.image_options, augment)
            n = plan.num_tokens
            return PlannedMedia(index, "image", plan, [ids["<img>"]] + [ids["<image>"]] * n + [ids["</img>"]], n,
                                runs=[(1, n)], augment=None if augment is None else self._tiling_note(width, height, plan))
        if ref.modality == "video":
            from energon_nemotron.media.video import plan_video, video_metadata, video_prompt

            md = given_video_metadata(ref.metadata) if {"width", "height", "duration", "fps"} <= set(ref.metadata) \
                else video_metadata(read_payload(ref, self.max_bytes))
            plan = plan_video(md, self.video_options, draw)
            prompt = video_prompt(plan)
            pieces = self.text.encode_many([VIDEO_INTRO] + [text for text, _ in prompt] + ["\n"])
            intro, texts, newline = pieces[0], pieces[1:-1], pieces[-1]
            tokens, runs = list(intro) if plan.intro else [], []
            for k, (piece, (_, n)) in enumerate(zip(texts, prompt)):
                if k:
                    tokens += newline
                tokens += piece + [ids["<img>"]]
                runs.append((len(tokens), n))
                tokens += [ids["<image>"]] * n + [ids["</img>"]]
            if plan.outro:
                tokens += newline
            note = None
            if self.video_options.augments:
                note = f"scale {plan.scale:g}" + (", jitter" if self.video_options.temporal_jitter else "")
            return PlannedMedia(index, "video", plan, tokens, plan.num_tokens, runs=runs, augment=note)
        if ref.modality == "audio":
            from energon_nemotron.media.audio import audio_metadata, plan_audio

            md = ref.metadata if {"duration", "sample_rate"} <= set(ref.metadata) else audio_metadata(read_payload(ref, self.max_bytes))
            plan = plan_audio(md, self.audio_options)
            n = plan.num_tokens
            return PlannedMedia(index, "audio", plan,
                                [ids["<so_start>"]] + [ids["<so_embedding>"]] * n + [ids["<so_end>"]], n, runs=[(1, n)])
        raise MediaError(f"unknown modality {ref.modality!r}")

    def _tiling_note(self, width: int, height: int, plan: Any) -> str:
        """What the tiling augmentation did to an image's grid: ``tiling 24x30 -> 24x62`` (or unchanged)."""
        from energon_nemotron.media.image import plan_image

        base = plan_image(width, height, self.image_options)
        if (base.grid_h, base.grid_w) == (plan.grid_h, plan.grid_w):
            return "tiling: grid unchanged"
        return f"tiling {base.grid_h}x{base.grid_w} -> {plan.grid_h}x{plan.grid_w}"

    # -- phase 2 ---------------------------------------------------------------------------------
    def process(self, ref: MediaRef, planned: PlannedMedia) -> dict[str, Any]:
        """:meth:`_process`, a ``MediaError`` naming where the item was read from (:func:`naming_origin`)."""
        with naming_origin(ref):
            return self._process(ref, planned)

    def _process(self, ref: MediaRef, planned: PlannedMedia) -> dict[str, Any]:
        """Decode one planned item. Visual: ``pixels`` float32 [P, 3·p·p], ``sizes`` int32 [units, 2]
        (patch grid per image, tile or frame); audio: ``features`` float32 [clips, F, mel],
        ``lengths`` int64 [clips]. Both: ``keys``, a tuple of provenance keys (str), one per
        equal-size segment of the rows (``pixels`` / ``features``): one for an image or audio, one
        per frame for a video (module docstring). The result is checked against the plan."""
        payload = read_payload(ref, self.max_bytes)
        plan = planned.plan
        self.decodes.add(planned.modality)
        if planned.modality == "audio":
            from energon_nemotron.media.audio import process_audio

            features, lengths = process_audio(payload, plan, self.audio_options)
            if plan.truncated:
                self.decodes.add("audio_truncated")
            if features.shape[0] != plan.num_clips:
                raise MediaError(f"audio decoded into {features.shape[0]} clips, {plan.num_clips} planned")
            key = provenance_key("audio", payload_digest(payload), plan, self.audio_options)
            return {"features": features, "lengths": lengths.to(torch.int64), "keys": (key,)}
        if planned.modality == "image":
            from energon_nemotron.media.image_pixels import process_image

            pixels = process_image(payload, plan)
            units = plan.num_units
            keys: tuple[str, ...] = (provenance_key("image", payload_digest(payload), plan),)
        else:
            from energon_nemotron.media.video_frames import process_video_frames

            pixels, frames = process_video_frames(payload, plan, self.video_options)
            units = plan.num_tubelets * self.video_options.temporal_patch
            video = provenance_key("video", payload_digest(payload), plan, self.video_options)
            keys = tuple(f"{video}:{f}" for f in frames)
        if pixels.shape[0] != plan.num_patches:
            raise MediaError(f"{planned.modality} decoded into {pixels.shape[0]} patches, {plan.num_patches} planned")
        sizes = torch.tensor([[plan.grid_h, plan.grid_w]] * units, dtype=torch.int32)
        frames = plan.num_frames if planned.modality == "video" else units     # the processor's count
        return {"pixels": pixels, "sizes": sizes, "keys": keys, "frames": frames}
