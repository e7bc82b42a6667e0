"""The ``nemotron_multimodal`` task encoder: an Energon ``DefaultTaskEncoder`` that wires the stages.

cookers (by name) → ``preencode_sample`` (plan media from headers, tokenize with placeholders,
packing cost; nothing decoded) → ``select_samples_to_pack`` (a registered packer over the buffer;
every sample placed exactly once; with packing, samples arrive from ``prepare_sample``, rendered but
not yet tokenized, and the whole buffer is tokenized here in one call) → ``postencode_sample`` (decode only the media of samples
selected into a pack) → ``pack_selected_samples`` (one ``PackedRow``) → ``batch`` (``PackedBatch``).
Without packing, each batch row holds one sample. Everything up to the packing buffer is
``@stateless``. With ``options.output`` set to a Megatron-Bridge step, ``batch`` yields that step's
dict instead (``integrations.megatron_bridge``), for Bridge's own Energon data module.
"""

from __future__ import annotations

import zlib
import inspect
import math
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from megatron.energon import DefaultTaskEncoder, MapDataset, SkipSample, stateless
from megatron.energon.errors import ErrorContext
from megatron.energon.task_encoder.base import get_failure_tolerance

from energon_nemotron.config import PackingConfig
from energon_nemotron.cookers import build_cookers
from energon_nemotron.cookers.media_sources import LOOKUP_COUNTERS, bound_source, media_scope
from energon_nemotron.encoders.modalities import check_datasets, check_modalities, check_sample
from energon_nemotron.encoders.options import NemotronMultimodalOptions, media_options  # noqa: F401 (re-exported)
from energon_nemotron.errors import ConfigError, DataError, MediaError
from energon_nemotron.guards.policy import skip_counter as skip_counter
from energon_nemotron.media.handlers import MediaHandlers
from energon_nemotron.packing.assemble import PackedRow, assemble_row, batch_rows, round_up, row_media
from energon_nemotron.packing.distinct import separate_repeats, source_id
from energon_nemotron.registry import PACKERS, TASK_ENCODERS
from energon_nemotron.guards.skip_limits import record_pass
from energon_nemotron.telemetry import SharedCounter
from energon_nemotron.tokenization.conversation import ConversationTokenizer, NoTrainableTokensError
from energon_nemotron.tokenization.loading import TextEncoder
from energon_nemotron.types import Conversation, EncodedSample, EncodedSource, Pending
from energon_nemotron.batch import PackedBatch


@TASK_ENCODERS.register("nemotron_multimodal")
class NemotronMultimodalTaskEncoder(DefaultTaskEncoder):
    """Task encoder of the Energon path (text; media plans are empty until media support).

    Args:
        tokenizer: a Hugging Face fast tokenizer or a local directory.
        options: :class:`NemotronMultimodalOptions` (or a dict of them).
        packing: a ``PackingConfig`` or None (one sample per row).
        default_cooker: cooker for datasets whose subflavors name none.
        media_roots: folders media paths may name besides the dataset folder (``data.media_roots``);
            with the datasets' aux sources, they reach the cookers through ``cook_crude_sample``.
    """

    Options = NemotronMultimodalOptions
    decoder = None          # crude members stay raw bytes: media are decoded only when packed

    def __init__(self, tokenizer: Any, options: Union[NemotronMultimodalOptions, dict],
                 packing: Optional[PackingConfig] = None, default_cooker: Optional[str] = None,
                 seed: int = 0, media_roots: Sequence[Union[str, Path]] = ()) -> None:
        super().__init__()
        self.options = options if isinstance(options, NemotronMultimodalOptions) else NemotronMultimodalOptions(**options)
        self.packing = packing
        self.pad_multiple = math.lcm(packing.pad_multiple if packing else 1, self.options.parallel_multiple)
        if self.options.seq_length % self.pad_multiple:
            raise ConfigError(f"seq_length {self.options.seq_length} is not a multiple of {self.pad_multiple} "
                              "(packing.pad_multiple combined with 2*context_parallel_size"
                              "[*tensor_parallel_size with sequence_parallel])")
        self.packer = PACKERS.get(packing.algorithm) if packing else None
        if packing and packing.max_media_patches_per_pack and \
                "secondary" not in inspect.signature(self.packer).parameters:
            with_budget = [n for n in PACKERS.names() if "secondary" in inspect.signature(PACKERS.get(n)).parameters]
            raise ConfigError(f"packing.algorithm {packing.algorithm!r} has no second budget for "
                              f"max_media_patches_per_pack; use one of: {', '.join(with_budget)}")
        self.seed = seed
        self.cookers = build_cookers(default_cooker)
        self.media_roots = tuple(Path(r).resolve() for r in media_roots)
        #: media found by basename in an aux source (``cookers.media_sources``): a shared counter
        #: the loader replaces with one sized for its workers
        self.media_lookups = SharedCounter(LOOKUP_COUNTERS)
        self.text = ConversationTokenizer(tokenizer, self.options.prompt_format)
        tok = self.text.tokenizer
        self.pad_id = next(i for i in (tok.pad_token_id, tok.eos_token_id, 0) if i is not None)
        o = self.options
        self.media = MediaHandlers(tok, TextEncoder(tok), media_options("image", o.image),
                                   media_options("video", o.video), media_options("audio", o.audio),
                                   max_bytes=o.max_media_bytes)
        check_modalities(self.media, o.modalities)
        #: skips by reason (over-length skips here, ``on_error: skip`` in the loader's handler);
        #: the loader replaces it with one sized for its workers before they start
        self.skipped_counts = skip_counter()
        if o.on_error == "skip":
            self.__default_failure_tolerance__ = 0      # skipping never turns into a fatal error
        self._pending_skips: dict[str, int] = {}        # this process's skips not yet in a dict batch
        if o.output != "packed_batch":
            from energon_nemotron.integrations.megatron_bridge import STEP_BATCHES

            self._to_step = STEP_BATCHES[o.output]

    # -- under another loader (e.g. Megatron-Bridge's Energon data module) -----------------------
    def _count_skip(self, code: str) -> None:
        self.skipped_counts.add(code)
        self._pending_skips[code] = self._pending_skips.get(code, 0) + 1

    def _install_error_policy(self, worker_config) -> None:
        """Put this encoder's bad-sample policy into a WorkerConfig that has none of ours (Energon's
        default logs and drops samples uncounted): ``options.on_error``, else ``raise``."""
        from energon_nemotron.guards.policy import ErrorPolicy

        if not isinstance(worker_config.global_error_handler, ErrorPolicy):
            worker_config.global_error_handler = ErrorPolicy(self.options.on_error or "raise", _Counted(self))

    def build_train_datasets(self, *, worker_config, **kwargs):
        self._install_error_policy(worker_config)
        check_datasets(self.media, self.options.modalities, kwargs["datasets"], self.cookers)
        self._one_pass = None if kwargs.get("repeat", True) else "train"
        self._pack_buffer = kwargs.get("packing_buffer_size") is not None
        if self._one_pass is None and kwargs.get("packing_buffer_size"):
            self._warn_buffer_over_data(kwargs["datasets"], kwargs["packing_buffer_size"], worker_config)
        return super().build_train_datasets(worker_config=worker_config, **kwargs)

    @staticmethod
    def _warn_buffer_over_data(datasets: list, buffer: int, worker_config) -> None:
        """Warn (once, at build) when a repeating loader's packing buffers will hold repeated reads."""
        import warnings

        from energon_nemotron.packing.distinct import BufferOverDataWarning, buffer_over_data

        readers = max(1, worker_config.num_workers) * worker_config.world_size
        described = [(str(getattr(d.dataset, "path", i)), len(d.dataset) * (d.repetitions or 1), d.weight)
                     for i, d in enumerate(datasets)]
        why = buffer_over_data(buffer, described, readers)
        if why:
            warnings.warn(BufferOverDataWarning(
                f"{why}: each buffer holds repeated reads of the same samples. Packs stay free of repeats "
                "(a repeated read goes to another pack), but packing works on fewer distinct lengths; use a "
                "smaller packing.buffer_size or fewer workers for so small a dataset"), stacklevel=2)

    def build_val_datasets(self, *, worker_config, **kwargs):
        self._install_error_policy(worker_config)
        check_datasets(self.media, self.options.modalities, kwargs["datasets"], self.cookers)
        self._one_pass = "val"
        self._pack_buffer = kwargs.get("packing_buffer_size") is not None
        return super().build_val_datasets(worker_config=worker_config, **kwargs)

    def _load_dataset(self, dataset, worker_rotation_offset, worker_config):
        """Energon's loading of one dataset; in a validation pass each one is guarded (its
        datasets are concatenated, and the concatenation keeps no state of which one it is in)."""
        from energon_nemotron.encoders.one_pass import OnePassEnd

        if dataset.aux:                 # a media_source naming no aux source: an error at start
            bound_source(dataset.aux, dataset.dataset.subflavors, str(getattr(dataset.dataset, "path", "a dataset")))
        loaded = super()._load_dataset(dataset, worker_rotation_offset, worker_config)
        return OnePassEnd(loaded, worker_config=worker_config) if getattr(self, "_one_pass", None) == "val" else loaded

    @stateless
    def cook_crude_sample(self, sample, cooker, aux):
        """Energon's cook call inside a ``media_scope``: the cooker's media paths resolve against the
        media roots and the dataset's aux sources (``cookers.media_sources``)."""
        with media_scope(self.media_roots, aux, self.media_lookups):
            return super().cook_crude_sample(sample, cooker, aux)

    def build_encode_sample(self, dataset, *, worker_config):
        """In a one-pass training loader the whole source (blend, repetitions) is guarded below the
        shuffle buffer, so that a state saved while the buffers drain keeps the pass's end. With
        packing, samples are mapped by :meth:`prepare_sample` (tokenized per buffer)."""
        if getattr(self, "_one_pass", None) == "train":
            from energon_nemotron.encoders.one_pass import guard_source

            dataset = guard_source(dataset, worker_config)
        self._worker_config, self._phase1_errors = worker_config, None
        if getattr(self, "_pack_buffer", False) and \
                type(self).preencode_sample is NemotronMultimodalTaskEncoder.preencode_sample:
            # with packing, the tokenizer runs once per buffer (select_samples_to_pack), not per sample
            return MapDataset(dataset, self.prepare_sample, worker_config=worker_config, stateless_map_fn=True,
                              failure_tolerance=get_failure_tolerance(self.preencode_sample,
                                                                      self.__default_failure_tolerance__))
        return super().build_encode_sample(dataset, worker_config=worker_config)

    # -- per sample ------------------------------------------------------------------------------
    @stateless
    def preencode_sample(self, sample: Conversation) -> EncodedSample:
        """Phase 1: plan media from metadata, tokenize with placeholders, set the packing cost."""
        prepared = self.prepare_sample(sample)
        return self._tokenized(prepared, self.text.tokenize([prepared.pending.prepared])[0])

    @stateless
    def prepare_sample(self, sample: Conversation) -> EncodedSample:
        """Phase 1 up to the tokenizer call: media planned, the text rendered and checked; the
        sample's ``pending`` holds what the call needs (``sources`` empty, ``cost`` 0 until then).
        With packing, the loader maps this instead of :meth:`preencode_sample` and
        :meth:`select_samples_to_pack` tokenizes the whole buffer in one call."""
        key = sample.__key__
        check_sample(key, sample.media, self.options.modalities)
        try:
            planned = [self.media.plan(ref, i) for i, ref in enumerate(sample.media)]
        except MediaError as e:
            raise DataError(key, str(e), e.code) from None
        self._check_consumer(key, planned)
        prepared = self.text.prepare(sample.segment_messages(), key, preformatted=sample.preformatted,
                                     last_only=self.options.train_only_on_last_assistant_turn, media=planned,
                                     tools=sample.tools)
        patches = sum(p.plan.num_patches for p in planned if p.modality != "audio")
        return EncodedSample.derive_from(sample, sources=[], cost=0, media_plans=planned, media=list(sample.media),
                                         media_patches=patches, pending=Pending(prepared, sample))

    def _tokenized(self, sample: EncodedSample, encodings: Sequence[Any]) -> EncodedSample:
        """The rest of phase 1 for a prepared ``sample`` given its text pieces' ``encodings``: loss
        flags, sources, the over-length policy, the packing cost."""
        prepared = sample.pending.prepared
        key = prepared.key
        encoded = self.text.finish(prepared, encodings)
        names = [key] if len(encoded) == 1 else [f"{key}#{i}" for i in range(len(encoded))]
        sources = [EncodedSource(n, t, m) for n, (t, m) in zip(names, encoded)]
        sources = self._fit(sources, key, sample.media_plans)
        cost = sum(round_up(int(s.tokens.shape[0]), self.pad_multiple) for s in sources)
        record_pass(self.skipped_counts)            # read: the skip limits' window (skip_limits)
        return EncodedSample.derive_from(sample, sources=sources, cost=cost, media_plans=sample.media_plans,
                                         media=sample.media, media_patches=sample.media_patches)

    def _tokenize_buffer(self, samples: list[EncodedSample]) -> list[EncodedSample]:
        """The buffer's prepared samples tokenized in one tokenizer call (a tokenizer called once per
        sample between the other per-sample work runs at about half its speed: its tables fall out
        of the CPU caches). A sample failing here goes to the loader's error policy as it would
        have in :meth:`preencode_sample` (the cooked sample named; ``on_error: skip`` drops and
        counts it); the others keep their order."""
        pending = [s for s in samples if s.pending is not None]
        if not pending:
            return samples
        encodings = iter(self.text.tokenize([s.pending.prepared for s in pending]))
        if getattr(self, "_phase1_errors", None) is None:
            self._phase1_errors = ErrorContext(f"{type(self).__name__}.preencode_sample",
                                               self._worker_config.global_error_handler,
                                               get_failure_tolerance(self.preencode_sample,
                                                                     self.__default_failure_tolerance__))
        out = []
        for s in samples:
            if s.pending is None:
                out.append(s)
                continue
            done = None
            with self._phase1_errors.handle_errors(s.pending.origin):
                done = self._tokenized(s, next(encodings))
            if done is not None:
                out.append(done)
        return out

    def _check_consumer(self, key: str, planned: list) -> None:
        """Media the configured ``output`` cannot carry are a ``DataError`` of the sample (before
        packing, so ``on_error`` applies), not a failed batch."""
        kinds = {p.modality for p in planned}
        if self.options.output == "gpt_step" and kinds:
            raise DataError(key, f"has {', '.join(sorted(kinds))}; output gpt_step takes text only", "unsupported_media")
        if self.options.output == "nemotron_omni_step" and "video" in kinds and self.options.temporal_patch_dim == 1:
            raise DataError(key, "has video; Bridge's Nemotron Omni model takes video only with its temporal "
                                 "embedder (preset nemotron_omni_temporal)", "unsupported_media")

    @stateless
    def postencode_sample(self, sample: EncodedSample) -> EncodedSample:
        """Phase 2 (only for samples selected into a pack): decode and process the media. A sample
        restored from a checkpoint into a pack arrives prepared only, and is tokenized first."""
        if sample.pending is not None:
            sample = self._tokenized(sample, self.text.tokenize([sample.pending.prepared])[0])
        try:
            tensors = [self.media.process(ref, p) for ref, p in zip(sample.media, sample.media_plans)]
        except MediaError as e:
            raise DataError(sample.__key__, str(e), e.code) from None
        return EncodedSample.derive_from(sample, sources=sample.sources, cost=sample.cost,
                                         media_plans=sample.media_plans, media=sample.media, media_tensors=tensors,
                                         media_patches=sample.media_patches)

    def _fit(self, sources: list[EncodedSource], key: str, planned: list) -> list[EncodedSource]:
        """Apply the over-length policy to a sample longer than ``seq_length``."""
        L = self.options.seq_length
        cost = sum(round_up(int(s.tokens.shape[0]), self.pad_multiple) for s in sources)
        if cost <= L:
            return sources
        policy = self.options.over_length
        if policy == "error":
            raise DataError(key, f"sample takes {cost} positions, more than seq_length={L} "
                                 "(task_encoder.options.over_length: error | skip | truncate)", "over_length")
        if policy == "skip":
            self._count_skip("over_length")
            raise SkipSample()
        kept, room = [], L
        if planned:
            raise DataError(key, f"sample takes {cost} positions, more than seq_length={L}, and has media: "
                                 "it cannot be truncated without cutting a placeholder (use over_length: skip)", "over_length")
        for s in sources:
            if room <= 0:
                break
            n = min(int(s.tokens.shape[0]), room)
            kept.append(EncodedSource(s.key, s.tokens[:n], s.trained[:n]))
            room -= round_up(n, self.pad_multiple)
        if not any(s.trained[1:].any() for s in kept):
            raise NoTrainableTokensError(key, f"no trainable tokens remain after truncating to seq_length={L}")
        return kept

    # -- packing ---------------------------------------------------------------------------------
    def select_samples_to_pack(self, samples: list[EncodedSample]) -> list[list[EncodedSample]]:
        """Bins of the buffer by the registered packer; every sample exactly once. Prepared samples
        (:meth:`prepare_sample`) are tokenized first, all in one call (:meth:`_tokenize_buffer`)."""
        samples = self._tokenize_buffer(samples)
        if not samples:
            return []
        # a seed derived from the buffer's keys: deterministic, and the same after a restore
        seed = zlib.crc32("\0".join(s.__key__ for s in samples).encode()) ^ self.seed
        budget = {}
        if self.packing.max_media_patches_per_pack:
            budget = {"secondary": [s.media_patches for s in samples],
                      "secondary_capacity": self.packing.max_media_patches_per_pack}
        bins = self.packer([s.cost for s in samples], self.options.seq_length,
                           max_sequences_per_bin=self.packing.max_sequences_per_bin, seed=seed, **budget)
        placed = sorted(i for b in bins for i in b)
        if placed != list(range(len(samples))):
            raise RuntimeError(f"packer {self.packing.algorithm!r} did not place every sample exactly once")
        # a buffer larger than a worker's share of a repeating dataset holds repeated reads: never two in a pack
        bins = separate_repeats(bins, [source_id(s) for s in samples], [s.cost for s in samples],
                                self.options.seq_length, self.packing.max_sequences_per_bin, **budget)
        return [[samples[i] for i in b] for b in bins]

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
    def batch(self, samples: list[Union[PackedRow, EncodedSample]]) -> PackedBatch:
        rows = [s if isinstance(s, PackedRow) else self.pack_selected_samples([s]) for s in samples]
        batch = batch_rows(rows)
        batch.mtp_num_layers = self.options.mtp_num_layers
        if self.options.output == "packed_batch":
            return batch
        if batch.batch_size != 1:
            raise ConfigError(f"output {self.options.output}: one packed row per micro-batch (batch_size / "
                              f"micro_batch_size 1), got {batch.batch_size} rows")
        kwargs = {"temporal_patch_dim": self.options.temporal_patch_dim} if self.options.output == "nemotron_omni_step" else {}
        out = self._to_step(batch, 0, **kwargs)
        # read by nobody in Bridge's step (unknown keys become None there); for the data loop's logs
        out["sample_keys"] = batch.sample_keys[0]
        out["skipped"], self._pending_skips = self._pending_skips, {}
        media: dict[str, int] = {}
        for span in batch.media_spans[0]:
            media[span["kind"]] = media.get(span["kind"], 0) + 1
        tokens = int(batch.cu_seqlens[0][-1])
        out["telemetry"] = {"samples": len(batch.sample_keys[0]), "tokens": tokens, "positions": batch.seq_length,
                            "fill_ratio": tokens / batch.seq_length, "media": media}
        return out


class _Counted:
    """What an ``ErrorPolicy`` counts into: the encoder's counters (shared and this process's)."""

    def __init__(self, encoder: NemotronMultimodalTaskEncoder) -> None:
        self.encoder = encoder

    def add(self, code: str, n: int = 1) -> None:
        for _ in range(n):
            self.encoder._count_skip(code)
