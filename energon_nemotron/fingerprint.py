"""The configuration fingerprint a loader state carries: everything that changes the stream of
batches. Restoring a state under another fingerprint fails with a per-key diff (``state``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from energon_nemotron.config import EnergonSource, LoaderConfig, MegatronSource


def fingerprint(cfg: LoaderConfig, split: str, repeat: bool) -> dict:
    """Everything that changes the stream of batches: data (paths, split, and per file that shapes an
    Energon source a ``"{split} file {path}"`` sha256: metadataset YAMLs, each dataset's dataset.yaml,
    split.yaml, .info, index.uuid or .jsonl.idx), the media roots (when set: they change which files
    are read), cookers, task encoder and options, packing, tokenizer files, loader settings, rank
    layout, seed, library version."""
    from energon_nemotron import __version__
    from energon_nemotron.guards.source_tree import stream_digests
    from energon_nemotron.registry import COOKERS
    from energon_nemotron.state import file_digest

    def source(src) -> Any:
        if src is None:
            return None
        out = src.model_dump(mode="json")
        if isinstance(src, MegatronSource):      # an Energon source's files: stream_digests below
            index = Path(src.path).with_name(Path(src.path).name + ".idx")
            out["index"] = file_digest(index) if index.is_file() else None
            manifest = Path(src.path) if src.path.name.endswith(".manifest.json") else \
                Path(src.path).with_name(Path(src.path).name + ".manifest.json")
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
        # only when set, so that states saved without roots keep their fingerprint
        **({"media_roots": [str(Path(p).resolve()) for p in cfg.data.media_roots]} if cfg.data.media_roots else {}),
        "task_encoder": cfg.task_encoder.model_dump(mode="json"),
        "packing": cfg.packing.model_dump(mode="json") if cfg.packing else None,
        "tokenizer": file_digest(*tok.glob("*")) if tok.is_dir() else str(tok),
        # logging and the skip limits (which only stop a broken run) never change the stream
        "loader": cfg.loader.model_dump(mode="json", exclude={"log_every", "max_skip_fraction",
                                                              "max_consecutive_skips"}),
        **files("train", cfg.data.train), **files("validation", cfg.data.validation),
    }
