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

import os
import weakref
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Union

import torch
from pydantic import ValidationError

from energon_nemotron._energon import is_no_cooker_error, is_weighted_blend_error, quiet_progress, shutdown_workers
from energon_nemotron.config import EnergonSource, LoaderConfig, MegatronSource, format_validation_error, load_config
from energon_nemotron.cookers.remote_entries import EntryCache
from energon_nemotron.encoders.outputs import PACKED_BATCH
from energon_nemotron.encoders.pre_pack import cost_model
from energon_nemotron.encoders.runtime import EncoderCounters, Runtime
from energon_nemotron.errors import ConfigError
from energon_nemotron.guards import av_fork, orphans, stalls
from energon_nemotron.guards.policy import ErrorPolicy, skip_counter
from energon_nemotron.guards.shards import guard_reads
from energon_nemotron.guards.skip_limits import apply_limits
from energon_nemotron.loading.preflight import check_media_roots, check_source, check_source_path
from energon_nemotron.loading.stats import LoaderStats
from energon_nemotron.megatron_packed import MegatronSFTPackedDataset, collate_rows, encoder_from
from energon_nemotron.registry import TASK_ENCODERS
from energon_nemotron.resume.checks import restore_energon, rows_position, state_parts
from energon_nemotron.resume.codec import encode_state
from energon_nemotron.resume.elastic import RecentBatches, install_filters, rank_record, rank_skipped, start_elastic
from energon_nemotron.resume.fingerprint import check_fingerprint, fingerprint
from energon_nemotron.resume.worker_checkpoints import settle, start_point

ConfigLike = Union[LoaderConfig, str, Path, dict[str, Any]]


#: set to 1 (the command line's --verbose) to keep Energon's per-worker shard lines and buffer bars
VERBOSE_ENV = "ENERGON_NEMOTRON_VERBOSE"
#: the entry cache's bound when ``loader.cache_pool.max_gbytes`` is not set
ENTRY_CACHE_GBYTES = 16.0


def as_config(config: ConfigLike) -> LoaderConfig:
    """A ``LoaderConfig`` from a config, a YAML path or a dict (``config.load_config``)."""
    return config if isinstance(config, LoaderConfig) else load_config(config)


def build_task_encoder(config: ConfigLike, subclass: Optional[Callable[[type], type]] = None,
                       runtime: Optional[Runtime] = None) -> Any:
    """The configured task encoder; its ``options`` are validated by the encoder's own model.
    ``subclass``: builds the class to instantiate from the registered one (e.g. the phase-1 reader
    of ``stats``), so it is constructed exactly as the loader constructs it; ``runtime``: how it is
    run (``encoders.runtime.Runtime``: counters, failure tolerance; the defaults: single-process
    counters, Energon's tolerance)."""
    cfg = as_config(config)
    try:
        cls = TASK_ENCODERS.get(cfg.task_encoder.name)
    except KeyError as e:
        raise ConfigError(f"task_encoder.name: {e.args[0]}") from None
    try:
        options = cls.Options(**cfg.task_encoder.options)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, "task_encoder.options")) from None
    check_media_roots(cfg.data)
    extra = {"media_roots": cfg.data.media_roots} if cfg.data.media_roots else {}
    if runtime is not None:
        extra["runtime"] = runtime
    if subclass is not None:
        cls = subclass(cls)
    if cfg.data.cookers is not None:
        extra["cookers"] = [c.model_dump() for c in cfg.data.cookers]
    return cls(cfg.tokenizer, options, packing=cfg.packing, default_cooker=cfg.data.default_cooker,
               seed=cfg.loader.seed, **extra)


def _worker_config(cfg: LoaderConfig, skips: Any):
    from megatron.energon import WorkerConfig

    apply_limits(skips, cfg.loader)
    policy = ErrorPolicy(cfg.loader.on_error, skips)
    return WorkerConfig(rank=cfg.loader.dp_rank, world_size=cfg.loader.dp_size, num_workers=cfg.loader.num_workers,
                        seed_offset=cfg.loader.seed, global_error_handler=policy)


def _megatron_loader(cfg: LoaderConfig, src: MegatronSource, validation: bool, skips: Any) -> Iterable:
    encoder = encoder_from(cfg.tokenizer, src)
    apply_limits(skips, cfg.loader)
    # training rows: a full per-epoch permutation whenever a shuffle buffer is set; validation: file order
    shuffle = None if validation or cfg.loader.shuffle_buffer_size is None else cfg.loader.seed
    dataset = MegatronSFTPackedDataset(src.path, encoder, dp_rank=cfg.loader.dp_rank, dp_size=cfg.loader.dp_size,
                                       validation=validation, on_error=cfg.loader.on_error, skips=skips,
                                       shuffle_seed=shuffle)
    if shuffle is not None:
        dataset.row_index()             # one pass over the file, here, so the workers inherit it
    workers = cfg.loader.num_workers
    return torch.utils.data.DataLoader(dataset, batch_size=cfg.loader.batch_size, collate_fn=collate_rows,
                                       num_workers=workers, prefetch_factor=cfg.loader.prefetch_factor if workers else None)


def _energon_loader(cfg: LoaderConfig, src: EnergonSource, validation: bool, repeat: bool,
                    counters: EncoderCounters) -> Iterable:
    from megatron.energon import get_savable_loader, get_train_dataset, get_val_dataset

    # Energon's per-worker shard lines and buffer bars only with ENERGON_NEMOTRON_VERBOSE=1 (--verbose)
    quiet_progress(os.environ.get(VERBOSE_ENV) != "1")
    check_source(src.path, src.split, cfg.data)   # tree, subflavors, shards against indexes
    # skipping never turns into a fatal error (the skip limits stop a run that only skips)
    runtime = Runtime(counters, failure_tolerance=0 if cfg.loader.on_error == "skip" else None,
                      entry_cache=_entry_cache(cfg.loader))
    encoder = build_task_encoder(cfg, runtime=runtime)
    if encoder.options.output != PACKED_BATCH:
        what = "NeMo-RL's packed batch dicts" if encoder.options.output == "nemo_rl_packed" else \
            "Megatron-Bridge step dicts"
        raise ConfigError(f"task_encoder.options.output {encoder.options.output!r} makes the encoder yield {what}, "
                          "for that consumer's own Energon data path; this loader yields "
                          "PackedBatch: leave output packed_batch and convert (Megatron-Bridge: "
                          "energon_nemotron.integrations.megatron_bridge; NeMo-RL: "
                          "energon_nemotron.integrations.nemo_rl.build_nemo_rl_loader, or its to_nemo_rl_packed)")
    common = dict(worker_config=_worker_config(cfg, counters.skipped), batch_size=cfg.loader.batch_size,
                  task_encoder=encoder, packing_buffer_size=cfg.packing.buffer_size if cfg.packing else None)
    try:
        if validation:
            dataset = get_val_dataset(str(src.path), split_part=src.split, limit=src.limit, **common)
        else:
            dataset = get_train_dataset(str(src.path), split_part=src.split, repeat=repeat,
                                        shuffle_buffer_size=cfg.loader.shuffle_buffer_size,
                                        max_samples_per_sequence=cfg.loader.max_samples_per_sequence,
                                        virtual_epoch_length=src.virtual_epoch_length, **common)
    except AssertionError as e:
        if is_weighted_blend_error(e):
            raise ConfigError(f"{src.path}: a weighted blend has no epoch, so it cannot be read once; use "
                              "blend_epochized in the metadataset, or read a number of batches") from None
        raise
    except ValueError as e:
        if is_no_cooker_error(e):
            raise ConfigError(f"{src.path}: the dataset's subflavors name no registered cooker ({e}); set "
                              "subflavors: {cooker: NAME} in its .nv-meta/dataset.yaml or metadataset, or "
                              "data.default_cooker in the loader config") from None
        raise
    guard_reads(dataset)                     # a shard damaged inside: a DatasetError naming it, not a traceback
    # a worker checkpoint every loader.checkpoint_every_sec (default 1 s; Energon's: every minute): a
    # restore replays at most that long of batches, and the loader keeps that many batches' keys for
    # the elastic merge (energon_nemotron.resume.elastic.RecentBatches); the stream is unchanged
    s = cfg.loader
    orphans.install()                        # forked workers die with this process (guards.orphans)
    stalls.install()                         # a watchdog timeout names the worker and its sample
    av_fork.install()                        # a worker builds its own video scaler (guards.av_fork)
    return get_savable_loader(dataset, gc_collect_every_n_steps=s.gc_collect_every_n_steps,
                              watchdog_timeout_seconds=s.watchdog_timeout_seconds, prefetch_factor=s.prefetch_factor,
                              checkpoint_every_sec=s.checkpoint_every_sec, checkpoint_every_min_n_samples=1,
                              cache_pool=_cache_pool(s.cache_pool), fail_on_timeout=s.watchdog_timeout_seconds is not None)


def _entry_cache(s: Any) -> Optional[EntryCache]:
    """Where this loader keeps the aux entries it fetches from object storage
    (``cookers.remote_entries``): a folder of its own under ``loader.cache_pool.directory``, bounded
    by ``max_gbytes`` over its worker processes (None: the cache pool is not set)."""
    if s.cache_pool is None:
        return None
    gbytes = ENTRY_CACHE_GBYTES if s.cache_pool.max_gbytes is None else s.cache_pool.max_gbytes
    return EntryCache(s.cache_pool.directory, int(gbytes * (1 << 30)), max(1, s.num_workers))


def _cache_pool(pool: Any) -> Any:
    """Energon's ``FileStoreCachePool`` for ``loader.cache_pool`` (None when unset)."""
    if pool is None:
        return None
    from megatron.energon import FileStoreCachePool

    extra = {} if pool.max_gbytes is None else {"max_cache_size_gbytes": pool.max_gbytes}
    return FileStoreCachePool(method="raw", num_workers=pool.num_workers, parent_cache_dir=pool.directory, **extra)


def with_dp(config: ConfigLike, dp_rank: Optional[int], dp_size: Optional[int]) -> LoaderConfig:
    """The config with ``loader.dp_rank`` / ``loader.dp_size`` replaced where given (checked)."""
    cfg = as_config(config)
    if dp_rank is None and dp_size is None:
        return cfg
    settings = cfg.loader.model_copy(update={"dp_rank": cfg.loader.dp_rank if dp_rank is None else dp_rank,
                                             "dp_size": cfg.loader.dp_size if dp_size is None else dp_size})
    if not 0 <= settings.dp_rank < settings.dp_size:
        raise ConfigError(f"invalid dp_rank={settings.dp_rank} / dp_size={settings.dp_size}")
    return cfg.model_copy(update={"loader": settings})


def build_loader(cfg: LoaderConfig, validation: bool, repeat: bool) -> "Loader":
    """The :class:`Loader` of one split of ``cfg`` for its rank (``validation``: one pass over the
    validation split, not evened out over ranks: see ``build_val_loader``)."""
    src = cfg.data.validation if validation else cfg.data.train
    if src is None:
        raise ConfigError("data.validation is not set")
    check_source_path(src, "data.validation" if validation else "data.train")
    fp = fingerprint(cfg, "validation" if validation else "train", repeat)
    if isinstance(src, MegatronSource):
        skips = skip_counter(cfg.loader.num_workers)
        inner = _megatron_loader(cfg, src, validation, skips)
        stats = LoaderStats(skips, None, pad_id=inner.dataset.encoder.pad_id, log_every=cfg.loader.log_every)
        return Loader(inner, fp, stats, rows=True)
    counters = EncoderCounters.for_workers(cfg.loader.num_workers)
    inner = _energon_loader(cfg, src, validation, repeat, counters)
    loader = Loader(inner, fp, LoaderStats(counters.skipped, counters.decodes, log_every=cfg.loader.log_every,
                                           lookups=counters.lookups, packing=counters.packing,
                                           cost=cost_model(cfg.packing) if cfg.packing else None,
                                           buffer_bytes=_buffer_bytes(cfg, counters)))
    loader.layout, loader.recent = (cfg, repeat), RecentBatches(cfg.loader.num_workers)
    return loader


def _buffer_bytes(cfg: LoaderConfig, counters: EncoderCounters) -> Optional[tuple]:
    """What the loader's telemetry reports of ``packing.max_buffer_bytes``: (gauge, budget), or None."""
    budget = cfg.packing.max_buffer_bytes if cfg.packing else None
    return None if budget is None else (counters.held, int(budget))


class Loader:
    """Batches (``PackedBatch``) of one split for one rank, with exact save and restore.

    ``state_dict()`` after any number of batches, ``load_state_dict(state)`` on a freshly built
    loader with the same configuration, before iterating: the restored loader yields the very
    batches the original would have yielded next. The state carries :func:`fingerprint`.

    ``close()`` stops the worker processes; a loader that is dropped (its last reference gone)
    stops them as well, at once, however far its workers had read ahead (when it is collected:
    Energon leaves a reference cycle that holds the frames that built it).
    """

    def __init__(self, inner: Any, fingerprint: dict, stats: LoaderStats, rows: bool = False) -> None:
        self.inner = inner
        self.fingerprint = fingerprint
        self.stats = stats          # running telemetry (skips and media decodes summed over workers)
        self.rows = rows            # Megatron-LM rows (a DataLoader over MegatronSFTPackedDataset)
        self.positions: dict[int, int] = {}
        self.next_worker = 0
        self.layout: Optional[tuple] = None        # (config, repeat) of an Energon loader: its elastic record
        self._consumed: Optional[list] = None      # per leaf, what an elastic start skips (counts)
        self.recent: Any = None                    # elastic.RecentBatches of an Energon loader
        if not rows:
            self._start = start_point(inner)     # what a worker that has delivered nothing resumes from
        # the inner loader is freed by the cyclic collector, too late to reach its workers quickly
        # (_energon.shutdown_workers); this finalizer stops them when the Loader goes
        self._close = weakref.finalize(self, shutdown_workers, inner)
        self._close.atexit = False               # at exit PyTorch's own hooks end the workers

    def close(self) -> None:
        """Stop the worker processes (none to stop with ``num_workers`` 0); the loader cannot be
        iterated afterwards. Idempotent."""
        self._close()

    @property
    def dataset(self) -> Any:
        return self.inner.dataset

    def skipped(self) -> dict[str, int]:
        """Samples skipped so far, by reason: what the batches taken so far carry
        (``PackedBatch.skipped``), and once the iteration has ended (its end, or an error) also
        what the workers skipped after their last batch. Each bad sample counts once, also across
        a resume, however far the workers had read ahead."""
        return self.stats.skipped()

    def telemetry(self) -> dict:
        """Batches, packs, samples, tokens, fill ratio, tokens/s, media decoded and skips so far."""
        return self.stats.as_dict()

    def __iter__(self):
        if self.rows:
            self.positions = dict(self.inner.dataset.resume_positions)
            self.next_worker = self.inner.dataset.worker_offset
        self.stats.ended = False
        for batch in self._batches():
            if self.rows and batch.__restore_key__:
                _, worker, position = batch.__restore_key__
                self.positions[int(worker)] = int(position)
                self.next_worker = (int(worker) + 1) % max(self.inner.num_workers, 1)
            if self.recent is not None:
                self.recent.add(batch.__restore_key__)
            self.stats.update(batch)
            yield batch

    def _batches(self):
        """The inner loader's batches; a worker that ended (a watchdog timeout, a crash) is a
        ``LoaderError`` (``guards.stalls``), not PyTorch's bare RuntimeError. Not ``yield from``:
        closing this generator (a caller that stops early) must not close the inner iterator, whose
        close ends Energon's epoch for the next ``iter``."""
        inner = iter(self.inner)
        while True:
            try:
                batch = next(inner)
            except StopIteration:
                self.stats.ended = True
                return
            except Exception as e:
                self.stats.ended = True
                error = stalls.worker_exit_error(e)
                if error is None:
                    raise
                raise error from e
            yield batch

    def state_dict(self) -> dict:
        """The position after the batches yielded so far, and the configuration's fingerprint."""
        if self.rows:
            position = {"workers": {str(k): v for k, v in self.positions.items()},
                        "next_worker": self.next_worker}
        else:
            energon = settle(self.inner.save_state_rank(), self.inner, self._start)
            position = {"energon": encode_state(energon)}
        out = {"fingerprint": self.fingerprint, "position": position}
        if self.layout is not None:
            out["elastic"] = rank_record(self.inner.dataset, *self.layout, skipped=self._consumed,
                                         recent=self.recent.since(energon))
        return out

    def load_state_dict(self, state: dict, origin: str = "the loader state", elastic: bool = False) -> None:
        """Resume from ``state`` (before iterating); a different configuration is a ``ConfigError``
        listing what changed, a damaged state (or another loader's) one naming the key (``origin``:
        how messages name the state, e.g. its file). ``elastic``: ``state`` is
        ``energon_nemotron.resume.merge_rank_states`` of every rank's state, saved on any number of
        ranks and workers; this loader yields, with the others of its shape, exactly the samples of
        the epoch in progress that none had yielded (see :mod:`energon_nemotron.resume.elastic`)."""
        if elastic:
            if self.rows or self.layout is None:
                raise ConfigError(f"{origin}: elastic resume applies to Energon sources; a Megatron-LM rows "
                                  "loader resumes on the shape that saved it")
            self._consumed = start_elastic(self.inner.dataset, state, self.fingerprint, origin)
            return
        saved, position = state_parts(state, origin)
        check_fingerprint(saved, self.fingerprint, origin)
        if self.rows:
            ds = self.inner.dataset
            ds.resume_positions, ds.worker_offset = rows_position(position, self.inner.num_workers, origin)
        else:
            restore_energon(self.inner, position, origin)
            self._start = start_point(self.inner)
            self._restore_consumed(state.get("elastic"), origin)
            if self.recent is not None:
                self.recent.seed(state.get("elastic"))

    def _restore_consumed(self, record: Any, origin: str) -> None:
        """A state saved after an elastic start keeps skipping what that start skipped."""
        leaves = record.get("leaves") if isinstance(record, dict) else None
        if not isinstance(leaves, list) or not leaves:
            return
        try:
            self._consumed = rank_skipped(leaves, f"{origin}: elastic")
        except (KeyError, TypeError, AttributeError) as e:
            raise ConfigError(f"{origin}: elastic: damaged record ({type(e).__name__}: {e})") from None
        if self._consumed is not None:
            install_filters(self.inner.dataset, self._consumed)


def build_train_loader(config: ConfigLike, repeat: bool = True, dp_rank: Optional[int] = None,
                       dp_size: Optional[int] = None) -> Loader:
    """Batches of the training split for one data-parallel rank (``repeat=False``: one epoch,
    each of the rank's samples once)."""
    return build_loader(with_dp(config, dp_rank, dp_size), validation=False, repeat=repeat)
