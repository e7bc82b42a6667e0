"""``PackedBatch`` → the batch dicts NeMo-RL's SFT policy reads.

- :func:`to_nemo_rl_packed`: the Energon-packed layout of NeMo-RL's SFT v2
  (``nemo_rl/data/energon/multimodal/packing.py`` ``prepare_packed_sft_batch``, read by
  ``nemo_rl/models/megatron/data.py`` ``_prepare_prepacked``): one row per pack, a *token-aligned*
  mask, jagged boundaries as ``PackedTensor``s, the media per pack.
- :func:`to_nemo_rl_megatron_rows`: the rows of NeMo-RL's direct Megatron-LM SFT path (PR #3380,
  ``nemo_rl/data/collate_fn.py`` ``_collate_megatron_sft_packed``): label-aligned, for batches of
  this library's Megatron-LM path (``megatron_packed``).

The library's rows are label-aligned: ``labels[t]`` is the target predicted at ``t`` (the next token
of the same source) and ``loss_mask[t]`` says whether it is trained. NeMo-RL's packed layout marks
tokens instead: ``token_mask[t]`` says whether token ``t`` is a trained target, and its loss reads
``token_mask[:, 1:]`` against the logits at ``[:, :-1]``. So ``token_mask[:, 0] = 0`` and
``token_mask[:, 1:] = loss_mask[:, :-1]``: the first token of every source is never trained (the
library never predicts across a source boundary, which NeMo-RL gets by zeroing that token).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from energon_nemotron.batch import PackedBatch
from energon_nemotron.tensors import PackedTensor

__all__ = ["to_nemo_rl_packed", "to_nemo_rl_megatron_rows", "token_aligned_mask"]


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def token_aligned_mask(batch: PackedBatch) -> torch.Tensor:
    """float32 [B, S]: NeMo-RL's ``token_mask`` of ``batch`` (1 where token ``t`` is a trained target).

    ``ValueError`` when a trained label is not the next token of the row (``labels[r, t] !=
    tokens[r, t + 1]``) or the last position is trained: a token-aligned mask can only say "predict
    the next token", and has no position for a target past the row."""
    trained = batch.loss_mask != 0
    if bool(trained[:, -1].any()):
        row = int(trained[:, -1].nonzero()[0, 0])
        raise ValueError(f"row {row}: the last position is trained; a token-aligned mask has no next token "
                         "for it")
    wrong = trained[:, :-1] & (batch.labels[:, :-1] != batch.tokens[:, 1:])
    if bool(wrong.any()):
        row, t = (int(v) for v in wrong.nonzero()[0])
        raise ValueError(f"row {row}: the trained label at position {t} is {int(batch.labels[row, t])}, not the "
                         f"next token {int(batch.tokens[row, t + 1])}; NeMo-RL's token-aligned mask trains next "
                         "tokens only")
    mask = torch.zeros(batch.loss_mask.shape, dtype=torch.float32)
    mask[:, 1:] = batch.loss_mask[:, :-1].to(torch.float32)
    return mask


def _row_boundaries(batch: PackedBatch, row: int, pad_multiple: Optional[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """int32 [n+1] ``(cu_seqlens, cu_seqlens_padded)`` of one row as NeMo-RL states them (see
    :func:`to_nemo_rl_packed`)."""
    cu = batch.cu_seqlens[row].to(torch.int32)
    padded = batch.cu_seqlens_padded[row].to(torch.int32)
    real = (cu[1:] - cu[:-1]).tolist()
    if any(n <= 0 for n in real):
        if batch.is_padding[row]:       # a padding row of pad ids only: its pads stand for its tokens
            return padded.clone(), padded.clone()
        raise ValueError(f"row {row} ({batch.sample_keys[row]}): a source of no token; NeMo-RL's packed batch "
                         "needs at least one per source")
    if pad_multiple is None:
        return cu.clone(), padded.clone()
    widths = (padded[1:] - padded[:-1]).tolist()
    for i, (n, width) in enumerate(zip(real[:-1], widths[:-1])):
        if width != _round_up(n, pad_multiple):
            raise ValueError(f"row {row}: source {i} ({n} tokens) takes {width} positions, not a multiple of "
                             f"pad_multiple={pad_multiple} rounded up (the batch was packed with another multiple)")
    last = _round_up(real[-1], pad_multiple)
    if last > widths[-1]:
        raise ValueError(f"row {row}: the last source needs {last} positions at pad_multiple={pad_multiple}, "
                         f"the row has {widths[-1]}")
    out = padded.clone()
    out[-1] = out[-2] + last
    return cu.clone(), out


def _visual(batch: PackedBatch, rows: Sequence[list]) -> dict[str, PackedTensor]:
    """``pixel_values``, ``imgs_sizes``, ``num_frames``, one item per row (see :func:`to_nemo_rl_packed`);
    ``rows[r]``: row r's visual ``(span, index in batch.media)``."""
    media = batch.media
    p = int(media.patch_size)
    width = 3 * p * p
    pixels, sizes, frames = [], [], []
    for items in rows:
        pixels.append(torch.cat([media.pixel_values[i] for _, i in items]) if items
                      else torch.zeros((0, width), dtype=media.pixel_values.dtype))
        units = [media.image_sizes[i].to(torch.int32) * p for _, i in items]
        sizes.append(torch.cat(units) if units else torch.zeros((0, 2), dtype=torch.int32))
        counts: list[int] = []
        for (span, _), u in zip(items, units):
            # a video is one item of its frames; an image is one item per unit (its tiles and thumbnail,
            # as NeMo-RL's placeholder processors give every tile a frame count of 1)
            counts += [u.shape[0]] if span.kind == "video" else [1] * u.shape[0]
        frames.append(torch.tensor(counts, dtype=torch.int64))
    return {"pixel_values": PackedTensor.from_list(pixels), "imgs_sizes": PackedTensor.from_list(sizes),
            "num_frames": PackedTensor.from_list(frames)}


def _sound(batch: PackedBatch, rows: Sequence[list[int]]) -> dict[str, PackedTensor]:
    """``sound_clips`` and ``sound_length``, one item per row; ``rows[r]``: row r's audio item indices."""
    media = batch.media
    longest = int(media.sound_lengths.as_tensor().max())
    mel = int(media.sound_features.feature_shape[-1])
    clips, lengths = [], []
    for items in rows:
        feats = [media.sound_features[i][:, :longest] for i in items]
        clips.append(torch.cat(feats) if feats else torch.zeros((0, longest, mel), dtype=media.sound_features.dtype))
        counts = [media.sound_lengths[i].to(torch.int64) for i in items]
        lengths.append(torch.cat(counts) if counts else torch.zeros(0, dtype=torch.int64))
    return {"sound_clips": PackedTensor.from_list(clips), "sound_length": PackedTensor.from_list(lengths)}


def _media(batch: PackedBatch) -> dict[str, PackedTensor]:
    visual = [[(s, i) for s, i in batch.media_items(r) if not s.is_audio] for r in range(batch.batch_size)]
    audio = [[i for s, i in batch.media_items(r) if s.is_audio] for r in range(batch.batch_size)]
    out: dict[str, PackedTensor] = {}
    if batch.media.num_visual:
        out.update(_visual(batch, visual))
    if batch.media.num_audio:
        out.update(_sound(batch, audio))
    return out


def to_nemo_rl_packed(batch: PackedBatch, *, pad_multiple: Optional[int] = None) -> dict[str, Any]:
    """``batch`` as the dict NeMo-RL's ``prepare_packed_sft_batch`` yields (P = packs = rows).

    - ``input_ids`` int64 [P, L]: the rows' token ids (media placeholders expanded, as NeMo-RL's).
    - ``input_lengths`` int32 [P]: each pack's physical length, ``cu_seqlens_padded[-1]`` (NeMo-RL:
      the sum of its sources' padded lengths; neither the capacity nor the real token count).
    - ``token_mask`` float32 [P, L], token-aligned (:func:`token_aligned_mask`; the loss reads
      ``token_mask[:, 1:]``, the first token of every source is 0).
    - ``sample_mask`` float32 [P]: 1 for a pack with a trained token (``token_mask.bool().any(1)``),
      0 otherwise and for every padding row (``is_padding``).
    - ``cu_seqlens``, ``cu_seqlens_padded``: ``PackedTensor``s, one int32 [n_p+1] item per pack
      (jagged: NeMo-RL ships them so because its TP broadcast refuses lists of tensors); the real
      and the padded source boundaries. ``source_ids``: per pack, its sources' keys.
    - with images or video (one ``PackedTensor`` item per pack, empty for a pack without):
      ``pixel_values`` float32 [ΣP_p, 3·p·p] (NeMo-RL's ``patchify`` layout: each image or frame's
      patches in raster order, each patch (C, p, p) flattened; the pack's items in placeholder order;
      ``pixel_values[i].unsqueeze(0)`` is pack i's [1, ΣP, 3·p·p]), ``imgs_sizes`` int32 [units, 2]
      (height, width) in pixels of each image unit (tile) and video frame, ``num_frames`` int64:
      a video's frame count, 1 per image unit.
    - with audio: ``sound_clips`` float32 [clips, T, mel] (T: the batch's longest clip, shorter
      clips zero-padded), ``sound_length`` int64 [clips]: each clip's valid mel frames.

    Widths: by default L = S, the library's row (its trailing pad in the last source, so
    ``input_lengths`` = S), which NeMo-RL's ``_prepare_prepacked`` takes as it is. With
    ``pad_multiple`` (the multiple the batch was packed with) the last source is padded to that
    multiple only and L is the longest pack, exactly NeMo-RL's own layout. A padding row of pad
    ids only (no source) gets its padded boundaries as both boundaries. ``ValueError`` for what
    NeMo-RL cannot state: a trained label that is not the next token, a source of no token, a row
    not packed with ``pad_multiple``.
    """
    token_mask = token_aligned_mask(batch)
    bounds = [_row_boundaries(batch, r, pad_multiple) for r in range(batch.batch_size)]
    lengths = torch.tensor([int(p[-1]) for _, p in bounds], dtype=torch.int32)
    width = int(lengths.max()) if pad_multiple is not None else batch.seq_length
    token_mask = token_mask[:, :width].contiguous()
    sample_mask = token_mask.bool().any(1).to(torch.float32)
    sample_mask[torch.tensor(batch.is_padding, dtype=torch.bool)] = 0.0
    out: dict[str, Any] = {
        "input_ids": batch.tokens[:, :width].to(torch.int64).contiguous(),
        "input_lengths": lengths,
        "token_mask": token_mask,
        "sample_mask": sample_mask,
        "cu_seqlens": PackedTensor.from_list([c for c, _ in bounds]),
        "cu_seqlens_padded": PackedTensor.from_list([p for _, p in bounds]),
        "source_ids": [list(keys) for keys in batch.sample_keys],
    }
    out.update(_media(batch))
    return out


def to_nemo_rl_megatron_rows(batch: PackedBatch, *, idx: Optional[Sequence[Any]] = None,
                             task_name: str = "megatron_sft_packed") -> dict[str, Any]:
    """``batch`` (B rows of this library's Megatron-LM path) as the batch NeMo-RL's
    ``_collate_megatron_sft_packed`` (PR #3380) makes of ``megatron_sft_packed`` rows.

    - ``input_ids``, ``target_ids``, ``position_ids`` int64 [B, L]; ``token_mask`` float32 [B, L]:
      the rows' ``tokens``, ``labels`` (label-aligned: -100 and the pad id kept, as Megatron-LM
      emits them), ``position_ids`` and ``loss_mask``; this path's loss is per position, unshifted.
    - ``input_lengths`` int64 [B]: L each (NeMo-RL: the row's ``length``, ``max_seq_length``).
    - ``sample_mask`` float32 [B]: 1, 0 for a padding row (``is_padding``; NeMo-RL pads a last
      batch the same way).
    - ``packed_cu_seqlens`` int32 [B, K]: each row's boundaries padded with -1 to the longest (K);
      ``packed_cu_seqlens_lengths`` int64 [B]: each row's count; ``packed_max_seqlen`` int64 [B].
    - ``idx``: per row, ``idx`` when given, else the row's sample keys; ``task_name``: per row.

    ``ValueError`` for a batch whose rows pad inside their segments differently from their
    boundaries (``cu_seqlens != cu_seqlens_padded``: an Energon-path batch) or whose boundaries
    do not end at L.
    """
    b, s = batch.tokens.shape
    for r in range(b):
        cu, padded = batch.cu_seqlens[r], batch.cu_seqlens_padded[r]
        if not torch.equal(cu.to(torch.int64), padded.to(torch.int64)) or int(cu[-1]) != s:
            raise ValueError(f"row {r}: cu_seqlens {cu.tolist()} != cu_seqlens_padded {padded.tolist()} or not "
                             f"ending at {s}; megatron_sft_packed rows are Megatron-LM's (megatron_packed), "
                             "use to_nemo_rl_packed for the Energon path")
    if idx is not None and len(idx) != b:
        raise ValueError(f"idx has {len(idx)} entries for {b} rows")
    longest = max(int(c.numel()) for c in batch.cu_seqlens)
    cu_rows = [torch.nn.functional.pad(c.to(torch.int32), (0, longest - c.numel()), value=-1)
               for c in batch.cu_seqlens]
    sample_mask = torch.ones(b, dtype=torch.float32)
    sample_mask[torch.tensor(batch.is_padding, dtype=torch.bool)] = 0.0
    return {
        "input_ids": batch.tokens.to(torch.int64),
        "target_ids": batch.labels.to(torch.int64),
        "token_mask": batch.loss_mask.to(torch.float32),
        "position_ids": batch.position_ids.to(torch.int64),
        "input_lengths": torch.full((b,), s, dtype=torch.int64),
        "sample_mask": sample_mask,
        "packed_cu_seqlens": torch.stack(cu_rows),
        "packed_cu_seqlens_lengths": torch.tensor([c.numel() for c in batch.cu_seqlens], dtype=torch.int64),
        "packed_max_seqlen": torch.tensor(batch.max_seqlen, dtype=torch.int64),
        "idx": list(idx) if idx is not None else [list(k) for k in batch.sample_keys],
        "task_name": [task_name] * b,
    }
