"""Reading one rank's part of every dataset of an Energon source, through Energon, up to phase 1.

The datasets are what Energon itself loads for the source (``load_dataset(path).get_datasets``,
``training=False``: no shuffle, no repetition, one pass; weights, subflavors and aux sources as in
training), each built on its own by the configured task encoder's ``build_val_datasets``: the crude
reader, the cooker its subflavors select, and ``preencode_sample`` (media planned from headers,
tokenization, packing cost). Nothing runs after phase 1: no media is decoded, nothing is packed or
batched (:func:`phase1_class`).

Bad samples never stop the reading: as under ``loader.on_error: skip`` each is counted by its
reason code, here without the skip limits. A sample failing before phase 1 (a JSONL line that is no
JSON, a cooker error) reaches Energon's error handler (:class:`FailureLog`); one failing in phase 1
(media planning, tokenization, ``over_length``) becomes a record of its own, with its length when
it was tokenized. ``ConfigError`` (a damaged shard, a missing tokenizer token) still stops.

Data parallelism is Energon's own: ``WorkerConfig(rank=r, world_size=N, num_workers=0)`` gives
rank ``r`` a disjoint part of every dataset; over the ranks every sample is read exactly once.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any, Optional

from megatron.energon import Sample, edataclass, stateless

from energon_nemotron._energon import basic_loader, raw_sample_key, sample_index
from energon_nemotron.config import EnergonSource, LoaderConfig
from energon_nemotron.errors import ConfigError, error_code, sample_where
from energon_nemotron.encoders.over_length import OverLengthSkip
from energon_nemotron.encoders.runtime import EncoderCounters, Runtime
from energon_nemotron.guards.policy import SampleErrorHandler, failure_text
from energon_nemotron.guards.shards import guard_reads
from energon_nemotron.cookers.selection import CookerSelection
from energon_nemotron.loading import build_task_encoder, check_source
from energon_nemotron.loading.preflight import cooker_selection
from energon_nemotron.media.handlers import read_payload
from energon_nemotron.stats.records import DatasetPart, SampleRecord, limited



@edataclass
class Measured(Sample):
    """What phase 1 yields while collecting statistics: the sample's record."""

    record: SampleRecord


def sample_key(sample: Any) -> str:
    """The sample's key (``?`` when unknown); Energon's raw data of a JSONL line holds it inside."""
    key = sample.get("__key__") if isinstance(sample, dict) else getattr(sample, "__key__", None)
    if key is None:
        key = raw_sample_key(sample)
    return "?" if key is None else str(key)


def failure_message(exc: BaseException, sample: Any, sources: Any = None) -> str:
    """``where: why`` of a skipped sample (``guards.policy.failure_text``), named by its key when
    Energon's error context does not name it."""
    where = sample_where(sample, sources)
    return failure_text(exc, sample_key(sample) if where == "?" else where)


def payload_bytes(ref: Any) -> int:
    """Bytes of a media item without decoding it: the payload's length, or its file's size."""
    payload = read_payload(ref)
    return len(payload) if isinstance(payload, bytes) else os.path.getsize(payload)


class FailureLog(SampleErrorHandler):
    """Energon's error handler while collecting: every failing sample becomes a record with its
    reason code (``errors.error_code``); ``ConfigError`` is re-raised (never a sample's fault)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[SampleRecord] = []

    def __call__(self, exc: Exception, sample: object = None, sources: object = None) -> None:
        if isinstance(exc, ConfigError):
            raise exc
        self.records.append(SampleRecord(sample_index(sample), sample_key(sample), error_code(exc),
                                         failure_message(exc, sample, sources)))

    def take(self) -> list[SampleRecord]:
        """The records logged since the last call."""
        out, self.records = self.records, []
        return out


@functools.lru_cache(maxsize=None)
def phase1_class(base: type) -> type:
    """``base`` (a task encoder class of this library) as a phase-1-only reader: ``preencode_sample``
    yields a :class:`Measured` record for every sample (read, or failed in phase 1), composed of
    the encoder's own parts (``prepare_sample``, ``finish_sources``, its ``over_length`` policy:
    the length before the policy is recorded), and ``build_batch`` adds nothing after it (no
    ``postencode_sample``: nothing decoded; no packing, no batching). :func:`stats_encoder` builds
    it as the loader builds the encoder."""

    class Phase1(base):
        @stateless
        def preencode_sample(self, sample: Any) -> Measured:
            return Measured.derive_from(sample, record=_measure(self, sample))

        def build_batch(self, dataset: Any, **kwargs: Any) -> Any:
            return dataset

    Phase1.__name__ = Phase1.__qualname__ = f"Phase1{base.__name__}"
    return Phase1


def _measure(encoder: Any, sample: Any) -> SampleRecord:
    """The record of one cooked sample: phase 1 of ``encoder`` up to the over-length policy."""
    index, key = sample_index(sample), str(sample.__key__)
    prepared = measured = None
    try:
        prepared = encoder.prepare_sample(sample)
        sources = encoder.finish_sources(prepared, encoder.text.tokenize([prepared.pending.prepared])[0])
        measured = encoder.over_length.measure(sources)
        fitted = encoder.over_length.fit(sources, key, bool(prepared.media_plans))
    except OverLengthSkip as e:                   # over_length: skip (the encoder's own policy)
        message = f"{key}: sample takes {e.length} positions, more than seq_length={encoder.options.seq_length}"
        return _dropped(index, key, "over_length", message, measured, prepared)
    except ConfigError:
        raise
    except Exception as e:
        return _dropped(index, key, error_code(e), failure_message(e, sample), measured, prepared)
    return SampleRecord(index, key, length=fitted.length, tokens=fitted.tokens,
                        cost=fitted.cost, patches=int(prepared.media_patches),
                        media=_media(prepared.media, prepared.media_plans))


def _dropped(index: Optional[int], key: str, code: str, message: str, measured: Optional[tuple],
             prepared: Any) -> SampleRecord:
    """A sample phase 1 dropped; when it was tokenized (``measured``), with its length and media."""
    if measured is None:
        return SampleRecord(index, key, code, message)
    length, tokens = measured
    return SampleRecord(index, key, code, message, length=length, tokens=tokens,
                        media=_media(prepared.media, prepared.media_plans))


def _media(refs: list, plans: list) -> tuple:
    return tuple((p.modality, payload_bytes(ref), int(p.num_tokens)) for ref, p in zip(refs, plans))


def stats_encoder(cfg: LoaderConfig) -> Any:
    """The configured task encoder, built exactly as the loader builds it (``build_task_encoder``),
    made a phase-1 reader (:func:`phase1_class`): its failures never turn fatal (Energon's failure
    tolerance 0), it counts nothing (the records count) and it tokenizes sample by sample."""
    runtime = Runtime(EncoderCounters.silent(), failure_tolerance=0, tokenize_per_buffer=False)
    return build_task_encoder(cfg, subclass=phase1_class, runtime=runtime)


def dataset_info(loaded: Any, selection: CookerSelection) -> dict:
    """How the report names a dataset Energon loaded: path, format, blend weight / repetitions,
    subflavors, the cooker they select, aux source names and the samples of the split."""
    factory = loaded.dataset
    path = str(getattr(factory, "path", "?"))
    subflavors = dict(getattr(factory, "subflavors", None) or {})
    return {"path": path, "format": "jsonl" if path.endswith(".jsonl") else "webdataset",
            "weight": loaded.weight, "repetitions": loaded.repetitions, "subflavors": subflavors,
            "cooker": selection.cooker_for(subflavors), "aux": sorted(loaded.aux or {}),
            "samples_in_split": len(factory)}


def read_energon(cfg: LoaderConfig, src: EnergonSource, rank: int = 0, world: int = 1,
                 limit: Optional[int] = None, progress: bool = False) -> list[DatasetPart]:
    """Rank ``rank`` of ``world``'s records of every dataset of ``src``, in source order; at most its
    first ``limit`` records per dataset. Checks the source first, as the loader does."""
    from pathlib import Path

    from megatron.energon import WorkerConfig, load_dataset
    from tqdm import tqdm

    check_source(Path(src.path), src.split, cfg.data)
    selection = cooker_selection(cfg.data)
    encoder = stats_encoder(cfg)
    failures = FailureLog()
    wc = WorkerConfig(rank=rank, world_size=world, num_workers=0, seed_offset=cfg.loader.seed,
                      global_error_handler=failures)
    loaded = load_dataset(str(src.path)).get_datasets(training=False, split_part=src.split, worker_config=wc,
                                                      decoder=encoder.decoder)
    parts = []
    for item in loaded.datasets:
        info = dataset_info(item, selection)
        dataset = encoder.build_val_datasets(datasets=[item], worker_config=wc, batch_size=None)
        guard_reads(dataset)
        total = info["samples_in_split"] if world == 1 else None
        total = min(total, limit) if total is not None and limit is not None else total
        records: list[SampleRecord] = []
        failures.take()
        with tqdm(total=total, desc=Path(info["path"]).name, unit="sample", disable=not progress,
                  leave=False, file=sys.stderr) as bar:
            for measured in basic_loader(dataset):
                new = failures.take() + [measured.record]
                records += new
                bar.update(len(new))
                if limit is not None and len(records) >= limit:
                    break
            records += failures.take()
        parts.append(DatasetPart(info, limited(records, limit)))
    return parts
