"""Loader config → iterables of ``PackedBatch``: Energon loaders or Megatron-LM prepacked rows.

``build_train_loader(config)`` / ``build_val_loader(config)`` accept a ``LoaderConfig``, a YAML path
or a dict. Energon sources go through ``get_train_dataset``/``get_val_dataset`` with the named task
encoder and ``get_savable_loader``; ``megatron_sft_packed`` sources bypass online packing and go
through a PyTorch ``DataLoader`` over ``MegatronSFTPackedDataset`` with ``collate_rows``.

Data parallelism: ``dp_rank``/``dp_size`` (arguments, else ``loader.dp_rank``/``loader.dp_size``)
become Energon's ``WorkerConfig(rank, world_size)``; each rank reads its own part. The validation
loader evens the ranks out: a rank that runs out of batches before the others yields padding
batches (``is_padding`` True, ``loss_mask`` all zero) so every rank runs the same number of steps.

Bad samples follow ``loader.on_error`` (``raise``: a ``DataError`` naming the sample; ``skip``:
dropped and counted by reason in ``PackedBatch.skipped``). ``Loader.state_dict()`` /
``load_state_dict()`` save and restore the exact position, with a fingerprint of the configuration.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Union

import torch

from energon_nemotron.config import (
    EnergonSource,
    LoaderConfig,
    MegatronSource,
    check_media_roots,
    check_source_path,
    load_config,
)
from energon_nemotron.cookers.media_sources import LOOKUP_COUNTERS
from energon_nemotron.errors import ConfigError, ErrorPolicy, SkipCounter
from energon_nemotron.media.handlers import MEDIA_COUNTERS
from energon_nemotron.skip_limits import apply_limits
from energon_nemotron.telemetry import LoaderStats, SharedCounter
from energon_nemotron.registry import TASK_ENCODERS

ConfigLike = Union[LoaderConfig, str, Path, dict]


def _config(config: ConfigLike) -> LoaderConfig:
    return config if isinstance(config, LoaderConfig) else load_config(config)


def build_task_encoder(config: ConfigLike, subclass: Optional[Callable[[type], type]] = None):
    """The configured task encoder; its ``options`` are validated by the encoder's own model.
    ``subclass``: builds the class to instantiate from the registered one (e.g. the phase-1 reader
    of ``stats``), so it is constructed exactly as the loader constructs it."""
    cfg = _config(config)
    try:
        cls = TASK_ENCODERS.get(cfg.task_encoder.name)
    except KeyError as e:
        raise ConfigError(f"task_encoder.name: {e.args[0]}") from None
    from pydantic import ValidationError

    from energon_nemotron.config import format_validation_error

    try:
        options = cls.Options(**cfg.task_encoder.options)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, "task_encoder.options")) from None
    check_media_roots(cfg.data)
    roots = {"media_roots": cfg.data.media_roots} if cfg.data.media_roots else {}
    if subclass is not None:
        cls = subclass(cls)
    return cls(cfg.tokenizer, options, packing=cfg.packing, default_cooker=cfg.data.default_cooker,
               seed=cfg.loader.seed, **roots)


def _worker_config(cfg: LoaderConfig, encoder: Any):
    from megatron.energon import WorkerConfig

    apply_limits(encoder.skipped_counts, cfg.loader)
    policy = ErrorPolicy(cfg.loader.on_error, encoder.skipped_counts)
    return WorkerConfig(rank=cfg.loader.dp_rank, world_size=cfg.loader.dp_size, num_workers=cfg.loader.num_workers,
                        seed_offset=cfg.loader.seed, global_error_handler=policy)


def _megatron_loader(cfg: LoaderConfig, src: MegatronSource, validation: bool, skips: SharedCounter) -> Iterable:
    from energon_nemotron.megatron_packed import MegatronSFTPackedDataset, MegatronSFTPackedEncoder, collate_rows

    encoder = MegatronSFTPackedEncoder(cfg.tokenizer, src.seq_length, prompt_format=src.prompt_format,
                                       context_parallel_size=src.context_parallel_size, pad_token=src.pad_token,
                                       chat_key=src.chat_key, identity_masks_prompt=src.identity_masks_prompt,
                                       allow_eos_pad=src.allow_eos_pad)
    apply_limits(skips, cfg.loader)
    # training rows: a full per-epoch permutation whenever a shuffle buffer is set; validation: file order
    shuffle = None if validation or cfg.loader.shuffle_buffer_size is None else cfg.loader.seed
    dataset = MegatronSFTPackedDataset(src.path, encoder, dp_rank=cfg.loader.dp_rank, dp_size=cfg.loader.dp_size,
                                       validation=validation, on_error=cfg.loader.on_error, skips=skips,
                                       shuffle_seed=shuffle)
    if shuffle is not None:
        dataset.row_index()             # one pass over the file, here, so the workers inherit it
    return torch.utils.data.DataLoader(dataset, batch_size=cfg.loader.batch_size, collate_fn=collate_rows,
                                       num_workers=cfg.loader.num_workers)


def _energon_loader(cfg: LoaderConfig, src: EnergonSource, validation: bool, repeat: bool,
                    skips: SharedCounter, decodes: SharedCounter, lookups: SharedCounter) -> Iterable:
    from megatron.energon import get_savable_loader, get_train_dataset, get_val_dataset

    from energon_nemotron.dataset_check import check_source
    from energon_nemotron.shard_check import guard_reads

    check_source(src.path, src.split, cfg.data.default_cooker)   # tree, subflavors, shards against indexes
    encoder = build_task_encoder(cfg)
    if encoder.options.output != "packed_batch":
        raise ConfigError(f"task_encoder.options.output {encoder.options.output!r} makes the encoder yield "
                          "Megatron-Bridge step dicts, for Bridge's own Energon data module; this loader yields "
                          "PackedBatch (convert with energon_nemotron.integrations.megatron_bridge)")
    encoder.skipped_counts = skips
    encoder.media.decodes = decodes
    encoder.media_lookups = lookups
    if cfg.loader.on_error == "skip":
        encoder.__default_failure_tolerance__ = 0      # skipping never turns into a fatal error
    common = dict(worker_config=_worker_config(cfg, encoder), batch_size=cfg.loader.batch_size,
                  task_encoder=encoder, packing_buffer_size=cfg.packing.buffer_size if cfg.packing else None)
    try:
        if validation:
            dataset = get_val_dataset(str(src.path), split_part=src.split, **common)
        else:
            dataset = get_train_dataset(str(src.path), split_part=src.split, repeat=repeat,
                                        shuffle_buffer_size=cfg.loader.shuffle_buffer_size,
                                        max_samples_per_sequence=None, **common)
    except AssertionError as e:
        if "Cannot blend with dataset weights" in str(e):
            raise ConfigError(f"{src.path}: a weighted blend has no epoch, so it cannot be read once; use "
                              "blend_epochized in the metadataset, or read a number of batches") from None
        raise
    except ValueError as e:
        if "No cooker found" in str(e):
            raise ConfigError(f"{src.path}: the dataset's subflavors name no registered cooker ({e}); set "
                              "subflavors: {cooker: NAME} in its .nv-meta/dataset.yaml or metadataset, or "
                              "data.default_cooker in the loader config") from None
        raise
    guard_reads(dataset)                     # a shard damaged inside: a DatasetError naming it, not a traceback
    return get_savable_loader(dataset, gc_collect_every_n_steps=0, watchdog_timeout_seconds=None)


def _with_dp(config: ConfigLike, dp_rank: Optional[int], dp_size: Optional[int]) -> LoaderConfig:
    cfg = _config(config)
    if dp_rank is None and dp_size is None:
        return cfg
    settings = cfg.loader.model_copy(update={"dp_rank": cfg.loader.dp_rank if dp_rank is None else dp_rank,
                                             "dp_size": cfg.loader.dp_size if dp_size is None else dp_size})
    if not 0 <= settings.dp_rank < settings.dp_size:
        raise ConfigError(f"invalid dp_rank={settings.dp_rank} / dp_size={settings.dp_size}")
    return cfg.model_copy(update={"loader": settings})


def _build(cfg: LoaderConfig, validation: bool, repeat: bool) -> "Loader":
    src = cfg.data.validation if validation else cfg.data.train
    if src is None:
        raise ConfigError("data.validation is not set")
    check_source_path(src, "data.validation" if validation else "data.train")
    fp = fingerprint(cfg, "validation" if validation else "train", repeat)
    skips = SkipCounter(cfg.loader.num_workers)
    if isinstance(src, MegatronSource):
        inner = _megatron_loader(cfg, src, validation, skips)
        stats = LoaderStats(skips, None, pad_id=inner.dataset.encoder.pad_id, log_every=cfg.loader.log_every)
        return Loader(inner, fp, stats, rows=True)
    decodes = SharedCounter(MEDIA_COUNTERS, cfg.loader.num_workers)
    lookups = SharedCounter(LOOKUP_COUNTERS, cfg.loader.num_workers)
    inner = _energon_loader(cfg, src, validation, repeat, skips, decodes, lookups)
    return Loader(inner, fp, LoaderStats(skips, decodes, log_every=cfg.loader.log_every, lookups=lookups))


class Loader:
    """Batches (``PackedBatch``) of one split for one rank, with exact save and restore.

    ``state_dict()`` after any number of batches, ``load_state_dict(state)`` on a freshly built
    loader with the same configuration, before iterating: the restored loader yields the very
    batches the original would have yielded next. The state carries :func:`fingerprint`.
    """

    def __init__(self, inner: Any, fingerprint: dict, stats: LoaderStats, rows: bool = False) -> None:
        self.inner = inner
        self.fingerprint = fingerprint
        self.stats = stats          # running telemetry (skips and media decodes summed over workers)
        self.rows = rows            # Megatron-LM rows (a DataLoader over MegatronSFTPackedDataset)
        self.positions: dict[int, int] = {}
        self.next_worker = 0
        if not rows:
            from energon_nemotron.worker_checkpoints import start_point

            self._start = start_point(inner)     # what a worker that has delivered nothing resumes from

    @property
    def dataset(self) -> Any:
        return self.inner.dataset

    def skipped(self) -> dict[str, int]:
        """Samples skipped so far, by reason (all workers)."""
        return self.stats.skips.totals()

    def telemetry(self) -> dict:
        """Batches, packs, samples, tokens, fill ratio, tokens/s, media decoded and skips so far."""
        return self.stats.as_dict()

    def __iter__(self):
        if self.rows:
            self.positions = dict(self.inner.dataset.resume_positions)
            self.next_worker = self.inner.dataset.worker_offset
        seen: dict[str, int] = self.skipped()
        for batch in self.inner:
            if self.rows and batch.__restore_key__:
                _, worker, position = batch.__restore_key__
                self.positions[int(worker)] = int(position)
                self.next_worker = (int(worker) + 1) % max(self.inner.num_workers, 1)
            now = self.skipped()
            batch.skipped = {k: n - seen.get(k, 0) for k, n in now.items() if n != seen.get(k, 0)}
            seen = now
            self.stats.update(batch)
            yield batch

    def state_dict(self) -> dict:
        """The position after the batches yielded so far, and the configuration's fingerprint."""
        from energon_nemotron.state import encode_state

        if self.rows:
            position = {"workers": {str(k): v for k, v in self.positions.items()},
                        "next_worker": self.next_worker}
        else:
            from energon_nemotron.worker_checkpoints import settle

            position = {"energon": encode_state(settle(self.inner.save_state_rank(), self.inner, self._start))}
        return {"fingerprint": self.fingerprint, "position": position}

    def load_state_dict(self, state: dict, origin: str = "the loader state") -> None:
        """Resume from ``state`` (before iterating); a different configuration is a ``ConfigError``
        listing what changed, a damaged state (or another loader's) one naming the key (``origin``:
        how messages name the state, e.g. its file)."""
        from energon_nemotron.state import check_fingerprint, restore_energon, rows_position, state_parts

        saved, position = state_parts(state, origin)
        check_fingerprint(saved, self.fingerprint, origin)
        if self.rows:
            ds = self.inner.dataset
            ds.resume_positions, ds.worker_offset = rows_position(position, self.inner.num_workers, origin)
        else:
            from energon_nemotron.worker_checkpoints import start_point

            restore_energon(self.inner, position, origin)
            self._start = start_point(self.inner)


def fingerprint(cfg: LoaderConfig, split: str, repeat: bool) -> dict:
    """Everything that changes the stream of batches: data (paths, split, and per file that shapes an
    Energon source a ``"{split} file {path}"`` sha256: metadataset YAMLs, each dataset's dataset.yaml,
    split.yaml, .info, index.uuid or .jsonl.idx), the media roots (when set: they change which files
    are read), cookers, task encoder and options, packing, tokenizer files, loader settings, rank
    layout, seed, library version."""
    from energon_nemotron import __version__
    from energon_nemotron.dataset_check import stream_digests
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


def build_train_loader(config: ConfigLike, repeat: bool = True, dp_rank: Optional[int] = None,
                       dp_size: Optional[int] = None) -> Loader:
    """Batches of the training split for one data-parallel rank (``repeat=False``: one epoch,
    each of the rank's samples once)."""
    return _build(_with_dp(config, dp_rank, dp_size), validation=False, repeat=repeat)


def build_val_loader(config: ConfigLike, dp_rank: Optional[int] = None, dp_size: Optional[int] = None,
                     group: Any = None) -> Iterable:
    """Batches of the validation split for one data-parallel rank (one pass), padded so that every
    rank yields the same number of batches. ``group``: the data-parallel ``torch.distributed``
    group, used to agree on that number; without it (single process) the other ranks' batch
    counts are computed by reading their parts."""
    cfg = _with_dp(config, dp_rank, dp_size)
    if isinstance(cfg.data.validation, MegatronSource):
        return _build(cfg, validation=True, repeat=False)          # pads by rows itself
    return EvenedValidation(cfg, group)


class EvenedValidation:
    """A rank's validation batches, then padding batches up to the largest rank's count."""

    def __init__(self, cfg: LoaderConfig, group: Any = None) -> None:
        self.cfg = cfg
        self.group = group
        self._loader: Optional[Loader] = None

    def _count(self, rank: int) -> int:
        other = _with_dp(self.cfg, rank, self.cfg.loader.dp_size)
        return sum(1 for _ in _build(other, validation=True, repeat=False))

    def _max_count(self, mine: int) -> int:
        if self.cfg.loader.dp_size == 1:
            return mine
        if self.group is not None:
            import torch.distributed as dist

            t = torch.tensor([mine], dtype=torch.int64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
            return int(t.item())
        me = self.cfg.loader.dp_rank
        return max([mine] + [self._count(r) for r in range(self.cfg.loader.dp_size) if r != me])

    def skipped(self) -> dict[str, int]:
        """Samples skipped by this rank's pass, by reason."""
        return self._loader.skipped() if self._loader is not None else {}

    def telemetry(self) -> dict:
        """The telemetry of this rank's real batches (padding batches excluded)."""
        if self._loader is None:
            return LoaderStats(SkipCounter(), None).as_dict()
        return self._loader.telemetry()

    def __iter__(self):
        last, n = None, 0
        self._loader = _build(self.cfg, validation=True, repeat=False)
        for batch in self._loader:
            last, n = batch, n + 1
            yield batch
        for _ in range(self._max_count(n) - n):
            yield padding_batch(last, self.cfg)


def padding_batch(template, cfg: LoaderConfig):
    """A batch that trains nothing: ``template`` with its loss mask zeroed, or (a rank that got no
    data at all) one row of pad ids."""
    from energon_nemotron.types import IGNORE_INDEX, PackedBatch

    if template is not None:
        return template._replace(loss_mask=torch.zeros_like(template.loss_mask),
                                 is_padding=[True] * template.batch_size, skipped={})
    s = int(cfg.task_encoder.options.get("seq_length", 1))
    bounds = torch.tensor([0, s], dtype=torch.int32)
    return PackedBatch(tokens=torch.zeros(1, s, dtype=torch.int64),
                       labels=torch.full((1, s), IGNORE_INDEX, dtype=torch.int64),
                       loss_mask=torch.zeros(1, s), position_ids=torch.arange(s).unsqueeze(0),
                       cu_seqlens=[torch.tensor([0, 0], dtype=torch.int32)], cu_seqlens_padded=[bounds],
                       max_seqlen=[s], sample_keys=[[]], is_padding=[True])


