"""``PackedBatch`` rows as the dicts Megatron-Bridge's training steps consume.

- :func:`to_nemotron_omni_step_batch`: ``megatron/bridge/training/nemotron_omni_step.py``
  (``get_batch_from_iterator`` → ``get_batch`` → ``forward_step``), Bridge 0.6.2.
- :func:`to_gpt_step_batch`: ``megatron/bridge/training/gpt_step.py`` (Nemotron-H text SFT).

The project's rows are *expanded*: every image, tile set and video tubelet is ``<img>`` +
``<image>`` × tokens + ``</img>``. Bridge's Nemotron Omni model (megatron-core's ``LLaVAModel``)
takes *compact* rows, one ``<image>`` per run, and expands each to ``num_image_tiles[i] ·
img_seq_len`` embeddings itself; audio stays expanded (``<so_embedding>`` × tokens, replaced in
place). The conversion keeps a run's first id and gives it the label and loss-mask value of the
run's last position, which is exactly where ``LLaVAModel._preprocess_data`` puts a compact
image token's label back; every other position keeps its values. Boundaries (``cu_seqlens_*``) are
in *merged* (expanded) coordinates, i.e. the project row's own, and ``total_tokens`` is the row
width, from which megatron-core derives the Mamba layers' ``seq_idx``.

Bridge's model splits the merged sequence for context parallelism itself, after the media merge:
these dicts are never pre-sliced, every CP rank of a data-parallel replica gets the same one, and
``cu_seqlens_q_padded`` is always present. One row per micro-batch (``micro_batch_size 1``).
"""

from __future__ import annotations

from typing import Any

import torch

from energon_nemotron.batch import MediaSpan, PackedBatch
from energon_nemotron.encoders.presets import VISION_PATCHES
from energon_nemotron.parallel.packed_seq_params import row_boundaries

#: pixels per patch side of Bridge's Nemotron Omni vision path (``_VISION_PATCH_DIM`` of the step):
#: the presets' patch size
BRIDGE_PATCH = VISION_PATCHES["patch_size"]
#: vision patches merged into one LLM token: the presets' pixel shuffle (2x2)
SHUFFLE = VISION_PATCHES["downsample"] ** 2
#: the temporal embedder's unit: 512x512 pixels, 32x32 patches, 256 tokens
TEMPORAL_GRID = (32, 32)


class BridgeBatchError(ValueError):
    """A row that Bridge's model cannot take as it is configured; the message names the sample."""


def _compact_positions(keep: torch.Tensor, cu_padded: torch.Tensor) -> torch.Tensor:
    """int64 [S_c]: positions restarting at every segment, counted over the kept ids."""
    kept_before = torch.cumsum(keep.to(torch.int64), 0) - keep.to(torch.int64)
    starts = kept_before[cu_padded[:-1].to(torch.int64)]           # compact start of each segment
    seg = torch.bucketize(torch.arange(keep.numel()), cu_padded[1:].to(torch.int64), right=True)
    return (kept_before - starts[seg])[keep]


def _collapse_image_runs(tokens: torch.Tensor, labels: torch.Tensor, loss_mask: torch.Tensor,
                         spans: list[MediaSpan], image_token_id: int | None) -> tuple[torch.Tensor, ...]:
    """The row made compact: ``keep`` bool [S] (False for every id of an image run but its first),
    and ``labels`` int64 [S], ``loss_mask`` float32 [S] (copies) with each run's first position
    given the values of its last. ``tokens`` int64 [S] and ``spans`` (the row's) are read only."""
    keep = torch.ones(tokens.numel(), dtype=torch.bool)
    run_ends = []
    for span in spans:
        if span.is_audio:
            continue
        for offset, n in span.runs:
            start = span.token_start + offset
            ids = tokens[start:start + n]
            if n < 1 or bool((ids != ids[0]).any()) or (image_token_id is not None and int(ids[0]) != image_token_id):
                raise BridgeBatchError(f"{span.sample_key}: positions {start}..{start + n - 1} are not one "
                                       "run of the image placeholder id")
            keep[start + 1:start + n] = False
            run_ends.append((start, start + n - 1))
    labels, loss_mask = labels.clone(), loss_mask.clone()
    for start, end in run_ends:
        labels[start], loss_mask[start] = labels[end], loss_mask[end]
    return keep, labels, loss_mask


def _check_visual(span: MediaSpan, units: torch.Tensor, temporal_patch_dim: int) -> None:
    """``BridgeBatchError`` when the model cannot take the visual item of ``span`` whose units
    (images, tiles or frames) have the patch grids ``units`` int64 [units, 2]."""
    key, kind = span.sample_key, span.kind
    if (span.tiles or 1) > 1:
        raise BridgeBatchError(f"{key}: a tiled image ({span.tiles} tiles); Bridge's Nemotron Omni "
                               "model takes one unit per image (use the nemotron_omni or "
                               "nemotron_omni_temporal preset)")
    if temporal_patch_dim > 1:
        if bool((units != torch.tensor(TEMPORAL_GRID)).any()):
            raise BridgeBatchError(
                f"{key}: {kind} units of {units[0].tolist()} patches; the temporal embedder "
                f"(temporal_patch_dim {temporal_patch_dim}) needs every image and frame at "
                f"{TEMPORAL_GRID[0] * BRIDGE_PATCH}x{TEMPORAL_GRID[1] * BRIDGE_PATCH} "
                "(the nemotron_omni_temporal preset)")
        if kind == "video" and units.shape[0] % temporal_patch_dim:
            raise BridgeBatchError(f"{key}: {units.shape[0]} frames, not whole tubelets of "
                                   f"{temporal_patch_dim} (video.temporal_patch must equal temporal_patch_dim)")
    elif kind == "video":
        raise BridgeBatchError(f"{key}: video needs Bridge's temporal embedder (temporal_patch_dim 2, "
                               "the nemotron_omni_temporal preset)")


def _visual(batch: PackedBatch, visual: list[tuple[MediaSpan, int]], temporal_patch_dim: int) -> dict:
    """``pixel_values``, ``imgs_sizes``, ``num_frames`` and ``num_image_tiles`` of the row's visual
    items, ``(span, index in batch.media)`` each (see :func:`to_nemotron_omni_step_batch`)."""
    media = batch.media
    if media.patch_size != BRIDGE_PATCH:
        span = visual[0][0]
        raise BridgeBatchError(f"{span.sample_key}: {span.kind} patches of {media.patch_size} px; Bridge's "
                               f"Nemotron Omni vision path takes {BRIDGE_PATCH} px patches")
    row_pixels, row_sizes, frames, tiles = [], [], [], []
    for span, i in visual:
        units = media.image_sizes[i].to(torch.int64)
        _check_visual(span, units, temporal_patch_dim)
        if temporal_patch_dim > 1:
            tiles += [1] * len(span.runs)
        else:
            tokens = int(units[0, 0] * units[0, 1]) // SHUFFLE
            if [n for _, n in span.runs] != [tokens]:
                raise BridgeBatchError(f"{span.sample_key}: image runs {[list(r) for r in span.runs]} do not hold "
                                       f"the {tokens} tokens of its {units[0].tolist()} patch grid after 2x2 "
                                       "pixel shuffle")
            tiles.append(tokens)
        row_pixels.append(media.pixel_values[i])
        row_sizes.append(units * BRIDGE_PATCH)
        frames.append(units.shape[0])
    return {
        "pixel_values": torch.cat(row_pixels).unsqueeze(0),
        "imgs_sizes": torch.cat(row_sizes),
        "num_frames": torch.tensor(frames, dtype=torch.int64),
        "num_image_tiles": torch.tensor(tiles, dtype=torch.int32),
    }


def _sound(batch: PackedBatch, items: list[int]) -> dict:
    """``sound_clips`` float32 [N_clips, T_max, mel] (trimmed to the row's longest clip) and
    ``sound_length`` int64 [N_clips] of the row's audio items (indices in ``batch.media``), clip
    after clip."""
    feats = [batch.media.sound_features[i] for i in items]
    lengths = torch.cat([batch.media.sound_lengths[i] for i in items]).to(torch.int64)
    clips = torch.cat(feats)[:, :int(lengths.max())]
    return {"sound_clips": clips.contiguous(), "sound_length": lengths}


def _boundaries(batch: PackedBatch, row: int, exact_lengths: bool) -> dict:
    """The packed-sequence keys Bridge's steps pass to ``get_packed_seq_params``: ``cu_seqlens_q``
    as :func:`~energon_nemotron.parallel.packed_seq_params.row_boundaries` decides it (the real
    lengths with ``exact_lengths``, else the padded boundaries), ``cu_seqlens_q_padded`` always
    the padded ones (int32 [n+1] each, ``_kv`` the same), ``max_seqlen_q``/``_kv`` int32 scalars."""
    q, _ = row_boundaries(batch, row, exact_lengths)
    q = q.to(torch.int32)
    padded = batch.cu_seqlens_padded[row].to(torch.int32)
    longest = torch.tensor(batch.max_seqlen[row], dtype=torch.int32)
    return {"cu_seqlens_q": q, "cu_seqlens_kv": q.clone(),
            "cu_seqlens_q_padded": padded, "cu_seqlens_kv_padded": padded.clone(),
            "max_seqlen_q": longest, "max_seqlen_kv": longest.clone(), "total_tokens": batch.seq_length}


def to_nemotron_omni_step_batch(batch: PackedBatch, row: int = 0, *, temporal_patch_dim: int = 1,
                                image_token_id: int | None = None) -> dict[str, Any]:
    """Row ``row`` of ``batch`` as the dict ``nemotron_omni_step.get_batch`` / ``forward_step`` read.

    S = the row's width, S_c = S minus the collapsed image ids, ΣP = the row's vision patches.

    - ``tokens``, ``labels`` int64 [1, S_c]; ``loss_mask`` float32 [1, S_c]; ``position_ids``
      int64 [1, S_c] (compact, restarting per segment; ``LLaVAModel`` does not pass them to the LM);
      ``attention_mask`` None.
    - with images or video: ``pixel_values`` float32 [1, ΣP, 768] (16x16 patches, (C, P, P)
      flattened, raster order; the step casts to bf16 and calls them ``images``), ``imgs_sizes``
      int64 [units, 2] (H, W) pixels, one row per image and per video frame, ``num_frames`` int64
      [items] (1 per image, frames per video), ``num_image_tiles`` int32 [runs]: one entry per
      compact ``<image>`` — its token count when ``temporal_patch_dim == 1`` (``img_seq_len`` 1),
      1 per image or tubelet when 2 (``img_seq_len`` 256).
    - with audio: ``sound_clips`` float32 [clips, T_max, 128], ``sound_length`` int64 [clips].
    - ``cu_seqlens_q``/``_kv`` int32 [n+1] (real lengths: ``exact_lengths``), ``cu_seqlens_q_padded``
      /``_kv_padded`` int32 [n+1], ``max_seqlen_q``/``_kv`` int32 scalars, ``total_tokens`` int (= S).
    - ``padding_mask`` bool [1, S]: ``PackedBatch.padding_mask``, in the expanded coordinates the
      language model (and a mixture-of-experts router in it) sees once ``LLaVAModel`` has put the
      images back; Bridge 0.6.2's step does not read it (unknown keys are None there).

    ``temporal_patch_dim``: the model provider's field (1: dynamic-resolution images, no video;
    2: the temporal embedder, every image and frame 512x512). ``image_token_id``: checked against
    the row when given. Raises :class:`BridgeBatchError` for a row the model cannot take.
    """
    if not 0 <= row < batch.batch_size:
        raise IndexError(f"row {row} of a batch of {batch.batch_size}")
    if temporal_patch_dim not in (1, 2):
        raise ValueError(f"temporal_patch_dim must be 1 or 2, got {temporal_patch_dim}")
    items = batch.media_items(row)                   # (span, index of its item in batch.media)
    tokens = batch.tokens[row]
    keep, labels, loss_mask = _collapse_image_runs(tokens, batch.labels[row], batch.loss_mask[row],
                                                   batch.media_spans[row], image_token_id)
    out: dict[str, Any] = {
        "tokens": tokens[keep].unsqueeze(0).to(torch.int64),
        "labels": labels[keep].unsqueeze(0),
        "loss_mask": loss_mask[keep].unsqueeze(0).to(torch.float32),
        "position_ids": _compact_positions(keep, batch.cu_seqlens_padded[row]).unsqueeze(0),
        "attention_mask": None,
        "padding_mask": batch.padding_mask[row].unsqueeze(0),          # expanded: what the LM sees
    }
    visual = [(span, i) for span, i in items if not span.is_audio]
    audio = [i for span, i in items if span.is_audio]
    if visual:
        out.update(_visual(batch, visual, temporal_patch_dim))
    if audio:
        out.update(_sound(batch, audio))
    out.update(_boundaries(batch, row, exact_lengths=True))
    return out


def to_gpt_step_batch(batch: PackedBatch, row: int = 0) -> dict[str, Any]:
    """Row ``row`` as the dict ``gpt_step.get_batch`` reads (text only).

    ``tokens``, ``labels``, ``position_ids`` int64 [1, S]; ``loss_mask`` float32 [1, S];
    ``padding_mask`` bool [1, S] (``PackedBatch.padding_mask``: what a mixture-of-experts router
    leaves out); ``attention_mask`` None; ``cu_seqlens_q``/``_kv`` = ``cu_seqlens_q_padded``/``_kv_padded``
    int32 [n+1], the *padded* boundaries: megatron-core's multi-token-prediction roll reads
    ``cu_seqlens_q`` as physical offsets, so pads stay inside their segment and no target crosses
    one (causal attention over a segment's trailing pads leaves its real tokens unchanged, as
    Megatron-LM's own SFT path does); ``max_seqlen_q``/``_kv`` int32 scalars; ``total_tokens`` int.
    ``gpt_step`` slices the row for context parallelism itself.
    """
    if not 0 <= row < batch.batch_size:
        raise IndexError(f"row {row} of a batch of {batch.batch_size}")
    if batch.media_spans[row]:
        raise BridgeBatchError(f"{batch.media_spans[row][0].sample_key}: gpt_step takes text only; "
                               "use to_nemotron_omni_step_batch for rows with media")
    out: dict[str, Any] = {
        "tokens": batch.tokens[row].unsqueeze(0),
        "labels": batch.labels[row].unsqueeze(0),
        "loss_mask": batch.loss_mask[row].unsqueeze(0),
        "position_ids": batch.position_ids[row].unsqueeze(0),
        "attention_mask": None,
        "padding_mask": batch.padding_mask[row].unsqueeze(0),
    }
    out.update(_boundaries(batch, row, exact_lengths=False))
    return out
