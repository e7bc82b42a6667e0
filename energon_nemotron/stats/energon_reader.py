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

from megatron.energon import Sample, SkipSample, edataclass, stateless

from energon_nemotron.config import EnergonSource, LoaderConfig
from energon_nemotron.errors import ConfigError, error_code, sample_where
from energon_nemotron.guards.policy import ErrorPolicy, failure_text
from energon_nemotron.packing.assemble import round_up
from energon_nemotron.stats.records import DatasetPart, SampleRecord, limited



class _NoCount:
    """A skip counter that counts nothing: the encoder's own over-length count (and the skip
    limits it carries) are replaced by the records."""

    def add(self, name: str, n: int = 1) -> None:
        pass


@edataclass
class Measured(Sample):
    """What phase 1 yields while collecting statistics: the sample's record."""

    record: SampleRecord


def sample_index(sample: Any) -> Optional[int]:
    """Energon's index of a sample in its dataset: the last entry of its restore key (a crude sample
    dict, a ``Sample`` or Energon's raw sample data), else its first source's index."""
    key = sample.get("__restore_key__") if isinstance(sample, dict) else getattr(sample, "__restore_key__", None)
    if key and isinstance(key[-1], int):
        return int(key[-1])
    sources = sample.get("__sources__") if isinstance(sample, dict) else getattr(sample, "__sources__", None)
    if sources:
        return int(sources[0].index)
    return None


def sample_key(sample: Any) -> str:
    """The sample's key (``?`` when unknown); Energon's raw data of a JSONL line holds it inside."""
    key = sample.get("__key__") if isinstance(sample, dict) else getattr(sample, "__key__", None)
    if key is None:
        data = getattr(sample, "data", None)
        if isinstance(data, (list, tuple)) and data and isinstance(data[0], dict):
            key = data[0].get("__key__")
    return "?" if key is None else str(key)


def failure_message(exc: BaseException, sample: Any, sources: Any = None) -> str:
    """``where: why`` of a skipped sample (``guards.policy.failure_text``), named by its key when
    Energon's error context does not name it."""
    where = sample_where(sample, sources)
    return failure_text(exc, sample_key(sample) if where == "?" else where)


def payload_bytes(ref: Any) -> int:
    """Bytes of a media item without decoding it: the payload's length, or its file's size."""
    from energon_nemotron.media.handlers import read_payload

    payload = read_payload(ref)
    return len(payload) if isinstance(payload, bytes) else os.path.getsize(payload)


class FailureLog(ErrorPolicy):
    """Energon's error handler while collecting: every failing sample becomes a record with its
    reason code (``errors.error_code``); ``ConfigError`` is re-raised (never a sample's fault)."""

    def __init__(self) -> None:
        super().__init__("skip", None)
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
    yields a :class:`Measured` record for every sample (read, or failed in phase 1), and
    ``build_batch`` adds nothing after it (no ``postencode_sample``: nothing decoded; no packing, no
    batching). ``build_task_encoder(cfg, subclass=phase1_class)`` builds it as the loader builds the encoder."""

    class Phase1(base):
        __slots__ = ()

        @stateless
        def preencode_sample(self, sample: Any) -> Measured:
            self._fitted = None
            index, key = sample_index(sample), str(sample.__key__)
            try:
                encoded = super().preencode_sample(sample)
            except SkipSample:                        # over_length: skip (the encoder's own policy)
                length = self._fitted[0] if self._fitted else None
                record = _dropped(self, index, key, sample, "over_length", f"{key}: sample takes {length} "
                                  f"positions, more than seq_length={self.options.seq_length}")
            except ConfigError:
                raise
            except Exception as e:
                record = _dropped(self, index, key, sample, error_code(e), failure_message(e, sample))
            else:
                fitted = self._fitted or (int(encoded.cost), sum(len(s.tokens) for s in encoded.sources), None)
                length, tokens, _ = fitted
                record = SampleRecord(index, key, length=length, tokens=tokens, cost=int(encoded.cost),
                                      patches=int(encoded.media_patches),
                                      media=_media(encoded.media, encoded.media_plans))
            return Measured.derive_from(sample, record=record)

        def _fit(self, sources: list, key: str, planned: list) -> list:
            """The encoder's over-length policy; the sample's length before it is kept for the record."""
            length = sum(round_up(int(s.tokens.shape[0]), self.pad_multiple) for s in sources)
            self._fitted = (length, sum(int(s.tokens.shape[0]) for s in sources), planned)
            return super()._fit(sources, key, planned)

        def build_batch(self, dataset: Any, **kwargs: Any) -> Any:
            return dataset

    Phase1.__name__ = Phase1.__qualname__ = f"Phase1{base.__name__}"
    return Phase1


def _dropped(encoder: Any, index: Optional[int], key: str, sample: Any, code: str, message: str) -> SampleRecord:
    """A sample phase 1 dropped; when it was tokenized (an over-length one), with its length and media."""
    if encoder._fitted is None:
        return SampleRecord(index, key, code, message)
    length, tokens, planned = encoder._fitted
    return SampleRecord(index, key, code, message, length=length, tokens=tokens, media=_media(sample.media, planned))


def _media(refs: list, plans: list) -> tuple:
    return tuple((p.modality, payload_bytes(ref), int(p.num_tokens)) for ref, p in zip(refs, plans))


def stats_encoder(cfg: LoaderConfig) -> Any:
    """The configured task encoder, built exactly as the loader builds it (``build_task_encoder``),
    made a phase-1 reader (:func:`phase1_class`); its failures never turn fatal (Energon's failure
    tolerance off) and its own skip counting is off (the records count)."""
    from energon_nemotron.loading import build_task_encoder

    encoder = build_task_encoder(cfg, subclass=phase1_class)
    encoder.__default_failure_tolerance__ = 0
    encoder.skipped_counts = _NoCount()
    encoder._fitted = None
    return encoder


def dataset_info(loaded: Any, default_cooker: Optional[str]) -> dict:
    """How the report names a dataset Energon loaded: path, format, blend weight / repetitions,
    subflavors, the cooker they select, aux source names and the samples of the split."""
    factory = loaded.dataset
    path = str(getattr(factory, "path", "?"))
    subflavors = dict(getattr(factory, "subflavors", None) or {})
    return {"path": path, "format": "jsonl" if path.endswith(".jsonl") else "webdataset",
            "weight": loaded.weight, "repetitions": loaded.repetitions, "subflavors": subflavors,
            "cooker": subflavors.get("cooker", default_cooker), "aux": sorted(loaded.aux or {}),
            "samples_in_split": len(factory)}


def read_energon(cfg: LoaderConfig, src: EnergonSource, rank: int = 0, world: int = 1,
                 limit: Optional[int] = None, progress: bool = False) -> list[DatasetPart]:
    """Rank ``rank`` of ``world``'s records of every dataset of ``src``, in source order; at most its
    first ``limit`` records per dataset. Checks the source first, as the loader does."""
    from pathlib import Path

    from megatron.energon import WorkerConfig, load_dataset
    from megatron.energon.savable_loader import BasicDataLoader
    from tqdm import tqdm

    from energon_nemotron.loading.preflight import check_source
    from energon_nemotron.guards.shards import guard_reads

    check_source(Path(src.path), src.split, cfg.data.default_cooker)
    encoder = stats_encoder(cfg)
    failures = FailureLog()
    wc = WorkerConfig(rank=rank, world_size=world, num_workers=0, seed_offset=cfg.loader.seed,
                      global_error_handler=failures)
    loaded = load_dataset(str(src.path)).get_datasets(training=False, split_part=src.split, worker_config=wc,
                                                      decoder=encoder.decoder)
    parts = []
    for item in loaded.datasets:
        info = dataset_info(item, cfg.data.default_cooker)
        dataset = encoder.build_val_datasets(datasets=[item], worker_config=wc, batch_size=None)
        guard_reads(dataset)
        total = info["samples_in_split"] if world == 1 else None
        total = min(total, limit) if total is not None and limit is not None else total
        records: list[SampleRecord] = []
        failures.take()
        with tqdm(total=total, desc=Path(info["path"]).name, unit="sample", disable=not progress,
                  leave=False, file=sys.stderr) as bar:
            for measured in BasicDataLoader(dataset, gc_collect_every_n_steps=0, watchdog_timeout_seconds=None):
                new = failures.take() + [measured.record]
                records += new
                bar.update(len(new))
                if limit is not None and len(records) >= limit:
                    break
            records += failures.take()
        parts.append(DatasetPart(info, limited(records, limit)))
    return parts
