"""``preview --html``: packed batches as one self-contained HTML page.

Each row shows its segments as coloured bands, every token as a small box (trained targets
highlighted, padding greyed), and media where their placeholders sit: image thumbnails, video
frames, audio as a mel-spectrogram image (all rebuilt from the batch's own tensors, so the page
shows exactly what the model receives). Hovering a token shows its position, id, label and loss
mask. No scripts or external files: images are inline PNG data.
"""

from __future__ import annotations

import base64
import html
import io
from typing import Any, Iterable

import numpy as np

from energon_nemotron.batch import IGNORE_INDEX, MediaSpan, PackedBatch

CSS = """
body{font-family:system-ui,sans-serif;margin:16px;background:#fafafa;color:#222}
h1{font-size:20px} h2{font-size:15px;margin:18px 0 4px} .meta{color:#555;font-size:12px;margin-bottom:6px}
.row{background:#fff;border:1px solid #ddd;border-radius:6px;padding:8px;margin-bottom:14px}
.seg{border-left:6px solid var(--c);background:color-mix(in srgb,var(--c) 12%,white);padding:4px 6px;margin:3px 0;
     line-height:1.9;font-family:ui-monospace,monospace;font-size:12px;word-break:break-all}
.seg .name{font:11px system-ui;color:#333;display:block}
.t{padding:1px 0;border-radius:2px} .t.tr{background:#ffe066;outline:1px solid #e0b800} .t.pad{color:#bbb}
.media{display:inline-flex;gap:3px;align-items:center;border:2px solid #4a7;border-radius:4px;padding:2px;margin:2px;
       vertical-align:middle;background:#efe} .media img{max-height:96px;image-rendering:auto} .media span{font:11px system-ui}
.legend span{display:inline-block;margin-right:12px;font-size:12px}
"""
PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f"]
CLIP_MEAN = np.array([0.48145466, 0.4578275, 0.40821073], dtype=np.float32)
CLIP_STD = np.array([0.26862954, 0.26130258, 0.27577711], dtype=np.float32)


def _png(pixels: np.ndarray, max_side: int = 160) -> str:
    """uint8 [H, W] or [H, W, 3] → a PNG data URI, scaled down to ``max_side``."""
    from PIL import Image

    img = Image.fromarray(pixels)
    img.thumbnail((max_side, max_side))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def unpatchify(rows: np.ndarray, grid_h: int, grid_w: int, patch: int = 16) -> np.ndarray:
    """float32 [grid_h·grid_w, 3·patch·patch] CLIP-normalised patches → uint8 [H, W, 3] image."""
    x = rows.reshape(grid_h, grid_w, 3, patch, patch).transpose(0, 3, 1, 4, 2)
    x = x.reshape(grid_h * patch, grid_w * patch, 3) * CLIP_STD + CLIP_MEAN
    return np.clip(x * 255 + 0.5, 0, 255).astype(np.uint8)


def mel_image(features: np.ndarray, valid: int) -> np.ndarray:
    """float32 [frames, mel] log-mel features → uint8 [mel, frames] image (low frequencies at the bottom)."""
    x = features[:max(valid, 1)].T[::-1]
    lo, hi = float(x.min()), float(x.max())
    return ((x - lo) / (hi - lo + 1e-6) * 255).astype(np.uint8)


def _media_html(batch: PackedBatch, spans: list[MediaSpan], visual_index: int, audio_index: int,
                span: MediaSpan) -> str:
    label = html.escape(f"{span.kind} of {span.sample_key}: {span.num_tokens} tokens")
    imgs = []
    media = batch.media
    if span.is_audio:
        feats = media.sound_features[audio_index].numpy()
        lengths = media.sound_lengths[audio_index].tolist()
        for clip in range(min(len(lengths), 2)):
            imgs.append(_png(mel_image(feats[clip], int(lengths[clip])), 240))
    else:
        rows = media.pixel_values[visual_index].numpy()
        sizes = media.image_sizes[visual_index].tolist()
        patch = media.patch_size
        at = 0
        for unit, (gh, gw) in enumerate(sizes):
            n = gh * gw
            if unit < 4:
                imgs.append(_png(unpatchify(rows[at:at + n], gh, gw, patch)))
            at += n
    inner = "".join(f'<img src="{src}" alt="{label}">' for src in imgs)
    return f'<span class="media" title="{label}">{inner}<span>{label}</span></span>'


def row_html(batch: PackedBatch, r: int, tokenizer: Any, visual_start: int, audio_start: int) -> tuple[str, int, int]:
    """HTML of row ``r``; returns it with the media indices that follow its items."""
    tokens, labels = batch.tokens[r].tolist(), batch.labels[r].tolist()
    mask = batch.loss_mask[r].tolist()
    real, padded = batch.cu_seqlens[r].tolist(), batch.cu_seqlens_padded[r].tolist()
    spans = sorted(batch.media_spans[r], key=lambda s: s.token_start)
    by_start = {s.token_start: s for s in spans}
    vis, aud = visual_start, audio_start
    out = []
    for s, (a, b) in enumerate(zip(padded, padded[1:])):
        key = batch.sample_keys[r][s] if s < len(batch.sample_keys[r]) else "padding"
        n_real = real[s + 1] - real[s]
        out.append(f'<div class="seg" style="--c:{PALETTE[s % len(PALETTE)]}">'
                   f'<span class="name">segment {s}: {html.escape(str(key))} — positions [{a}, {b}), '
                   f'{n_real} tokens</span>')
        t = a
        while t < b:
            span = by_start.get(t)
            if span is not None:
                out.append(_media_html(batch, spans, vis, aud, span))
                if span.is_audio:
                    aud += 1
                else:
                    vis += 1
                t += span.placeholder_len
                continue
            trained = t > 0 and mask[t - 1] > 0
            pad = t - a >= n_real
            label = labels[t]
            title = (f"pos {t} · id {tokens[t]} · label {'-100' if label == IGNORE_INDEX else label} · "
                     f"loss {'1' if mask[t] else '0'}")
            text = "·" if pad else tokenizer.decode([tokens[t]]).replace("\n", "↵")
            cls = "t pad" if pad else ("t tr" if trained else "t")
            out.append(f'<span class="{cls}" title="{title}">{html.escape(text) or "∅"}</span>')
            if not pad and "↵" in text:
                out.append("<br>")
            t += 1
        out.append("</div>")
    return "".join(out), vis, aud


def render_html(batches: Iterable[PackedBatch], tokenizer: Any, title: str = "energon-nemotron preview") -> str:
    """One HTML page for ``batches``."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>",
             '<div class="legend"><span><span class="t tr">trained</span> = a label the loss uses</span>'
             '<span><span class="t pad">·</span> = padding</span><span>hover a token for position, id, '
             'label and loss mask</span></div>']
    for i, batch in enumerate(batches):
        vis = aud = 0
        for r in range(batch.batch_size):
            fill = int(batch.cu_seqlens[r][-1]) / batch.seq_length
            parts.append(f"<h2>batch {i}, row {r}</h2><div class='meta'>{len(batch.sample_keys[r])} samples · "
                         f"{int(batch.loss_mask[r].sum())} trained labels · fill {fill:.1%} · "
                         f"{len(batch.media_spans[r])} media{' · padding row' if batch.is_padding[r] else ''}</div>")
            body, vis, aud = row_html(batch, r, tokenizer, vis, aud)
            parts.append(f"<div class='row'>{body}</div>")
    parts.append("</body></html>")
    return "".join(parts)
