"""What ``PackedBatch.validate()`` checks beyond dtypes and shapes: each row's boundaries, and the
media against their spans (each failure a ``ValueError`` naming the row and the sample)."""

from __future__ import annotations

from typing import Any

import torch

from energon_nemotron.batch.media import BatchMedia, MediaSpan

__all__ = ["check_rows", "check_media"]


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


def check_rows(batch: Any) -> None:
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
    """Each visual item against its span: units (``num_units``, ``image_sizes``), their grid, the
    tiles of an image or frames of a video (``num_frames``: the span's frames; an image's units), its
    patch rows; ``patch_size`` against the rows' width."""
    p = media.patch_size
    if not isinstance(p, int) or isinstance(p, bool) or p < 1:
        raise ValueError(f"media.patch_size must be a positive int with visual items, got {p!r}")
    if media.pixel_values.feature_shape != (3 * p * p,):
        raise ValueError(f"media.pixel_values rows are {list(media.pixel_values.feature_shape)}, "
                         f"patches of {p} px are [{3 * p * p}]")
    units_of, rows_of = media.image_sizes.lengths().tolist(), media.pixel_values.lengths().tolist()
    frames_of, counted = media.num_frames.reshape(-1).tolist(), media.num_units.reshape(-1).tolist()
    for k, (r, span) in enumerate(visual):
        units, (gh, gw) = units_of[k], span.grid
        grids = media.image_sizes[k].tolist()
        if counted[k] != units:
            raise _span_error(r, span, f"media.num_units says {counted[k]} units, image_sizes holds {units}")
        frames = span.frames if span.kind == "video" else units
        if frames_of[k] != frames:
            raise _span_error(r, span, f"media.num_frames says {frames_of[k]}, its {span.kind} has {frames} "
                                       f"{'frames' if span.kind == 'video' else 'units'}")
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


def check_media(batch: Any) -> None:
    """The media spans against the rows (:func:`check_rows`) and the media items against the
    spans: one visual item per image or video span, one audio item per audio span, in batch order,
    each with what its span says (:func:`_check_visual`, :func:`_check_audio`)."""
    check_rows(batch)
    spans = [(r, s) for r, row in enumerate(batch.media_spans) for s in row]
    visual = [(r, s) for r, s in spans if not s.is_audio]
    audio = [(r, s) for r, s in spans if s.is_audio]
    _check_counts("visual", visual, batch.media, ("pixel_values", "image_sizes", "num_frames", "num_units"))
    _check_counts("audio", audio, batch.media, ("sound_features", "sound_lengths"))
    if visual:
        _check_visual(visual, batch.media)
    if audio:
        _check_audio(audio, batch.media)
