"""The configuration fingerprint a loader state carries: everything that changes the stream of
batches. Restoring a state under another fingerprint fails with a per-key diff
(:func:`check_fingerprint`)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from energon_nemotron._energon.storage import as_data_path
from energon_nemotron.config import EnergonSource, LoaderConfig, MegatronSource, describe_value
from energon_nemotron.errors import ConfigError
from energon_nemotron.guards.source_tree import stream_digests
from energon_nemotron.registry import COOKERS
from energon_nemotron.version import __version__

__all__ = ["fingerprint", "fingerprint_diff", "check_fingerprint", "file_digest", "DAMAGED"]



#: loader settings that never change the stream of batches
NOT_STREAM = {"log_every", "max_skip_fraction", "max_consecutive_skips", "prefetch_factor", "checkpoint_every_sec",
              "watchdog_timeout_seconds", "gc_collect_every_n_steps", "cache_pool"}


def fingerprint(cfg: LoaderConfig, split: str, repeat: bool) -> dict:
    """Everything that changes the stream of batches: data (paths, split, and per file that shapes an
    Energon source a ``"{split} file {path}"`` sha256: metadataset YAMLs, each dataset's dataset.yaml,
    split.yaml, .info, index.uuid or .jsonl.idx), the media roots (when set: they change which files
    are read), cookers, task encoder and options, packing (but ``max_buffer_bytes``), tokenizer
    files, loader settings, rank layout, seed, library version."""
    def source(src) -> Any:
        if src is None:
            return None
        # the epoch length and the validation limit only when set: states saved before they existed
        out = src.model_dump(mode="json", exclude={k for k in ("virtual_epoch_length", "limit")
                                                   if not getattr(src, k, None)})
        if isinstance(src, MegatronSource):      # an Energon source's files: stream_digests below
            path = as_data_path(src.path)
            index = path.with_name(path.name + ".idx")
            out["index"] = file_digest(index) if index.is_file() else None
            manifest = path if path.name.endswith(".manifest.json") else path.with_name(path.name + ".manifest.json")
            if manifest.is_file():               # pack-megatron's record of the shards (sha256 each)
                out["manifest"] = file_digest(manifest)
        return out

    def files(name: str, src) -> dict:
        return stream_digests(name, src.path, src.split) if isinstance(src, EnergonSource) else {}

    tok = Path(cfg.tokenizer)
    return {
        "library_version": __version__,
        "split": split, "repeat": repeat,
        "train": source(cfg.data.train), "validation": source(cfg.data.validation),
        "default_cooker": cfg.data.default_cooker, "cookers": COOKERS.names(),
        **({"cooker_rules": [c.model_dump(mode="json") for c in cfg.data.cookers]} if cfg.data.cookers else {}),
        # only when set, so that states saved without roots keep their fingerprint
        **({"media_roots": [str(Path(p).resolve()) for p in cfg.data.media_roots]} if cfg.data.media_roots else {}),
        "task_encoder": cfg.task_encoder.model_dump(mode="json"),
        # the media bytes bound never changes the stream: a run may resume under another one
        "packing": cfg.packing.model_dump(mode="json", exclude={"max_buffer_bytes"}) if cfg.packing else None,
        "tokenizer": file_digest(*tok.glob("*")) if tok.is_dir() else str(tok),
        # logging, the skip limits (which only stop a broken run) and how workers run (prefetch,
        # checkpoint period, watchdog, garbage collection, cache pool) never change the stream
        "loader": cfg.loader.model_dump(mode="json", exclude=NOT_STREAM | ({"max_samples_per_sequence"} if
                                        cfg.loader.max_samples_per_sequence is None else set())),
        **files("train", cfg.data.train), **files("validation", cfg.data.validation),
    }


#: the end of every message about a state that cannot be restored
DAMAGED = ("the state is damaged or belongs to another configuration: resume from a state this configuration "
           "saved, or start without one")


def file_digest(*paths: Path) -> str:
    """sha256 over the given files (missing ones skipped), e.g. a tokenizer's files."""
    h = hashlib.sha256()
    for p in sorted(paths):
        if p.is_file():
            h.update(p.name.encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def fingerprint_diff(saved: dict, current: dict) -> list[str]:
    """Human-readable lines for every key whose value differs."""
    lines = []
    for key in sorted(set(saved) | set(current), key=str):
        a, b = saved.get(key, "<missing>"), current.get(key, "<missing>")
        if a != b:
            lines.append(f"  {key}: saved {json.dumps(a, sort_keys=True, default=str)} "
                         f"!= now {json.dumps(b, sort_keys=True, default=str)}")
    return lines


def check_fingerprint(saved: dict, current: dict, origin: str = "the loader state") -> None:
    """``ConfigError`` listing every key of ``saved`` that differs from ``current`` (``origin``:
    how the message names the state)."""
    if not isinstance(saved, dict):
        raise ConfigError(f"{origin}: fingerprint is {describe_value(saved)}, not a mapping; {DAMAGED}")
    diff = fingerprint_diff(saved, current)
    if diff:
        raise ConfigError(f"{origin} was saved under a different configuration; restoring it would "
                          "change the data stream:\n" + "\n".join(diff))
