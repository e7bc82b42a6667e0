"""The text view of ``energon-nemotron stats``: one block per dataset, the total, then the epoch.

Numbers are rounded here, for the text and the HTML page alike (:func:`mean_text`,
:func:`ratio_text`, :func:`percent`, :func:`human_bytes`); the JSON keeps them unrounded."""

from __future__ import annotations

from typing import Any

from energon_nemotron.stats.epoch import epoch_rows

BAR = 40


def human_bytes(n: float) -> str:
    """``1536`` → ``1.5 KiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"     # pragma: no cover


def percent(share: float) -> str:
    return f"{100 * share:.1f}%"


def mean_text(mean: float) -> str:
    """A length's or a token count's mean as the report shows it: one decimal (``512.3``)."""
    return f"{mean:.1f}"


def ratio_text(ratio: float) -> str:
    """A per-row or per-pack mean (conversations per row, samples per pack): two decimals."""
    return f"{ratio:.2f}"


def _flow(d: dict) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in d.items()) + "}"


def histogram_lines(hist: dict, seq_length: int) -> list[str]:
    """One line per bin from the first to the last non-empty one: range, bar, count; the bin
    holding ``seq_length`` is marked; a run of more than two empty bins is one line."""
    counts, edges = hist["counts"], hist["edges"]
    used = [i for i, c in enumerate(counts) if c]
    if not used:
        return ["(no lengths)"]
    peak = max(counts)
    width = len(str(edges[-1]))
    lines, i = [], used[0]
    while i <= used[-1]:
        run = next((j for j in range(i, used[-1] + 1) if counts[j]), used[-1] + 1) - i
        held = any(edges[j] <= seq_length < edges[j + 1] for j in range(i, i + run))
        if run > 2:
            mark = "  (seq_length in here)" if held else ""
            lines.append(f"[{edges[i]:>{width}}, {edges[i + run]:>{width}})  {'':<{BAR}} 0 in {run} bins{mark}")
            i += run
            continue
        bar = "█" * max(1, round(BAR * counts[i] / peak)) if counts[i] else ""
        mark = "  ← seq_length" if edges[i] <= seq_length < edges[i + 1] else ""
        close = "]" if i == len(counts) - 1 else ")"          # the last bin also holds its upper edge
        lines.append(f"[{edges[i]:>{width}}, {edges[i + 1]:>{width}}{close}  {bar:<{BAR}} {counts[i]}{mark}")
        i += 1
    return lines


def _length_lines(length: dict, seq_length: int, what: str) -> list[str]:
    over = length["over_seq_length"]
    if not length["count"]:
        return [f"  {what:<11} none measured"]
    return [f"  {what:<11} n {length['count']}  min {length['min']}  mean {mean_text(length['mean'])}  "
            f"p50 {length['p50']}  p90 {length['p90']}  p99 {length['p99']}  max {length['max']}",
            f"  {'over ' + str(seq_length):<11} {over['count']} ({percent(over['share'])})"]


def _media_lines(media: dict) -> list[str]:
    if not media:
        return [f"  {'media':<11} none"]
    lines = [f"  {'media':<11} {'kind':<6} {'items':>6} {'bytes total':>12} {'mean':>10} {'max':>10}"
             f" {'tokens total':>13} {'mean':>9} {'max':>7}"]
    for kind, m in media.items():
        b, t = m["bytes"], m["planned_tokens"]
        lines.append(f"  {'':<11} {kind:<6} {m['count']:>6} {human_bytes(b['total']):>12} {human_bytes(b['mean']):>10} "
                     f"{human_bytes(b['max']):>10} {t['total']:>13} {mean_text(t['mean']):>9} {t['max']:>7}")
    return lines


def packing_text(p: dict) -> str:
    """The packing of a block (``aggregate.pack_fill``'s dict) in words, for the text and the HTML page."""
    if not p.get("algorithm"):
        return f"{p['note']}: {p['samples']} rows, fill {percent(p['fill_ratio'])}"
    limits = f", max {p['max_sequences_per_bin']} per pack" if p.get("max_sequences_per_bin") else ""
    patches = f", max {p['max_media_patches_per_pack']} patches" if p.get("max_media_patches_per_pack") else ""
    delta = f", delta {p['balanced_knapsack_delta']}" if p.get("balanced_knapsack_delta") is not None else ""
    return (f"{p['algorithm']} (buffer {p['buffer_size']}, pad_multiple {p['pad_multiple']}"
            f"{limits}{patches}{delta}): {p['samples']} samples in {p['packs']} packs, "
            f"fill {percent(p['fill_ratio'])}, {ratio_text(p['samples_per_pack'])} samples/pack")


def _skip_lines(block: dict) -> list[str]:
    lines = []
    for code, examples in block["skip_examples"].items():
        for e in examples:
            lines.append(f"  {'e.g.':<11} {code}: {e}")
    return lines


def block_lines(block: dict, seq_length: int, examples: bool = True) -> list[str]:
    """The lines of one dataset's (or the total's) numbers; ``examples``: with skipped samples'
    messages."""
    unit = block["unit"]
    skipped = ", ".join(f"{k} {v}" for k, v in block["skipped"].items())
    lines = [f"  {unit:<11} {block['read']} read, {block['ok']} ok, {block['read'] - block['ok']} skipped"
             + (f": {skipped}" if skipped else "")]
    if unit == "rows":
        c = block["conversations"]
        by = ", ".join(f"{k}: {v}" for k, v in c["rows_by_count"].items())
        lines.append(f"  {'convs/row':<11} mean {ratio_text(c['per_row_mean'])}  max {c['per_row_max']}  "
                     f"(rows by count {by})")
        lines += _length_lines(block["length"], seq_length, "positions")
        t = block["truncated"]
        lines.append(f"  {'truncated':<11} {t['count']} rows ({percent(t['share'])}), "
                     f"{block['dropped_conversations']} conversations dropped")
    else:
        lines += _length_lines(block["length"], seq_length, "length")
    hist = histogram_lines(block["length"]["histogram"], seq_length)
    lines += [f"  {'histogram' if i == 0 else '':<11} {h}" for i, h in enumerate(hist)]
    if unit == "samples":
        lines += _media_lines(block["media"])
        lines.append(f"  {'packing':<11} {packing_text(block['packing'])}")
    return lines + (_skip_lines(block) if examples else [])


def describe_dataset(d: dict) -> str:
    bits = [d["format"]]
    if d.get("weight") is not None:
        bits.append(f"weight {d['weight']:.4g}")
    if d.get("repetitions") is not None:
        bits.append(f"repetitions {d['repetitions']}")
    if d.get("cooker"):
        bits.append(f"cooker {d['cooker']}")
    if d.get("subflavors"):
        bits.append(f"subflavors {_flow(d['subflavors'])}")
    if d.get("aux"):
        bits.append(f"aux {', '.join(d['aux'])}")
    if "samples_in_split" in d:
        bits.append(f"{d['samples_in_split']} samples in the split")
    if "rows_in_file" in d:
        bits.append(f"{d['rows_in_file']} rows in the file, {d['prompt_format']}, CP {d['context_parallel_size']}")
    return " · ".join(bits)


def render_text(result: dict) -> str:
    """The whole report."""
    n = len(result["datasets"])
    limit = f", at most {result['limit']} per dataset" if result.get("limit") else ""
    lines = [f"stats of {result['config'] or 'the loader config'}, split {result['split']}: {result['source']} "
             f"({result['format']}), {n} dataset{'s' if n != 1 else ''}, engine {result['engine']} "
             f"({result['readers']} reader{'s' if result['readers'] != 1 else ''}){limit}",
             f"seq_length {result['seq_length']}; length = {result['length_measure']}", ""]
    for i, d in enumerate(result["datasets"], 1):
        lines += [f"[{i}/{n}] {d['path']}", f"  {describe_dataset(d)}"]
        lines += block_lines(d, result["seq_length"]) + [""]
    total: Any = result["total"]
    lines += [f"[total] {n} dataset{'s' if n != 1 else ''}"] + block_lines(total, result["seq_length"], examples=False)
    if total["unit"] == "samples" and n > 1:
        lines.append(f"  {'':<11} ({total['packing']['note']})")
    if result.get("epoch"):
        lines += ["", f"[epoch] split {result['epoch']['split']}"]
        lines += [f"  {label:<11} {text}" for label, text in epoch_rows(result["epoch"])]
    return "\n".join(lines)
