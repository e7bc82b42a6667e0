"""``stats --html``: the statistics as one self-contained HTML page.

One section per dataset, one for the total and one for the epoch: the numbers as tables, rounded
as the text report rounds them (``report.mean_text``, ``report.packing_text``, ...), and the length
histogram as an image (a PNG drawn with PIL, inline as base64 data; no scripts, no external files),
with ``seq_length`` marked as a red line.
"""

from __future__ import annotations

import base64
import html
import io
from typing import Any

from energon_nemotron.stats.aggregate import histograms
from energon_nemotron.stats.epoch import epoch_rows
from energon_nemotron.stats.report import describe_dataset, human_bytes, mean_text, packing_text, percent, ratio_text

CSS = """
body{font-family:system-ui,sans-serif;margin:16px;background:#fafafa;color:#222}
h1{font-size:20px} h2{font-size:15px;margin:22px 0 4px} .meta{color:#555;font-size:12px;margin-bottom:6px}
section{background:#fff;border:1px solid #ddd;border-radius:6px;padding:10px;margin-bottom:14px}
table{border-collapse:collapse;font-size:13px;margin:6px 0}
td,th{border:1px solid #e3e3e3;padding:2px 8px;text-align:right}
th{background:#f3f3f3} td.l,th.l{text-align:left} .ex{font:12px ui-monospace,monospace;color:#833}
"""
WIDTH, HEIGHT, MARGIN = 640, 220, 36


def histogram_png(hist: dict, seq_length: int) -> bytes:
    """A bar chart of ``hist`` (``edges``, ``counts``) as PNG bytes: bars, the first and last edge
    and the peak count as labels, ``seq_length`` as a red vertical line."""
    from PIL import Image, ImageDraw

    counts, edges = hist["counts"], hist["edges"]
    img = Image.new("RGB", (WIDTH, HEIGHT), "white")
    draw = ImageDraw.Draw(img)
    left, right, top, bottom = MARGIN + 10, WIDTH - 12, 12, HEIGHT - MARGIN
    draw.line([(left, bottom), (right, bottom)], fill="#444")
    draw.line([(left, top), (left, bottom)], fill="#444")
    peak = max(counts) or 1
    span = (right - left) / len(counts)
    for i, c in enumerate(counts):
        if c:
            h = (bottom - top) * c / peak
            draw.rectangle([left + i * span + 1, bottom - h, left + (i + 1) * span - 1, bottom], fill="#4e79a7")
    lo, hi = edges[0], edges[-1]
    x = left + (right - left) * (seq_length - lo) / (hi - lo) if hi > lo else left
    draw.line([(x, top), (x, bottom)], fill="#d62728", width=2)
    label = f"seq_length {seq_length}"
    width = draw.textlength(label)
    draw.text((x + 3 if x + 3 + width < WIDTH else x - 3 - width, top), label, fill="#d62728")
    draw.text((left, bottom + 6), str(lo), fill="#222")
    draw.text((right - 8 * len(str(hi)), bottom + 6), str(hi), fill="#222")
    draw.text((4, top), str(peak), fill="#222")
    draw.text((left + (right - left) // 2 - 40, bottom + 18), "length", fill="#222")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _img(hist: dict, seq_length: int, title: str) -> str:
    data = base64.b64encode(histogram_png(hist, seq_length)).decode("ascii")
    return f'<img alt="length histogram of {html.escape(title)}" src="data:image/png;base64,{data}">'


def _table(rows: list[tuple], head: tuple = ()) -> str:
    out = ["<table>"]
    if head:
        out.append("<tr>" + "".join(f'<th class="{"l" if i == 0 else ""}">{html.escape(str(h))}</th>'
                                    for i, h in enumerate(head)) + "</tr>")
    for row in rows:
        out.append("<tr>" + "".join(f'<td class="{"l" if i == 0 else ""}">{html.escape(str(v))}</td>'
                                    for i, v in enumerate(row)) + "</tr>")
    return "".join(out + ["</table>"])


def _numbers(block: dict, seq_length: int) -> str:
    """The tables of one block (a dataset's or the total's numbers)."""
    length = block["length"]
    over = length["over_seq_length"]
    rows = [(block["unit"] + " read", block["read"]), ("ok", block["ok"]),
            ("skipped", ", ".join(f"{k} {v}" for k, v in block["skipped"].items()) or "none")]
    if block["unit"] == "rows":
        c, t = block["conversations"], block["truncated"]
        rows += [("conversations per row", f"mean {ratio_text(c['per_row_mean'])}, max {c['per_row_max']}"),
                 ("truncated rows", f"{t['count']} ({percent(t['share'])})"),
                 ("conversations dropped", block["dropped_conversations"])]
    out = [_table(rows)]
    stats = [(k, mean_text(length[k]) if k == "mean" else length[k])
             for k in ("count", "min", "mean", "p50", "p90", "p99", "max") if k in length]
    out.append(_table(stats + [(f"over seq_length {seq_length}", f"{over['count']} ({percent(over['share'])})")]))
    if block["unit"] == "samples":
        media = [(k, m["count"], human_bytes(m["bytes"]["total"]), human_bytes(m["bytes"]["mean"]),
                  human_bytes(m["bytes"]["max"]), m["planned_tokens"]["total"], mean_text(m["planned_tokens"]["mean"]),
                  m["planned_tokens"]["max"]) for k, m in block["media"].items()]
        if media:
            out.append(_table(media, ("media", "items", "bytes total", "mean", "max", "tokens total", "mean", "max")))
        out.append(_table([("packing", packing_text(block["packing"]))]))
    for code, examples in block["skip_examples"].items():
        out += [f'<div class="ex">{html.escape(code)}: {html.escape(e)}</div>' for e in examples]
    return "".join(out)


def render_html(result: dict) -> str:
    """The page of a ``stats`` result: one ``<img>`` per histogram (each dataset's, the total's)."""
    seq = result["seq_length"]
    images = histograms(result)
    title = f"stats: {result['config'] or result['source']} — split {result['split']}"
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>",
             f"<div class='meta'>{html.escape(result['source'])} ({html.escape(result['format'])}), "
             f"engine {html.escape(result['engine'])}; length = {html.escape(result['length_measure'])}</div>"]
    for d, (name, hist, _) in zip(result["datasets"], images):
        parts.append(f"<section><h2>{html.escape(name)}</h2><div class='meta'>{html.escape(describe_dataset(d))}</div>"
                     f"{_img(hist, seq, name)}{_numbers(d, seq)}</section>")
    total: Any = result["total"]
    parts.append(f"<section><h2>total ({len(result['datasets'])} datasets)</h2>"
                 f"{_img(images[-1][1], seq, 'total')}{_numbers(total, seq)}</section>")
    if result.get("epoch"):
        parts.append(f"<section><h2>epoch (split {html.escape(result['epoch']['split'])})</h2>"
                     f"{_table(epoch_rows(result['epoch']))}</section>")
    return "".join(parts + ["</body></html>"])
