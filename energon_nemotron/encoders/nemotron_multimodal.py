"""The ``nemotron_multimodal`` task encoder: an Energon ``DefaultTaskEncoder`` that wires the stages.

cookers (by name) → ``preencode_sample`` (plan media from headers, tokenize with placeholders,
packing cost; nothing decoded) → ``select_samples_to_pack`` (a registered packer over the buffer;
every sample placed exactly once) → ``postencode_sample`` (decode only the media of samples
selected into a pack) → ``pack_selected_samples`` (one ``PackedRow``) → ``batch`` (``PackedBatch``,
or a consumer's batch: ``encoders.outputs``). Without packing, each batch row holds one sample.
Everything up to the packing buffer is ``@stateless``.

The parts it wires have their own modules: the over-length policy (``over_length``), tokenization
once per packing buffer (``buffered``: with packing, samples are mapped by ``prepare_sample`` and
the pre-packer tokenizes the buffer), what its host gives it (``runtime``: counters, failure tolerance), the batch outputs (``outputs``),
the media-kind checks (``modalities``) and the one-pass guard (``one_pass``).
"""

from __future__ import annotations

import math
import warnings
import zlib
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from megatron.energon import DefaultTaskEncoder, MapDataset, SkipSample, stateless

from energon_nemotron._energon import (DatasetHook, packing_stage, pass_in_restore_keys, sample_pass,
                                      set_default_failure_tolerance, stage_failure_tolerance)
from energon_nemotron.batch import PackedBatch
from energon_nemotron.config import PackingConfig
from energon_nemotron.cookers import build_cookers
from energon_nemotron.cookers.media_sources import check_binding, media_scope
from energon_nemotron.encoders.buffered import BufferTokenizer
from energon_nemotron.encoders.held_media import HeldMedia
from energon_nemotron.encoders.modalities import check_datasets, check_modalities, check_sample
from energon_nemotron.encoders.one_pass import OnePassEnd, guard_source
from energon_nemotron.encoders.options import NemotronMultimodalOptions, media_options
from energon_nemotron.encoders.outputs import batch_output
from energon_nemotron.encoders.over_length import OverLengthPolicy, OverLengthSkip
from energon_nemotron.encoders.pre_pack import BufferPacker
from energon_nemotron.encoders.runtime import Runtime
from energon_nemotron.errors import ConfigError, DataError, MediaError, sample_where
from energon_nemotron.guards.policy import ErrorPolicy, SampleErrorHandler
from energon_nemotron.media.handlers import MediaHandlers
from energon_nemotron.packing.assemble import assemble_row, batch_rows, row_media
from energon_nemotron.packing.distinct import BufferOverDataWarning, buffer_over_data
from energon_nemotron.packing.spec import has_second_budget, second_budget_packers
from energon_nemotron.registry import PACKERS, TASK_ENCODERS
from energon_nemotron.telemetry import began
from energon_nemotron.tokenization.conversation import ConversationTokenizer
from energon_nemotron.tokenization.loading import TextEncoder
from energon_nemotron.types import Conversation, EncodedSample, EncodedSource, PackedRow, Pending


def check_packing_buffer(packing: Optional[PackingConfig], packing_buffer_size: Optional[int]) -> None:
    """A training loader must pack as ``packing`` says (Energon packs only when given a
    ``packing_buffer_size``): else every row would hold one sample, or the packer would see
    other buffers than the configuration's. A ``ConfigError`` at start naming the fix."""
    want = packing.buffer_size if packing is not None else None
    if (packing_buffer_size or None) == want:
        return
    fix = ("Megatron-Bridge: EnergonMultiModalDataModule(..., packing_buffer_size=N); Energon: "
           "get_train_dataset(..., packing_buffer_size=N)")
    if want is None:
        raise ConfigError(f"the loader packs (packing_buffer_size {packing_buffer_size}) but the encoder has no "
                          f"packing configuration; set packing: {{algorithm: ..., buffer_size: "
                          f"{packing_buffer_size}}} or build the dataset without packing_buffer_size")
    raise ConfigError(f"packing.buffer_size is {want} but the loader builds the dataset with packing_buffer_size "
                      f"{packing_buffer_size}: " + ("every row would hold one sample" if not packing_buffer_size
                                                     else "the packer would see other buffers")
                      + f"; pass packing_buffer_size={want} ({fix})")


@TASK_ENCODERS.register("nemotron_multimodal")
class NemotronMultimodalTaskEncoder(DatasetHook, DefaultTaskEncoder):
    """Task encoder of the Energon path (text, images, video, audio).

    Args:
        tokenizer: a Hugging Face fast tokenizer or a local directory.
        options: :class:`NemotronMultimodalOptions` (or a dict of them).
        packing: a ``PackingConfig`` or None (one sample per row).
        default_cooker: cooker for datasets whose subflavors name none.
        media_roots: folders media paths may name besides the dataset folder (``data.media_roots``);
            with the datasets' aux sources, they reach the cookers through ``cook_crude_sample``.
        runtime: how the encoder is run (``encoders.runtime.Runtime``: its counters, built for the
            loader's workers; Energon's failure tolerance; per-buffer tokenization).
        cookers: the ordered cooker rules ``[{name, options, has_subflavors}]`` (``data.cookers``;
            ``cookers.selection``); None: ``subflavors.cooker`` selects, else ``default_cooker``.
    """

    Options = NemotronMultimodalOptions
    decoder = None          # crude members stay raw bytes: media are decoded only when packed

    def __init__(self, tokenizer: Any, options: Union[NemotronMultimodalOptions, dict],
                 packing: Optional[PackingConfig] = None, default_cooker: Optional[str] = None,
                 seed: int = 0, media_roots: Sequence[Union[str, Path]] = (),
                 runtime: Optional[Runtime] = None, cookers: Optional[Sequence[dict]] = None) -> None:
        super().__init__()
        pass_in_restore_keys()                     # each sample's pass over the data, for its media draws
        o = self.options = options if isinstance(options, NemotronMultimodalOptions) else \
            NemotronMultimodalOptions(**options)
        self.packing, self.seed = packing, seed
        self.pad_multiple = math.lcm(packing.pad_multiple if packing else 1, o.parallel_multiple)
        if o.seq_length % self.pad_multiple:
            raise ConfigError(f"seq_length {o.seq_length} is not a multiple of {self.pad_multiple} "
                              "(packing.pad_multiple combined with 2*context_parallel_size"
                              "[*tensor_parallel_size with sequence_parallel])")
        self.packer = PACKERS.get(packing.algorithm) if packing else None
        if packing and packing.max_media_patches_per_pack and not has_second_budget(self.packer):
            raise ConfigError(f"packing.algorithm {packing.algorithm!r} has no second budget for "
                              f"max_media_patches_per_pack; use one of: {', '.join(second_budget_packers())}")
        self.over_length = OverLengthPolicy(o.over_length, o.seq_length, self.pad_multiple)
        self.cookers = build_cookers(default_cooker, cookers)
        self.media_roots = tuple(Path(r).resolve() for r in media_roots)
        runtime = runtime or Runtime()
        self.counters, self.entry_cache = runtime.counters, runtime.entry_cache
        self.text = ConversationTokenizer(tokenizer, o.prompt_format, o.model_dump(include={"thinking_trace_format", "relax_thinking_trace_check"}))
        tok = self.text.tokenizer
        self.pad_id = next(i for i in (tok.pad_token_id, tok.eos_token_id, 0) if i is not None)
        self.media = MediaHandlers(tok, TextEncoder(tok), media_options("image", o.image),
                                   media_options("video", o.video), media_options("audio", o.audio),
                                   max_bytes=o.max_media_bytes, decodes=self.counters.decodes)
        check_modalities(self.media, o.modalities)
        tolerance = 0 if runtime.failure_tolerance is None and o.on_error == "skip" else runtime.failure_tolerance
        if tolerance is not None:                   # 0: skipping never turns into a fatal error
            set_default_failure_tolerance(self, tolerance)
        self.buffer_packer = BufferPacker(packing, self.packer, o.seq_length, self.counters.packing) \
            if packing else None
        self.held_media = HeldMedia(packing.max_buffer_bytes, packing.buffer_size, self.counters.packing,
                                    self.counters.held) if packing and packing.max_buffer_bytes is not None else None
        self.output = batch_output(o.output)
        if self.output is not None:
            self.output.check_options(o)            # a configuration the consumer cannot take: now
        self.tokenize_per_buffer = runtime.tokenize_per_buffer
        #: what the build methods learn of the loader: a one-pass read (``train`` / ``val`` / None)
        #: and, with packing, the per-buffer tokenizer (made with the worker config's error handler)
        self.one_pass: Optional[str] = None
        self.buffer_tokenizer: Optional[BufferTokenizer] = None

    # -- building the stages ---------------------------------------------------------------------
    def _install_error_policy(self, worker_config: Any) -> None:
        """Under another loader (e.g. Megatron-Bridge's Energon data module), whose WorkerConfig has
        none of our error policies (Energon's default logs and drops samples uncounted): this
        encoder's, ``options.on_error`` (else ``raise``), counting into its counters."""
        if not isinstance(worker_config.global_error_handler, SampleErrorHandler):
            worker_config.global_error_handler = ErrorPolicy(self.options.on_error or "raise", self.counters)

    def _check_packing_buffer(self, packing_buffer_size: Optional[int]) -> None:
        """:func:`check_packing_buffer` against this encoder's ``packing``. (Not checked for
        validation datasets, which readers such as ``stats`` build unpacked on purpose.)"""
        check_packing_buffer(self.packing, packing_buffer_size)

    def _check_data_ranks(self, worker_config: Any) -> None:
        """Under model parallelism (``tensor_parallel_size`` or ``context_parallel_size`` over 1)
        the loader's data ranks must be the pure data-parallel ranks, so that the TP and CP ranks of
        one replica read the same batches. A ``WorkerConfig`` with a data rank per process (its
        ``world_size`` that of ``torch.distributed``: what Megatron-Bridge's data module falls
        back to without ``pg_collection``) gives them different data: a ``ConfigError`` at start."""
        import torch.distributed as dist

        o = self.options
        model = o.tensor_parallel_size * o.context_parallel_size
        if model == 1 or not dist.is_available() or not dist.is_initialized():
            return
        world = dist.get_world_size()
        if world > 1 and worker_config.world_size == world:
            raise ConfigError(
                f"the loader reads with a data rank per process (WorkerConfig world_size {world}, every process) "
                f"under tensor_parallel_size {o.tensor_parallel_size} x context_parallel_size "
                f"{o.context_parallel_size}: the TP/CP ranks of one replica would read different batches; give "
                "the loader the pure data-parallel group (Megatron-Bridge: EnergonMultiModalDataModule(..., "
                "pg_collection=ProcessGroupCollection.use_mpu_process_groups()); Energon: WorkerConfig(rank=DP "
                "rank, world_size=DP size, data_parallel_group=the DP group))")

    def build_train_datasets(self, *, worker_config, **kwargs):
        self._install_error_policy(worker_config)
        self._check_packing_buffer(kwargs.get("packing_buffer_size"))
        self._check_data_ranks(worker_config)
        check_datasets(self.media, self.options.modalities, kwargs["datasets"], self.cookers)
        self.one_pass = None if kwargs.get("repeat", True) else "train"
        self.buffer_tokenizer = None
        if self.one_pass is None and kwargs.get("packing_buffer_size"):
            _warn_buffer_over_data(kwargs["datasets"], kwargs["packing_buffer_size"], worker_config)
        return super().build_train_datasets(worker_config=worker_config, **kwargs)

    def build_val_datasets(self, *, worker_config, **kwargs):
        self._install_error_policy(worker_config)
        check_datasets(self.media, self.options.modalities, kwargs["datasets"], self.cookers)
        self.one_pass, self.buffer_tokenizer = "val", None
        return super().build_val_datasets(worker_config=worker_config, **kwargs)

    def dataset_loading(self, loaded: Any) -> None:
        # a media_source or aux_data_prefixes entry naming no aux source: an error at start
        check_binding(loaded.aux or {}, loaded.dataset.subflavors, str(getattr(loaded.dataset, "path", "a dataset")))

    def dataset_loaded(self, loaded: Any, built: Any, worker_config: Any) -> Any:
        """In a validation pass each dataset is guarded (its datasets are concatenated, and the
        concatenation keeps no state of which one it is in: ``one_pass``)."""
        return OnePassEnd(built, worker_config=worker_config) if self.one_pass == "val" else built

    def build_encode_sample(self, dataset, *, worker_config):
        """In a one-pass training loader the whole source (blend, repetitions) is guarded below the
        shuffle buffer, so that a state saved while the buffers drain keeps the pass's end. With
        packing (and ``tokenize_per_buffer``), samples are mapped by :meth:`prepare_sample` and
        tokenized per buffer (``buffered``)."""
        if self.one_pass == "train":
            dataset = guard_source(dataset, worker_config)
        if self.packing is None or not self.tokenize_per_buffer:
            return super().build_encode_sample(dataset, worker_config=worker_config)
        tolerance = stage_failure_tolerance(self, self.preencode_sample)
        self.buffer_tokenizer = BufferTokenizer(self.text.tokenize, self.encode_prepared,
                                                f"{type(self).__name__}.preencode_sample",
                                                worker_config.global_error_handler, tolerance)
        return MapDataset(dataset, self.prepare_sample, worker_config=worker_config, stateless_map_fn=True,
                          failure_tolerance=tolerance)

    @stateless
    def cook_crude_sample(self, sample, cooker, aux):
        """Energon's cook call inside a ``media_scope``: the cooker's media paths resolve against the
        media roots and the dataset's aux sources (``cookers.media_sources``). The cooked sample's
        key is the one the library shows (``errors.shown_key``: ``FILE.jsonl:N`` for a JSONL line,
        ``DATASET/SHARD:KEY`` for a tar sample), so that every key shown (errors, ``sample_keys``,
        preview, stats) names where the sample is; the cooker itself sees Energon's key (a tar's
        member names start with it)."""
        shown = sample_where(sample) if isinstance(sample, dict) and "__key__" in sample else None
        if shown is not None:
            began(shown)                                   # what a watchdog timeout names (guards.stalls)
        with media_scope(self.media_roots, aux, self.counters.lookups, self.entry_cache):
            cooked = super().cook_crude_sample(sample, cooker, aux)
        if shown is not None and getattr(cooked, "__key__", None) == sample["__key__"]:
            cooked.__key__ = shown
        return cooked

    # -- per sample ------------------------------------------------------------------------------
    def draw_key(self, sample: Conversation) -> tuple[tuple, bool]:
        """The key of a sample's random media draws (``media.draws``): the loader seed, the sample's
        key as shown (its dataset, shard and key) and its pass over the data (``_energon.sample_pass``;
        0 in validation, so that every evaluation draws alike); and whether its images get the
        tiling augmentation (subflavor ``data_augment``, in training only, as NeMo-RL)."""
        validation = self.one_pass == "val"
        passed = 0 if validation else sample_pass(getattr(sample, "__restore_key__", None))
        tiling = bool((getattr(sample, "__subflavors__", None) or {}).get("data_augment")) and not validation
        return (self.seed, str(sample.__key__), passed), tiling

    @stateless
    def preencode_sample(self, sample: Conversation) -> EncodedSample:
        """Phase 1: plan media from metadata, tokenize with placeholders, set the packing cost."""
        prepared = self.prepare_sample(sample)
        return self.encode_prepared(prepared, self.text.tokenize([prepared.pending.prepared])[0])

    @stateless
    def prepare_sample(self, sample: Conversation) -> EncodedSample:
        """Phase 1 up to the tokenizer call: media planned, the text rendered and checked; the
        sample's ``pending`` holds what the call needs (``sources`` empty, ``cost`` 0 until then)."""
        key = sample.__key__
        check_sample(key, sample.media, self.options.modalities)
        try:
            draw, tiling = self.draw_key(sample)
            planned = [self.media.plan(ref, i, draw, tiling) for i, ref in enumerate(sample.media)]
        except MediaError as e:
            raise DataError(key, str(e), e.code) from None
        if self.output is not None:
            self.output.check_media(key, {p.modality for p in planned}, self.options)
        prepared = self.text.prepare(sample.segment_messages(), key, preformatted=sample.preformatted,
                                     last_only=self.options.train_only_on_last_assistant_turn or sample.last_only,
                                     media=planned, tools=sample.tools, tool_boundary=sample.tool_boundary)
        patches = sum(p.plan.num_patches for p in planned if p.modality != "audio")
        return EncodedSample.derive_from(sample, sources=[], cost=0, media_plans=planned, media=list(sample.media),
                                         media_patches=patches, pending=Pending(prepared, sample))

    def finish_sources(self, sample: EncodedSample, encodings: Sequence[Any]) -> list[EncodedSource]:
        """A prepared ``sample``'s sources (tokens, trained flags; one per segment) from its text
        pieces' ``encodings`` (``ConversationTokenizer.tokenize``), before the over-length policy."""
        prepared = sample.pending.prepared
        encoded = self.text.finish(prepared, encodings)
        key = prepared.key
        names = [key] if len(encoded) == 1 else [f"{key}#{i}" for i in range(len(encoded))]
        return [EncodedSource(n, t, m) for n, (t, m) in zip(names, encoded)]

    def encode_prepared(self, sample: EncodedSample, encodings: Sequence[Any]) -> EncodedSample:
        """The rest of phase 1 for a prepared ``sample``: its sources (:meth:`finish_sources`), the
        over-length policy (a skip is counted), the packing cost."""
        key = sample.pending.prepared.key
        try:
            fitted = self.over_length.fit(self.finish_sources(sample, encodings), key, bool(sample.media_plans))
        except OverLengthSkip:
            self.counters.add("over_length")
            raise
        self.counters.read()
        return EncodedSample.derive_from(sample, sources=fitted.sources, cost=fitted.cost,
                                         media_plans=sample.media_plans, media=sample.media,
                                         media_patches=sample.media_patches)

    @stateless
    def postencode_sample(self, sample: EncodedSample) -> EncodedSample:
        """Phase 2 (only for samples selected into a pack): decode and process the media. A sample
        restored from a checkpoint into a pack arrives prepared only, and is tokenized first."""
        if sample.pending is not None:
            sample = self.encode_prepared(sample, self.text.tokenize([sample.pending.prepared])[0])
        try:
            tensors = [self.media.process(ref, p) for ref, p in zip(sample.media, sample.media_plans)]
        except MediaError as e:
            raise DataError(sample.__key__, str(e), e.code) from None
        return EncodedSample.derive_from(sample, sources=sample.sources, cost=sample.cost,
                                         media_plans=sample.media_plans, media=sample.media, media_tensors=tensors,
                                         media_patches=sample.media_patches)

    # -- packing ---------------------------------------------------------------------------------
    def build_batch(self, dataset, *, batch_size, **kwargs):
        """Energon's batching stages, with this library's packing stage (``_energon.packing_stage``:
        samples carried between buffers, the buffer's place in the step schedule, media bytes held
        within ``packing.max_buffer_bytes``: ``encoders.held_media``)."""
        with packing_stage(batch_size or 1, self.held_media):
            return super().build_batch(dataset, batch_size=batch_size, **kwargs)

    def select_samples_to_pack(self, samples: list[EncodedSample], context: Any = None) -> list[list[EncodedSample]]:
        """Packs of the buffer in emission order, every sample exactly once in them or carried
        (``encoders.pre_pack``; ``context``: the packing stage's ``BufferContext``). Prepared samples
        are tokenized first, all in one call (``buffered``)."""
        carried = list(context.carried) if context is not None else [0] * len(samples)
        if self.buffer_tokenizer is not None:
            done = self.buffer_tokenizer(samples, holes=True)
            carried = [t for s, t in zip(done, carried) if s is not None]
            samples = [s for s in done if s is not None]
        if not samples:
            return []
        # a seed derived from the buffer's keys: deterministic, and the same after a restore
        seed = zlib.crc32("\0".join(s.__key__ for s in samples).encode()) ^ self.seed
        return self.buffer_packer(samples, carried, context, seed)

    @stateless
    def pack_selected_samples(self, samples: list[EncodedSample]) -> PackedRow:
        if not samples:
            # every sample of this pack failed at decode time and was counted there (on_error:
            # skip): the empty pack is no further skip
            raise SkipSample()
        sources = [src for s in samples for src in s.sources]
        fields = assemble_row(sources, self.options.seq_length, self.pad_multiple, self.pad_id)
        fields.update(row_media(samples, fields["cu_seqlens_padded"].tolist()))
        return PackedRow.derive_from(samples[0], __key__=",".join(s.__key__ for s in samples), **fields)

    # -- batching --------------------------------------------------------------------------------
    @stateless
    def batch(self, samples: list[Union[PackedRow, EncodedSample]]) -> Any:
        """A ``PackedBatch`` of the rows, or the configured output's batch (``encoders.outputs``).
        Either carries this process's skips since its previous batch (``PackedBatch.skipped``;
        telemetry, not stream state): a skip is reported by the batch its worker makes next, so
        only consumed batches report skips, each once."""
        rows = [s if isinstance(s, PackedRow) else self.pack_selected_samples([s]) for s in samples]
        batch: PackedBatch = batch_rows(rows)
        batch.mtp_num_layers = self.options.mtp_num_layers
        batch.skipped = self.counters.take_pending()
        if self.output is None:
            return batch
        return self.output.convert(batch, self.options, dict(batch.skipped))


def _warn_buffer_over_data(datasets: list, buffer: int, worker_config: Any) -> None:
    """Warn (once, at build) when a repeating loader's packing buffers will hold repeated reads."""
    readers = max(1, worker_config.num_workers) * worker_config.world_size
    described = [(str(getattr(d.dataset, "path", i)), len(d.dataset) * (d.repetitions or 1), d.weight)
                 for i, d in enumerate(datasets)]
    why = buffer_over_data(buffer, described, readers)
    if why:
        warnings.warn(BufferOverDataWarning(
            f"{why}: each buffer holds repeated reads of the same samples. Packs stay free of repeats "
            "(a repeated read goes to another pack), but packing works on fewer distinct lengths; use a "
            "smaller packing.buffer_size or fewer workers for so small a dataset"), stacklevel=2)
