"""``PackedBatch`` rows as the dict of Megatron-Bridge main's Nemotron Omni step (the *expanded* contract).

Bridge's main branch (from commit ``067f987``) trains Nemotron Omni with its own
``NemotronOmniModel`` (``megatron/bridge/models/nemotron_omni/modeling_nemotron_omni.py``, checkpoint
tag ``nemotron_omni_contract: expanded_sequence_v1``): it takes the row as this project makes it,
one ``<image>`` per projected vision feature and one ``<so_embedding>`` per projected sound feature,
replaces the placeholders in place after its encoders ran, and raises on any count mismatch. Nothing
is collapsed, so the tokens, labels, loss mask, positions and padding mask are the row's own.
Bridge 0.6.2 (megatron-core's LLaVA path, ``llava_collapse_expand_v1``) takes
:func:`~energon_nemotron.integrations.megatron_bridge.to_nemotron_omni_step_batch` instead.

The model splits the merged row for context parallelism itself (every CP rank of a replica gets
the same dict) and uses ``~padding_mask`` as the validity mask of the media placeholders.
"""

from __future__ import annotations

from typing import Any

import torch

from energon_nemotron.batch import MediaSpan, PackedBatch
from energon_nemotron.integrations.megatron_bridge import BRIDGE_PATCH, SHUFFLE, BridgeBatchError, _check_visual, _sound


def _item_features(span: MediaSpan, units: torch.Tensor, temporal_patch_dim: int) -> int:
    """The projected features Bridge main's model makes of one visual item whose units (the image,
    or the video's frames) have the patch grids ``units`` int64 [units, 2]: every unit's grid after
    the 2x2 pixel shuffle, and with the temporal embedder one unit's worth per tubelet of
    ``temporal_patch_dim`` frames (an image is one tubelet)."""
    per_unit = int(units[0, 0] * units[0, 1]) // SHUFFLE
    if temporal_patch_dim > 1:
        return -(-units.shape[0] // temporal_patch_dim) * per_unit
    return per_unit * units.shape[0]


def _visual(batch: PackedBatch, visual: list[tuple[MediaSpan, int]], temporal_patch_dim: int) -> dict:
    """``pixel_values``, ``imgs_sizes`` and ``num_frames`` of the row's visual items, ``(span, index
    in batch.media)`` each (see :func:`to_nemotron_omni_expanded_batch`)."""
    media = batch.media
    if media.patch_size != BRIDGE_PATCH:
        span = visual[0][0]
        raise BridgeBatchError(f"{span.sample_key}: {span.kind} patches of {media.patch_size} px; Bridge's "
                               f"Nemotron Omni vision path takes {BRIDGE_PATCH} px patches")
    pixels, sizes, frames = [], [], []
    for span, i in visual:
        units = media.image_sizes[i].to(torch.int64)
        _check_visual(span, units, temporal_patch_dim)
        want, got = _item_features(span, units, temporal_patch_dim), sum(n for _, n in span.runs)
        if got != want:
            raise BridgeBatchError(f"{span.sample_key}: {span.kind} of {units.shape[0]} unit(s) of "
                                   f"{units[0].tolist()} patches has {got} placeholders; Bridge main's model "
                                   f"projects it to {want} features")
        pixels.append(media.pixel_values[i])
        sizes.append(units * BRIDGE_PATCH)
        frames.append(units.shape[0])
    return {"pixel_values": torch.cat(pixels).unsqueeze(0), "imgs_sizes": torch.cat(sizes),
            "num_frames": torch.tensor(frames, dtype=torch.int64)}


def _boundaries(batch: PackedBatch, row: int) -> dict:
    """``cu_seqlens_q``/``_kv`` int32 [n+1] (real lengths), ``cu_seqlens_q_padded``/``_kv_padded``
    only where they differ, ``max_seqlen_q``/``_kv`` 0-d int32 (the longest padded segment) and
    ``total_tokens`` (the row width), as Bridge main's ``get_batch`` hands them on."""
    real = batch.cu_seqlens[row].to(torch.int32)
    padded = batch.cu_seqlens_padded[row].to(torch.int32)
    longest = torch.tensor(batch.max_seqlen[row], dtype=torch.int32)
    out = {"cu_seqlens_q": real, "cu_seqlens_kv": real.clone(),
           "max_seqlen_q": longest, "max_seqlen_kv": longest.clone(), "total_tokens": batch.seq_length}
    if not torch.equal(real, padded):
        out["cu_seqlens_q_padded"], out["cu_seqlens_kv_padded"] = padded, padded.clone()
    return out


def to_nemotron_omni_expanded_batch(batch: PackedBatch, row: int = 0, *, temporal_patch_dim: int = 1,
                                    image_token_id: int | None = None) -> dict[str, Any]:
    """Row ``row`` of ``batch`` as the dict Bridge main's ``nemotron_omni_step.get_batch`` /
    ``forward_step`` and ``NemotronOmniModel.forward`` read.

    S = the row's width, ΣP = the row's vision patches.

    - ``tokens``, ``labels``, ``position_ids`` int64 [1, S] (positions restart per segment);
      ``loss_mask`` float32 [1, S]; ``padding_mask`` bool [1, S] (True at alignment pads and the
      row's tail: what the model leaves out of the media merge and a router of its statistics);
      ``attention_mask`` None.
    - with images or video: ``pixel_values`` float32 [1, ΣP, 768] (16x16 patches, (C, P, P)
      flattened, raster order), ``imgs_sizes`` int64 [units, 2] (H, W) pixels, one row per image
      and per video frame (tubelet padding frames included), ``num_frames`` int64 [items].
    - with audio: ``sound_clips`` float32 [clips, T_max, 128], ``sound_length`` int64 [clips]: the
      valid mel frames (``audio.sound_length: valid``, which ``output: nemotron_omni_expanded`` sets).
    - ``cu_seqlens_q``/``_kv`` int32 [n+1] (real lengths), ``cu_seqlens_q_padded``/``_kv_padded``
      only where they differ, ``max_seqlen_q``/``_kv`` int32 0-d, ``total_tokens`` int (= S).

    ``temporal_patch_dim``: the model provider's field (1: dynamic-resolution images; 2: the
    temporal embedder, every image and frame 512x512). ``image_token_id``: when given, every
    visual run must be that id. Raises :class:`BridgeBatchError` for a row the model cannot take.
    """
    if not 0 <= row < batch.batch_size:
        raise IndexError(f"row {row} of a batch of {batch.batch_size}")
    if temporal_patch_dim not in (1, 2):
        raise ValueError(f"temporal_patch_dim must be 1 or 2, got {temporal_patch_dim}")
    tokens = batch.tokens[row]
    items = batch.media_items(row)
    visual = [(span, i) for span, i in items if not span.is_audio]
    audio = [i for span, i in items if span.is_audio]
    if image_token_id is not None:
        for span, _ in visual:
            for offset, n in span.runs:
                start = span.token_start + offset
                if bool((tokens[start:start + n] != image_token_id).any()):
                    raise BridgeBatchError(f"{span.sample_key}: positions {start}..{start + n - 1} are not all "
                                           f"the image placeholder id {image_token_id}")
    out: dict[str, Any] = {
        "tokens": tokens.unsqueeze(0).to(torch.int64),
        "labels": batch.labels[row].unsqueeze(0),
        "loss_mask": batch.loss_mask[row].unsqueeze(0).to(torch.float32),
        "position_ids": batch.position_ids[row].unsqueeze(0),
        "attention_mask": None,
        "padding_mask": batch.padding_mask[row].unsqueeze(0),
    }
    if visual:
        out.update(_visual(batch, visual, temporal_patch_dim))
    if audio:
        out.update(_sound(batch, audio))
    out.update(_boundaries(batch, row))
    return out
