"""Human and JSON views of packed rows and batches (``inspect-megatron`` and ``preview``).

A row is a dict with 1-D ``tokens``, ``labels``, ``loss_mask``, ``position_ids``, ``cu_seqlens``
and optionally ``cu_seqlens_padded``, ``max_seqlen``, ``sample_keys``, flags and ``media_spans``
(``MediaSpan``s, as ``PackedBatch.row`` gives them).
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

GREEN = "\x1b[30;42m"
DIM = "\x1b[2m"
RESET = "\x1b[0m"


#: the tensor fields of a row (and, one per row, of a ``PackedBatch``)
TENSOR_FIELDS = ("tokens", "labels", "loss_mask", "position_ids", "cu_seqlens", "cu_seqlens_padded")


def _plain(value: Any) -> Any:
    """A tensor (or a list of tensors, one per row) as lists; anything else as it is."""
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value.tolist() if hasattr(value, "tolist") else value


def row_json(index: int, row: dict[str, Any]) -> dict[str, Any]:
    """One row as plain JSON values (tensors as lists)."""
    out = {"row": index}
    out.update({key: _plain(row[key]) for key in TENSOR_FIELDS if key in row})
    for key in ("max_seqlen", "sample_keys", "truncated", "dropped_conversations", "is_padding"):
        if key in row:
            out[key] = row[key]
    out["num_valid_tokens"] = int(row["loss_mask"].sum().item())
    return out


def batch_json(index: int, batch: Any) -> dict[str, Any]:
    """One ``PackedBatch`` as plain JSON values: its rows' tensors as nested lists, and one entry
    per media item (its span, with the row it is in)."""
    return {"batch": index, "sample_keys": batch.sample_keys,
            **{key: _plain(getattr(batch, key)) for key in TENSOR_FIELDS}, "is_padding": batch.is_padding,
            "media": [{"row": r, **span.as_dict()} for r, spans in enumerate(batch.media_spans) for span in spans]}


def _runs(flags: list[bool]) -> Iterable[tuple[int, int, bool]]:
    """(start, end, flag) of each run of equal flags."""
    start = 0
    for i in range(1, len(flags) + 1):
        if i == len(flags) or flags[i] != flags[start]:
            yield start, i, flags[start]
            start = i


def row_text(index: int, row: dict[str, Any], tokenizer: Any, color: bool, pad_id: Optional[int] = None) -> str:
    """Segments of a row with decoded text; tokens that are trained targets are highlighted.

    Input token ``t`` is trained when ``loss_mask[t-1] == 1`` (it is the label of position t-1).
    Without colour, trained text is wrapped in ``⟦ ⟧``. Padding shows as ``«pad×n»``: the positions
    of a segment beyond its real length (``cu_seqlens`` vs ``cu_seqlens_padded``), or, when
    ``pad_id`` is given (Megatron-LM rows, whose pads sit inside segments), runs of that id.
    """
    tokens = row["tokens"].tolist()
    mask = row["loss_mask"].tolist()
    trained = [False] + [m > 0 for m in mask[:-1]]
    real = row["cu_seqlens"].tolist()
    cu = row["cu_seqlens_padded"].tolist() if "cu_seqlens_padded" in row else real
    n_valid = int(sum(mask))
    head = (f"row {index}  keys {row.get('sample_keys')}  segments {len(cu) - 1}  "
            f"trained labels {n_valid}  max_seqlen {row['max_seqlen']}"
            + ("  TRUNCATED" if row.get("truncated") else "")
            + ("  PADDING ROW" if row.get("is_padding") else ""))
    lines = [head]
    for s, (a, b) in enumerate(zip(cu, cu[1:])):
        lines.append(f"  segment {s}  [{a}, {b})  {b - a} positions")
        parts = []
        seg_tokens, seg_trained = tokens[a:b], trained[a:b]
        if pad_id is not None:
            is_pad = [t == pad_id for t in seg_tokens]
        else:
            n_real = real[s + 1] - real[s]
            is_pad = [i >= n_real for i in range(b - a)]
        for i, j, pad in _runs(is_pad):
            if pad:
                parts.append((DIM + f"«pad×{j - i}»" + RESET) if color else f"«pad×{j - i}»")
                continue
            for k, m, on in _runs(seg_trained[i:j]):
                text = _decode_compact(tokenizer, seg_tokens[i + k:i + m], color)
                if on:
                    text = (GREEN + text + RESET) if color else f"⟦{text}⟧"
                parts.append(text)
        body = "".join(parts)
        lines.extend("    " + line for line in body.split("\n"))
    for span in row.get("media_spans") or []:
        fields = span.as_dict()
        detail = ", ".join(f"{k} {v}" for k, v in fields.items() if k not in ("kind", "sample_key"))
        lines.append(f"  {span.kind} of {span.sample_key}: {detail}")
    return "\n".join(lines)


def _decode_compact(tokenizer: Any, ids: list[int], color: bool, min_run: int = 8) -> str:
    """Decoded text, with runs of one repeated id (media placeholders) shown as ``«<image>×n»``."""
    out, start = [], 0
    i = 0
    while i < len(ids):
        j = i
        while j < len(ids) and ids[j] == ids[i]:
            j += 1
        if j - i >= min_run:
            out.append(tokenizer.decode(ids[start:i]))
            mark = f"«{tokenizer.decode([ids[i]])}×{j - i}»"
            out.append((DIM + mark + RESET) if color else mark)
            start = j
        i = j
    out.append(tokenizer.decode(ids[start:]))
    return "".join(out)
