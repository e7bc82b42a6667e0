"""Encoded sources → one packed row of the Energon path, and rows → ``PackedBatch``.

Row semantics (S = seq_length, m = pad_multiple):

- each source of n tokens occupies ``ceil(n/m)*m`` positions: its tokens, then pad ids;
- labels are shifted **within** the source: ``labels[j] = tokens[j+1]`` when token j+1 is trained,
  else -100; the source's last position is -100, so nothing predicts across a boundary; pads -100;
- ``position_ids`` restart at 0 per source and continue through its padding;
- the row is padded to S; that tail belongs to the last segment;
- ``cu_seqlens``: cumulative real lengths; ``cu_seqlens_padded``: cumulative padded lengths, last = S
  (Transformer Engine's logical and physical THD offsets); ``max_seqlen``: longest padded segment.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch
import torch.utils.data

from energon_nemotron.batch import IGNORE_INDEX, BatchMedia, PackedBatch
from energon_nemotron.tensors import PackedTensor, from_keyed
from energon_nemotron.types import EncodedSource, PackedRow


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def source_labels(tokens: np.ndarray, trained: np.ndarray) -> np.ndarray:
    """int64 [n] labels of one source (see the module docstring)."""
    labels = np.full(tokens.shape[0], IGNORE_INDEX, dtype=np.int64)
    if tokens.shape[0] > 1:
        labels[:-1] = np.where(trained[1:], tokens[1:], IGNORE_INDEX)
    return labels


def assemble_row(sources: Sequence[EncodedSource], seq_length: int, pad_multiple: int, pad_id: int) -> dict:
    """The tensors of one row (fields of :class:`PackedRow`) from its sources, in order."""
    padded = [round_up(int(s.tokens.shape[0]), pad_multiple) for s in sources]
    if sum(padded) > seq_length:
        raise ValueError(f"sources take {sum(padded)} positions, more than seq_length={seq_length}")
    tokens = np.full(seq_length, pad_id, dtype=np.int64)
    labels = np.full(seq_length, IGNORE_INDEX, dtype=np.int64)
    positions = np.empty(seq_length, dtype=np.int64)
    cu, cu_padded = [0], [0]
    at = 0
    for s, width in zip(sources, padded):
        n = int(s.tokens.shape[0])
        tokens[at:at + n] = s.tokens
        labels[at:at + n] = source_labels(s.tokens, s.trained)
        positions[at:at + width] = np.arange(width)
        cu.append(cu[-1] + n)
        at += width
        cu_padded.append(at)
    last = int(positions[at - 1]) if at else -1
    positions[at:] = np.arange(last + 1, last + 1 + seq_length - at)
    cu_padded[-1] = seq_length
    lengths = np.diff(cu_padded)
    return {
        "tokens": torch.from_numpy(tokens),
        "labels": torch.from_numpy(labels),
        "loss_mask": torch.from_numpy((labels != IGNORE_INDEX).astype(np.float32)),
        "position_ids": torch.from_numpy(positions),
        "cu_seqlens": torch.tensor(cu, dtype=torch.int32),
        "cu_seqlens_padded": torch.tensor(cu_padded, dtype=torch.int32),
        "max_seqlen": int(lengths.max()),
        "keys": [s.key for s in sources],
    }


def _item_patch_size(planned, pixels: torch.Tensor) -> int:
    """Pixels per patch side of a visual item (its plan's ``patch_size``), checked against its rows
    ``pixels`` float32 [P, 3·p·p] (``ValueError`` when they are not patches of that size)."""
    p = int(planned.plan.patch_size)
    if pixels.dim() != 2 or int(pixels.shape[1]) != 3 * p * p:
        raise ValueError(f"{planned.modality} rows of shape {tuple(pixels.shape)} are not patches of 3x{p}x{p}")
    return p


def row_media(samples: Sequence, source_starts: Sequence[int]) -> dict:
    """Media of a row's samples in placeholder order: ``visual`` (per item ``pixels``, ``sizes``,
    ``keys`` and ``patch_size``), ``audio`` (processed tensors) and ``media_spans``
    (``MediaSpan``s, row positions). ``source_starts``: row position of each source, in order."""
    items = []
    base = 0
    for s in samples:
        for planned, tensors in zip(s.media_plans, s.media_tensors):
            start = source_starts[base + planned.source] + planned.token_start
            items.append((start, planned, tensors, s.sources[planned.source].key))
        base += len(s.sources)
    items.sort(key=lambda x: x[0])
    out: dict = {"visual": [], "audio": [], "media_spans": []}
    for start, planned, tensors, key in items:
        if planned.modality == "audio":
            out["audio"].append(tensors)
        else:
            out["visual"].append({**tensors, "patch_size": _item_patch_size(planned, tensors["pixels"])})
        out["media_spans"].append(planned.describe(key, start))
    return out


def _keyed_segments(rows: torch.Tensor, keys) -> tuple[list[torch.Tensor], list]:
    """``rows`` split into ``len(keys)`` equal segments (views), with their keys; without keys one
    unkeyed segment (never shared)."""
    if not keys:
        return [rows], [None]
    n = len(keys)
    if rows.shape[0] % n:
        raise ValueError(f"{rows.shape[0]} media rows do not split into {n} equal keyed segments")
    step = rows.shape[0] // n
    return [rows[k * step:(k + 1) * step] for k in range(n)], list(keys)


def _patch_size(visual: Sequence[dict]) -> Optional[int]:
    """The one patch size of the batch's visual items (``ValueError`` when they differ)."""
    sizes = {v["patch_size"] for v in visual}
    if len(sizes) > 1:
        raise ValueError(f"the visual items of one batch have patch sizes {sorted(sizes)}; image.patch_size "
                         "and video.patch_size must agree")
    return sizes.pop() if sizes else None


def batch_media(rows: Sequence[PackedRow]) -> BatchMedia:
    """``PackedBatch.media`` (:class:`~energon_nemotron.batch.BatchMedia`): ``pixel_values``
    (PackedTensor, per visual item [P_i, 3·p·p] float32), ``image_sizes`` (PackedTensor, per item
    int32 [units_i, 2] patch grids), ``num_frames`` (int32 [N_visual]: a video's frames as the
    processor counts them, an image's units), ``num_units`` (int32 [N_visual]: units per item, a
    video's frames padded to whole tubelets),
    ``patch_size`` (p), ``sound_features`` (PackedTensor, per audio [clips_i, F, mel], F the
    longest clip of the batch: shorter clips zero-padded) and ``sound_lengths`` (PackedTensor, per
    audio int64 [clips_i]: mel frames ``1 + L // hop``); only the kinds present.

    ``pixel_values`` and ``sound_features`` are deduplicated (``tensors.from_keyed`` over the
    items' provenance ``keys``, see ``media.handlers``): an image or audio used by several samples
    of the batch, a video's repeated frames and a video used twice are stored once."""
    visual = [v for r in rows for v in r.visual]
    audio = [a for r in rows for a in r.audio]
    media: dict = {}
    # in a DataLoader worker, write the big tensors straight into shared memory: sending the batch
    # to the main process then copies nothing (as PyTorch's own collate does)
    shared = torch.utils.data.get_worker_info() is not None
    if visual:
        segments = [_keyed_segments(v["pixels"], v.get("keys")) for v in visual]
        media["pixel_values"] = from_keyed([s for s, _ in segments], [k for _, k in segments], shared=shared)
        media["image_sizes"] = PackedTensor.from_list([v["sizes"] for v in visual])
        media["num_frames"] = torch.tensor([v["frames"] for v in visual], dtype=torch.int32)
        media["num_units"] = torch.tensor([v["sizes"].shape[0] for v in visual], dtype=torch.int32)
        media["patch_size"] = _patch_size(visual)
    if audio:
        frames = max(a["features"].shape[1] for a in audio)
        padded: dict = {}                        # keys -> padded features (a repeated audio is padded once)
        segments = []
        for a in audio:
            keys = tuple(a.get("keys") or ())
            f = padded.get(keys) if keys else None
            if f is None:
                f = a["features"]
                f = torch.nn.functional.pad(f, (0, 0, 0, frames - f.shape[1])) if f.shape[1] < frames else f
                if keys:
                    padded[keys] = f
            segments.append(_keyed_segments(f, keys))
        media["sound_features"] = from_keyed([s for s, _ in segments], [k for _, k in segments], shared=shared)
        media["sound_lengths"] = PackedTensor.from_list([a["lengths"] for a in audio])
    return BatchMedia(**media)


def batch_rows(rows: Sequence[PackedRow]) -> PackedBatch:
    """Stack rows into a ``PackedBatch``."""
    return PackedBatch(
        tokens=torch.stack([r.tokens for r in rows]),
        labels=torch.stack([r.labels for r in rows]),
        loss_mask=torch.stack([r.loss_mask for r in rows]),
        position_ids=torch.stack([r.position_ids for r in rows]),
        cu_seqlens=[r.cu_seqlens for r in rows],
        cu_seqlens_padded=[r.cu_seqlens_padded for r in rows],
        max_seqlen=[r.max_seqlen for r in rows],
        sample_keys=[list(r.keys) for r in rows],
        media=batch_media(rows),
        media_spans=[list(r.media_spans) for r in rows],
    )
