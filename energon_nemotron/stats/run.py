"""``energon-nemotron stats LOADER.yaml``: the shape of a loader config's data before training.

Reads every dataset of the split once (phase 1 only: headers and tokenization, nothing decoded),
counts every bad sample by reason instead of stopping, and prints per dataset and in total the
samples read and skipped, the length distribution, media, and the packing fill the configured
packer reaches (``aggregate``), then what one epoch of the split yields (``epoch``). ``engine``:
``single`` (this process) or ``ray`` (N actors, ``ray_engine``); both give the same numbers.
"""

from __future__ import annotations

import contextlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from energon_nemotron.config import MegatronSource, load_config
from energon_nemotron.errors import ConfigError
from energon_nemotron.stats.aggregate import summarize
from energon_nemotron.stats.collect import collect_part, seq_length_of, source_of
from energon_nemotron.stats.epoch import epoch_summary
from energon_nemotron.stats.records import merge_parts

ENGINES = ("single", "ray")


def collect_stats(config: Any, split: str = "train", engine: str = "single", limit: Optional[int] = None,
                  address: Optional[str] = None, num_cpus: Optional[int] = None, progress: bool = False) -> dict:
    """The statistics of ``config`` (a loader YAML path, dict or ``LoaderConfig``) as one JSON-able dict."""
    if engine not in ENGINES:
        raise ConfigError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit must be >= 1, got {limit}")
    if engine == "single" and (address or num_cpus):
        raise ConfigError("--address and --num-cpus apply to --engine ray")
    cfg = config if not isinstance(config, (str, Path, dict)) else load_config(config)
    src = source_of(cfg, split)
    seq_length = seq_length_of(cfg, src)
    if engine == "ray":
        from energon_nemotron.stats.ray_engine import collect_with_ray

        parts, readers = collect_with_ray(cfg, split, limit, address, num_cpus, progress)
    else:
        parts, readers = [collect_part(cfg, split, 0, 1, limit, progress)], 1
    megatron = isinstance(src, MegatronSource)
    summary = summarize(merge_parts(parts, limit), seq_length=seq_length, seed=cfg.loader.seed,
                        packing=None if megatron else cfg.packing, megatron=megatron)
    epoch = epoch_summary(summary, split=split, batch_size=cfg.loader.batch_size, dp_size=cfg.loader.dp_size,
                          validation_limit=getattr(src, "limit", None),
                          virtual_epoch_length=getattr(src, "virtual_epoch_length", 0))
    head = {"config": str(config) if isinstance(config, (str, Path)) else None, "split": split,
            "source": str(src.path), "format": src.format, "engine": engine, "readers": readers, "limit": limit}
    return {**head, **summary, "epoch": epoch}


@dataclass
class StatsOptions:
    """What ``run_stats`` reads and how: the ``split``, the ``engine`` (``single`` | ``ray``; for
    ``ray``, the cluster's ``address`` and ``num_cpus``, see ``ray_engine``) and at most ``limit``
    samples (rows) per dataset."""

    split: str = "train"
    engine: str = "single"
    limit: Optional[int] = None
    address: Optional[str] = None
    num_cpus: Optional[int] = None


def run_stats(config: str, options: Optional[StatsOptions] = None, as_json: bool = False,
              html: Optional[str] = None, progress: bool = True, out: Any = None) -> int:
    """The command: text (default) or one JSON object on ``out``; ``html``: also write the page
    with the histograms. Returns the exit status; whatever the libraries print goes to stderr."""
    o = options or StatsOptions()
    out = out or sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        result = collect_stats(config, o.split, o.engine, o.limit, o.address, o.num_cpus, progress)
    if html:
        from energon_nemotron.stats.html import render_html

        Path(html).write_text(render_html(result), encoding="utf-8")
        print(f"wrote {html}", file=sys.stderr)
    if as_json:
        print(json.dumps(result), file=out)
    else:
        from energon_nemotron.stats.report import render_text

        print(render_text(result), file=out)
    return 0
