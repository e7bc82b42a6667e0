"""``energon-nemotron preview``: the packed batches a loader config produces, for people.

Human view: every row's segments with decoded text and trained tokens highlighted. ``--json``: one
object per batch (``sample_keys``, ``tokens``, ``labels``, ``loss_mask``, ``position_ids``,
``cu_seqlens``, ``cu_seqlens_padded`` as lists), then ``{"summary": {...}}``. The training split is read once
(one epoch, every sample at most once; ``--batches N`` and ``--html`` stop after N batches of it,
and the summary says so). A weighted blend has no epoch: there ``--batches N`` reads N batches of
the repeating stream, as in training, and says that too; so does a preview that restores a state saved by a repeating loader
(``--load-state``, training's state).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from energon_nemotron.config import MegatronSource
from energon_nemotron.errors import ConfigError
from energon_nemotron.inspection.html import render_html
from energon_nemotron.inspection.rows import batch_json, row_text
from energon_nemotron.loading import as_config, build_train_loader, build_val_loader
from energon_nemotron.resume import load_state_file, save_state_file
from energon_nemotron.tokenization.loading import load_tokenizer


@dataclass
class PreviewOptions:
    """The stream ``run_preview`` shows: the ``split`` (``train`` | ``validation``) as data-parallel
    rank ``dp_rank`` of ``dp_size`` reads it; ``load_state``: resume from a state file first;
    ``save_state``: write the position after the last batch shown (atomically; both: train only)."""

    split: str = "train"
    dp_rank: int = 0
    dp_size: int = 1
    load_state: Optional[str] = None
    save_state: Optional[str] = None


def run_preview(config_path: str, batches: Optional[int] = None, as_json: bool = False, color: str = "auto",
                out=None, html: Optional[str] = None, options: Optional[PreviewOptions] = None) -> int:
    """Print the batches of the stream ``options`` selects (:class:`PreviewOptions`; default: the
    train split of a single rank); returns the exit status. ``html``: write the batches
    (``batches``, default 8) as an HTML page instead of printing them. Anything the loader itself
    prints goes to stderr, so ``--json`` output stays parseable."""
    out = out or sys.stdout
    if html and batches is None:
        batches = HTML_BATCHES
    with contextlib.redirect_stdout(sys.stderr):
        return _preview(config_path, batches, as_json, color, out, html, options or PreviewOptions())


HTML_BATCHES = 8


def _preview(config_path: str, batches: Optional[int], as_json: bool, color: str, out, html: Optional[str],
             o: PreviewOptions) -> int:
    cfg = as_config(config_path)
    if o.split == "validation":
        loader, repeating = build_val_loader(cfg, dp_rank=o.dp_rank, dp_size=o.dp_size), None
        source = cfg.data.validation
    else:
        if (o.save_state or o.load_state) and o.split != "train":
            raise ConfigError("--save-state / --load-state apply to the train split")
        state = load_state_file(o.load_state) if o.load_state else None
        loader, repeating = _train_loader(cfg, batches, o, state)
        if state is not None:
            loader.load_state_dict(state, origin=f"loader state {o.load_state}")
        source = cfg.data.train
    pad_id = loader.dataset.encoder.pad_id if isinstance(source, MegatronSource) else None
    tokenizer = None if as_json and not html else load_tokenizer(cfg.tokenizer)
    kept = []
    use_color = color == "always" or (color == "auto" and out.isatty())
    printed = padding_rows = packs = samples = 0    # of the batches shown
    stream = iter(loader)
    for i, batch in enumerate(stream if batches is None else itertools.islice(stream, batches)):
        batch.validate()
        printed += 1
        padding_rows += sum(batch.is_padding)
        packs += batch.batch_size - sum(batch.is_padding)
        samples += sum(len(k) for k, pad in zip(batch.sample_keys, batch.is_padding) if not pad)
        if html:
            kept.append(batch)
            continue
        if as_json:
            print(json.dumps(batch_json(i, batch)), file=out)
            continue
        print(f"=== batch {i}: {batch.batch_size} row(s), {batch.num_valid_tokens} trained labels", file=out)
        for r in range(batch.batch_size):
            print(row_text(r, batch.row(r), tokenizer, use_color, pad_id=pad_id), file=out)
    read = _extent(o.split, batches, printed, repeating, stream, o)
    if o.save_state:
        save_state_file(o.save_state, loader.state_dict())
    if html:
        Path(html).write_text(render_html(kept, tokenizer, title=f"{config_path} — {o.split}, DP rank {o.dp_rank}"),
                              encoding="utf-8")
        print(f"wrote {html} ({read})", file=sys.stderr)
    t = loader.telemetry()        # the real batches (validation padding batches are not in it)
    summary = {"batches": printed, "packs": packs, "samples": samples, "padding_rows": padding_rows,
               "dp_rank": o.dp_rank, "dp_size": o.dp_size, "split": o.split, "fill_ratio": round(t["fill_ratio"], 6),
               "tokens_per_s": round(t["tokens_per_s"]), "media_decoded": t["media_decoded"], "skipped": t["skipped"],
               "carried": t["carried"], "step_cost": t["step_cost"], "buffer_bytes": t["buffer_bytes"], "read": read}
    if as_json:
        print(json.dumps({"summary": summary}), file=out)
    else:
        print(f"summary: {summary}", file=out)
    return 0


def _train_loader(cfg, batches: Optional[int], o: PreviewOptions, state: Optional[dict]):
    """The train split's loader for one epoch, and None; with ``batches`` set, the repeating
    loader and why it repeats: for a weighted blend (no epoch), or for a ``state`` saved by a
    repeating loader (training's), which only a repeating loader restores."""
    kw = dict(dp_rank=o.dp_rank, dp_size=o.dp_size)
    saved = state.get("fingerprint") if isinstance(state, dict) else None
    if isinstance(saved, dict) and saved.get("repeat") is True:
        if batches is None:
            raise ConfigError(f"loader state {o.load_state} was saved by a repeating loader (training's): "
                              "give --batches N to show the next N batches of its stream")
        return build_train_loader(cfg, repeat=True, **kw), "the state was saved by a repeating loader"
    try:
        return build_train_loader(cfg, repeat=False, **kw), None
    except ConfigError as e:
        if batches is None or "weighted blend has no epoch" not in str(e):
            raise
    return build_train_loader(cfg, repeat=True, **kw), "a weighted blend has no epoch"


def _extent(split: str, batches: Optional[int], printed: int, repeating: Optional[str], stream,
            o: PreviewOptions) -> str:
    """What the preview read, in words: the whole epoch, or that it stopped early. Whether a stop
    after ``batches`` was early is known by reading one batch more from ``stream``, except when a
    state is saved (the state is the position after the last batch shown)."""
    what = "the validation split" if split == "validation" else "the epoch"
    if repeating:
        return f"{printed} batches of the repeating stream ({repeating})"
    if batches is None or printed < batches:
        return f"{what}, whole: {printed} batches"
    if o.save_state:
        return f"stopped after {printed} batches; {what} may hold more"
    if next(stream, None) is None:
        return f"{what}, whole: {printed} batches"
    return f"stopped early, after {printed} batches; {what} holds more (--batches N shows N)"
