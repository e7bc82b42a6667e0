"""One epoch of the split, in the numbers a user budgets training steps with (pure functions).

What one pass of the loader over the split yields, from the datasets' sizes (``samples_in_split``
/ ``rows_in_file``, exact whatever ``--limit`` read) and the blend:

- an Energon ``blend_epochized`` (each leaf with its ``repetitions``; Energon multiplies nested
  ones): one epoch draws ``Σ repetitions_i · samples_i`` samples. A fractional repetition takes
  the first part of the leaf's samples in each worker (Energon rounds down per worker), so the
  figure is then an upper bound;
- a single dataset: its samples, once;
- a weighted ``blend``: no epoch (Energon draws from the datasets by weight, without end); the
  summary says so and gives only the samples the datasets hold together;
- the validation split: every dataset once (Energon concatenates; repetitions and weights do not
  apply), a pass capped at ``data.validation.limit`` batches when that is set;
- Megatron-LM rows: the rows of the file, once; a row is a pack already.

Of the samples drawn, ``ok`` are those read fine (what the loader keeps under ``on_error: skip``):
``repetitions_i · ok_i``, and when ``--limit`` stopped the read early, ``ok_i`` extrapolated from
the share of the samples read that were fine. ``packs`` is an estimate: each dataset's packs per
sample read (``aggregate.pack_fill``) times its samples in the epoch (the loader's blend mixes the
datasets, so its buffers differ); ``batches`` are the packs per data-parallel rank in batches of
``loader.batch_size``, rounded up.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

#: at most this many terms of ``repetitions × samples`` in the text
TERMS = 6


def _scale(d: dict, size: int) -> float:
    """How many samples of the dataset each one read stands for (1 when all were read)."""
    return size / d["read"] if d["read"] else 0.0


def _term(d: dict, repetitions: float) -> dict:
    """One dataset's share of the epoch: ``{"path", "repetitions", "samples", "ok", "packs",
    "extrapolated"}`` (``samples`` exact from its size; ``ok``, ``packs`` floats)."""
    size = d.get("samples_in_split", d.get("rows_in_file", 0))
    scale = _scale(d, size)
    packs = d["packing"]["packs"] if "packing" in d else d["ok"]          # a Megatron-LM row is a pack
    return {"path": d["path"], "repetitions": repetitions, "size": size, "samples": math.floor(repetitions * size),
            "ok": repetitions * d["ok"] * scale, "packs": repetitions * packs * scale,
            "extrapolated": d["read"] < size}


def _mode(datasets: list[dict], split: str, megatron: bool) -> str:
    """``rows`` | ``validation`` | ``blend`` (weighted: no epoch) | ``blend_epochized`` | ``dataset``."""
    if megatron:
        return "rows"
    if split == "validation":
        return "validation"
    if any(d.get("weight") is not None for d in datasets):
        return "blend"
    if any(d.get("repetitions") is not None for d in datasets):
        return "blend_epochized"
    return "dataset"


def epoch_summary(summary: dict, *, split: str, batch_size: int = 1, dp_size: int = 1,
                  validation_limit: Optional[int] = None, virtual_epoch_length: int = 0) -> dict:
    """The epoch of a ``stats`` summary (``aggregate.summarize``'s dict: ``datasets`` with their
    sizes, ``read``, ``ok`` and ``packing``) as one JSON-able dict: ``mode``, ``unit``, ``samples``
    (int, None for a weighted blend), ``exact`` (False: fractional repetitions, an upper bound),
    ``ok``, ``packs``, ``batches`` (ints, estimates), ``extrapolated`` (``--limit`` read part of a
    dataset), ``datasets`` (per dataset its repetitions and samples), ``batch_size``, ``dp_size``,
    ``notes`` (list of str)."""
    datasets = summary["datasets"]
    megatron = bool(datasets) and datasets[0].get("unit") == "rows"
    mode = _mode(datasets, split, megatron)
    out: dict[str, Any] = {"split": split, "mode": mode, "unit": "rows" if megatron else "samples",
                           "batch_size": batch_size, "dp_size": dp_size, "notes": []}
    if mode == "blend":
        out.update(samples=None, exact=False, ok=None, packs=None, batches=None, extrapolated=False,
                   held=sum(d.get("samples_in_split", 0) for d in datasets), datasets=[])
        out["notes"].append("a weighted blend has no epoch: Energon draws from its datasets by weight, without end "
                            "(a blend_epochized with repetitions has one)")
        return out
    terms = [_term(d, 1 if mode != "blend_epochized" or d.get("repetitions") is None else d["repetitions"])
             for d in datasets]
    packs = round(sum(t["packs"] for t in terms))
    out.update(samples=sum(t["samples"] for t in terms), exact=all(float(t["repetitions"]).is_integer() for t in terms),
               ok=round(sum(t["ok"] for t in terms)), packs=packs,
               batches=math.ceil(packs / (batch_size * dp_size)), extrapolated=any(t["extrapolated"] for t in terms),
               datasets=[{k: t[k] for k in ("path", "repetitions", "size", "samples")} for t in terms])
    if not out["exact"]:
        out["notes"].append("fractional repetitions: Energon rounds each worker's share down, so an epoch may draw a "
                            "few samples fewer")
    if mode == "validation" and validation_limit:
        out["notes"].append(f"data.validation.limit caps a pass at {validation_limit} batches")
    if mode != "validation" and virtual_epoch_length:
        out["notes"].append(f"data.train.virtual_epoch_length: the loader's epochs are {virtual_epoch_length} "
                            "batches each, whatever the data holds")
    return out


def _sum_text(epoch: dict) -> str:
    """``2 × 12 (text) + 1 × 7 (chat.jsonl)``: the epoch's samples by dataset."""
    terms = [f"{t['repetitions']:g} × {t['size']} ({Path(t['path']).name})" for t in epoch["datasets"]]
    if len(terms) > TERMS:
        terms = terms[:TERMS] + [f"... {len(terms) - TERMS} more"]
    return " + ".join(terms)


def _what(epoch: dict) -> str:
    return {"rows": "of the Megatron-LM file", "validation": "of the validation split (each dataset once)",
            "blend_epochized": "of the blend (blend_epochized, repetitions applied)",
            "dataset": "of the dataset"}[epoch["mode"]]


def epoch_rows(epoch: dict) -> list[tuple[str, str]]:
    """(label, text) of every line the text report and the HTML page show for the epoch."""
    unit = epoch["unit"]
    if epoch["samples"] is None:
        rows = [("epoch", f"none: {epoch['notes'][0]}; its datasets hold {epoch['held']} {unit} together")]
        return rows + [("", n) for n in epoch["notes"][1:]]
    bound = "" if epoch["exact"] else "at most "
    terms = len(epoch["datasets"]) > 1 or any(t["repetitions"] != 1 for t in epoch["datasets"])
    rows = [("epoch", f"one epoch {_what(epoch)} yields {bound}{epoch['samples']} {unit}"
                      + (f" = {_sum_text(epoch)}" if terms else ""))]
    about = "≈ " if epoch["extrapolated"] or not epoch["exact"] else ""
    source = (f" (extrapolated: --limit read the first {unit} of each dataset; the share of them read fine, "
              "times the dataset's size)" if epoch["extrapolated"] else "")
    rows.append(("read fine", f"{about}{epoch['ok']} of them{source}"))
    packs = ("rows are packs already" if unit == "rows" else f"≈ {epoch['packs']} packs at each dataset's "
             "samples per pack")
    rows.append(("steps", f"{packs}: ≈ {epoch['batches']} batches per rank (batch_size {epoch['batch_size']}, "
                          f"dp_size {epoch['dp_size']})"))
    return rows + [("", n) for n in epoch["notes"]]
