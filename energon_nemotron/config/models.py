"""The YAML loader config (pydantic). Unknown keys are errors that list the valid ones.

```yaml
tokenizer: PATH                      # a Hugging Face tokenizer directory
task_encoder: {name: nemotron_multimodal, options: {prompt_format: tokenizer, seq_length: 4096}}
packing: {algorithm: best_fit_decreasing, buffer_size: 256, pad_multiple: 1, max_sequences_per_bin: null,
          max_media_patches_per_pack: null}
data: {train: {path: DATASET_DIR, split: train}, validation: null, default_cooker: null, media_roots: null}
loader: {batch_size: 1, num_workers: 2, shuffle_buffer_size: 1000, seed: 1234}
```

A data source is an Energon dataset (``{path, split}``: a prepared dataset folder, a metadataset
``.yaml`` or a prepared ``.jsonl``) or Megatron-LM offline-packed rows
(``{format: megatron_sft_packed, path, seq_length, prompt_format, context_parallel_size, ...}``).
Relative paths resolve against the YAML file's folder. The YAML is read with ``yaml.safe_load``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from energon_nemotron._energon.storage import data_location, is_url
from energon_nemotron.config.values import byte_count, describe_value
from energon_nemotron.errors import ConfigError


class StrictModel(BaseModel):
    """A config section: unknown keys are rejected with the list of valid keys."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            valid = [f.alias or name for name, f in cls.model_fields.items()]
            unknown = [k for k in data if k not in valid]
            if unknown:
                raise ValueError(f"unknown key(s) {', '.join(map(repr, unknown))}; valid keys: {', '.join(valid)}")
        return data


class BalanceConfig(StrictModel):
    """Packs of even cost across data-parallel ranks (``packing.balance``; docs/packing.md)."""

    #: emit each buffer's packs in the order of the step schedule all ranks share
    schedule: bool = True
    #: make each buffer's packs of even extra work (a packer registered with ``even=True``:
    #: ``minimum_bin_slack``; other packers pack by tokens only)
    even_packs: bool = True
    #: with ``packing.carry``: carry whole packs too while that brings a buffer's extra work per
    #: token nearer the running mean (a dear buffer holds its dearest packs back for the next)
    even_buffers: bool = True
    #: cap each pack's extra work (vision patches, audio frames, attention) at this many times the
    #: running mean extra work of a full pack (1.0: the most even packs, for some token fill); null:
    #: no cap. Needs a packer with a second budget and no ``max_media_patches_per_pack``
    cost_cap: Optional[float] = Field(None, gt=0)
    #: the cost model, per LLM token position (``packing.balance.CostModel``)
    attention: float = Field(7.68e-6, ge=0)
    vision_patch: float = Field(0.197, ge=0)
    audio_frame: float = Field(0.0234, ge=0)


class CarryConfig(StrictModel):
    """Under-filled buffer tails carried into the next buffer (``packing.carry``; docs/packing.md)."""

    #: carry the samples of packs whose token fill is under this fraction of seq_length
    min_fill: float = Field(0.99, gt=0, le=1)
    #: times a sample may be carried before it is packed wherever it falls
    max_times: int = Field(4, ge=1)


class PackingConfig(StrictModel):
    algorithm: str = "minimum_bin_slack"
    buffer_size: int = Field(256, ge=1)
    pad_multiple: int = Field(1, ge=1)
    max_sequences_per_bin: Optional[int] = Field(None, ge=1)
    #: second budget per pack: vision patches (images and video frames), balancing encoder work
    max_media_patches_per_pack: Optional[int] = Field(None, ge=1)
    #: balanced_greedy_knapsack only: bins opened up front beyond ceil(total / capacity) (NeMo-RL's
    #: and Megatron-LM's ``balanced_knapsack_delta``); null: none (0)
    balanced_knapsack_delta: Optional[int] = Field(None, ge=0)
    #: packs of even cost across ranks (null: packed and emitted by tokens only)
    balance: Optional[BalanceConfig] = Field(default_factory=BalanceConfig)
    #: under-filled tails carried into the next buffer (null: every buffer packed on its own)
    carry: Optional[CarryConfig] = Field(default_factory=CarryConfig)
    #: media bytes a worker's packing buffer may hold (a whole number of bytes or "2GiB"; 0: none; null:
    #: no bound); a sample whose media do not fit reads them again by restore key for its pack
    #: (``encoders.held_media``)
    max_buffer_bytes: Optional[int] = None

    @field_validator("max_buffer_bytes", mode="before")
    @classmethod
    def _bytes(cls, v: Any) -> Optional[int]:
        return None if v is None else byte_count(v)

    @field_validator("algorithm")
    @classmethod
    def _known_algorithm(cls, v: str) -> str:
        from energon_nemotron.registry import PACKERS

        if v not in PACKERS:
            raise ValueError(f"unknown packing algorithm {v!r}; known: {', '.join(PACKERS.names())}")
        return v

    @model_validator(mode="after")
    def _delta_for_balanced(self) -> "PackingConfig":
        if self.balanced_knapsack_delta is not None and self.algorithm != "balanced_greedy_knapsack":
            raise ValueError(f"balanced_knapsack_delta: only balanced_greedy_knapsack opens bins up front, so "
                             f"it is the only algorithm that takes it (algorithm is {self.algorithm!r}); "
                             f"remove the key or set algorithm: balanced_greedy_knapsack")
        return self


class EnergonSource(StrictModel):
    """An Energon dataset: a prepared folder, a metadataset ``.yaml`` or a prepared ``.jsonl``.
    ``virtual_epoch_length`` (training, repeating): an epoch is this many batches (Energon's
    ``EpochizeDataset``; 0: the data's own epoch); ``limit`` (validation): at most this many
    batches per pass (Energon's ``LimitDataset``)."""

    format: Literal["energon"] = "energon"
    #: a local path (relative: to the config's folder) or an ``msc://PROFILE/PATH`` URL, kept as given
    path: Union[Path, str]
    split: str = "train"
    virtual_epoch_length: int = Field(0, ge=0)
    limit: Optional[int] = Field(None, ge=1)

    @field_validator("path", mode="before")
    @classmethod
    def _location(cls, v: Any) -> Any:
        return _data_path(v)


def _data_path(v: Any) -> Any:
    """A source's ``path`` as configured: a local ``Path`` or an ``msc://`` URL (``data_location``)."""
    if not isinstance(v, (str, Path)):
        raise ValueError(f"expected {FIELD_HINTS['data.train.path']}; got {describe_value(v)}")
    return data_location(v)


class MegatronSource(StrictModel):
    """Megatron-LM offline-packed rows (``megatron_sft_packed``); already packed. ``path``: a
    ``.jsonl.packed`` file, or the ``OUT.manifest.json`` that ``pack-megatron`` writes (its shards
    are read in order as one stream of rows). A manifest (given, or beside the file) must record
    the encoder configured here, else a ``ConfigError`` lists every differing key."""

    format: Literal["megatron_sft_packed"]
    #: a local path (relative: to the config's folder) or an ``msc://PROFILE/PATH`` URL, kept as given
    path: Union[Path, str]
    seq_length: int = Field(ge=1)
    prompt_format: str = "identity"
    context_parallel_size: int = Field(1, ge=1)
    pad_token: Optional[str] = None
    chat_key: str = "messages"
    identity_masks_prompt: bool = True
    allow_eos_pad: bool = False

    @field_validator("path", mode="before")
    @classmethod
    def _location(cls, v: Any) -> Any:
        return _data_path(v)


Source = Union[EnergonSource, MegatronSource]


SOURCE_HINT = ("a data source: {path: DATASET} (an Energon dataset: a folder prepared with `energon prepare`, a "
               "metadataset .yaml or a prepared .jsonl) or {format: megatron_sft_packed, path: ROWS.jsonl.packed, "
               "seq_length: L}")
#: what a missing or wrongly typed field must be set to, by its dotted location
FIELD_HINTS = {
    "tokenizer": "a Hugging Face fast tokenizer folder (saved with tokenizer.save_pretrained)",
    "data": "a mapping with at least train: {path: DATASET}",
    "data.train": SOURCE_HINT, "data.validation": f"null or {SOURCE_HINT}",
    "data.train.path": "the dataset to read (Energon: a folder prepared with `energon prepare`, a metadataset "
                       ".yaml or a prepared .jsonl, local or msc://PROFILE/PATH; megatron_sft_packed: a "
                       ".jsonl.packed file or the OUT.manifest.json of its shards)",
    "data.train.seq_length": "the row length L the megatron_sft_packed file was packed for",
}
FIELD_HINTS["data.validation.path"] = FIELD_HINTS["data.train.path"]
FIELD_HINTS["data.validation.seq_length"] = FIELD_HINTS["data.train.seq_length"]


def _source(value: Any, field: str = "train") -> Any:
    if value is None and field == "validation":
        return None
    if isinstance(value, (EnergonSource, MegatronSource)):
        return value
    if not isinstance(value, dict):
        raise ValueError(f"expected {SOURCE_HINT}; got {describe_value(value)}")
    fmt = value.get("format", "energon")
    if fmt == "megatron_sft_packed":
        return MegatronSource.model_validate(value)
    if fmt != "energon":
        raise ValueError(f"unknown source format {fmt!r}; known: energon, megatron_sft_packed")
    return EnergonSource.model_validate(value)


class CookerSpec(StrictModel):
    """One entry of ``data.cookers`` (``cookers.selection``): the registered cooker ``name``, the
    keyword ``options`` bound to it, and the subflavor filter that selects it (null: the fallback)."""

    name: str
    options: dict[str, Any] = Field(default_factory=dict)
    has_subflavors: Optional[dict[str, Any]] = None


class DataConfig(StrictModel):
    train: Source
    validation: Optional[Source] = None
    default_cooker: Optional[str] = None
    #: the ordered cooker rules (first match wins, one trailing fallback without has_subflavors);
    #: null: ``subflavors.cooker`` names the cooker (else ``default_cooker``)
    cookers: Optional[list[CookerSpec]] = None
    #: subflavor keys no cooker reads (beyond a blend's bookkeeping keys and the cooker filters'):
    #: ``error`` (a typo is caught at start) or ``allow`` (a blend's free-form keys; a near-miss of a
    #: key the cooker reads stays an error)
    other_subflavors: Literal["error", "allow"] = "error"
    #: folders that media paths in samples may also name (besides the dataset folder): a relative
    #: path is tried against the dataset folder, then each root in order (``cookers.media``)
    media_roots: Optional[list[Path]] = None

    @field_validator("train", "validation", mode="before")
    @classmethod
    def _pick_source(cls, v: Any, info: ValidationInfo) -> Any:
        return _source(v, info.field_name)


class TaskEncoderConfig(StrictModel):
    name: str = "nemotron_multimodal"
    options: dict[str, Any] = Field(default_factory=dict)


class CachePoolConfig(StrictModel):
    """Energon's ``FileStoreCachePool(method="raw")``: cookers that need a cache read media through it."""

    max_gbytes: Optional[float] = Field(None, gt=0)
    num_workers: int = Field(1, ge=1)
    #: the folder it caches into (null: the system's temporary folder)
    directory: Optional[Path] = None


class LoaderSettings(StrictModel):
    batch_size: int = Field(1, ge=1)
    num_workers: int = Field(2, ge=0)
    #: Energon: the shuffle buffer; megatron_sft_packed training rows: any value is a full
    #: per-epoch permutation of the rows (seeded by ``seed``), null keeps file order
    shuffle_buffer_size: Optional[int] = Field(1000, ge=1)
    seed: int = 1234
    dp_rank: int = Field(0, ge=0)
    dp_size: int = Field(1, ge=1)
    on_error: Literal["raise", "skip"] = "raise"
    #: log a one-line telemetry summary (logger ``energon_nemotron``) every N batches; 0: never
    log_every: int = Field(0, ge=0)
    #: skips stop the run when more than this fraction of the last 1000 samples a worker read were
    #: skipped (checked from 200 samples on; ``skip_limits``); null: never
    max_skip_fraction: Optional[float] = Field(0.5, gt=0, le=1)
    #: skips stop the run after this many in a row in one worker; null: never
    max_consecutive_skips: Optional[int] = Field(100, ge=1)
    #: Energon: samples read in a row from one shard before another is picked (null: whole slices)
    max_samples_per_sequence: Optional[int] = Field(None, ge=1)
    #: batches each worker prepares ahead (torch ``DataLoader`` ``prefetch_factor``)
    prefetch_factor: int = Field(2, ge=1)
    #: seconds between worker checkpoints: a restore replays at most this long of batches, and the
    #: loader keeps that many batches' keys for an elastic resume
    checkpoint_every_sec: float = Field(1.0, gt=0)
    #: seconds a loader process (a worker) may go without yielding a sample before the loader fails
    #: naming it, the sample it began last and its threads' stacks (Energon's watchdog); null: none
    watchdog_timeout_seconds: Optional[float] = Field(600.0, gt=0)
    #: run the garbage collector every N batches in each worker; 0: never
    gc_collect_every_n_steps: int = Field(0, ge=0)
    #: an Energon ``FileStoreCachePool`` for media read through aux sources (null: none)
    cache_pool: Optional["CachePoolConfig"] = None

    @model_validator(mode="after")
    def _rank(self) -> "LoaderSettings":
        if self.dp_rank >= self.dp_size:
            raise ValueError(f"dp_rank {self.dp_rank} must be < dp_size {self.dp_size}")
        return self


class LoaderConfig(StrictModel):
    tokenizer: Path
    task_encoder: TaskEncoderConfig = Field(default_factory=TaskEncoderConfig)
    packing: Optional[PackingConfig] = None
    data: DataConfig
    loader: LoaderSettings = Field(default_factory=LoaderSettings)

    @model_validator(mode="after")
    def _coherent(self) -> "LoaderConfig":
        sources = [s for s in (self.data.train, self.data.validation) if s is not None]
        if all(isinstance(s, MegatronSource) for s in sources):
            if self.packing is not None:
                raise ValueError("packing: megatron_sft_packed rows are packed already; remove the packing section")
            if self.data.default_cooker is not None or self.data.cookers is not None:
                key = "default_cooker" if self.data.default_cooker is not None else "cookers"
                raise ValueError(f"data.{key}: megatron_sft_packed sources have no cookers")
        if self.data.default_cooker is not None and self.data.cookers is not None:
            raise ValueError("data.default_cooker: set either it or data.cookers (whose last entry without "
                             "has_subflavors is the fallback), not both")
        return self

    def resolved(self, base: Path) -> "LoaderConfig":
        """A copy with relative paths resolved against ``base``."""

        def fix(p: Any) -> Any:
            return p if is_url(p) or Path(p).is_absolute() else (base / p)

        out = self.model_copy(deep=True)
        out.tokenizer = fix(out.tokenizer)
        for name in ("train", "validation"):
            src = getattr(out.data, name)
            if src is not None:
                src.path = fix(src.path)
        if out.data.media_roots is not None:
            out.data.media_roots = [fix(p) for p in out.data.media_roots]
        pool = out.loader.cache_pool
        if pool is not None and pool.directory is not None:
            pool.directory = fix(pool.directory)
        return out


def format_validation_error(err: ValidationError, origin: str) -> str:
    """One line per error: ``origin: field.path: what is wrong`` (with what to set for a missing
    or wrongly typed field); a message that already names its field under ``origin`` is kept as is."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"] if not str(p).startswith("function-"))
        msg = e["msg"].removeprefix("Value error, ")
        if not loc and msg.startswith(origin + "."):
            lines.append(msg)
            continue
        hint = FIELD_HINTS.get(loc)
        if hint and e["type"] == "missing":
            msg = f"missing; set it to {hint}"
        elif hint and e["type"].endswith(("_type", "_parsing")):
            msg = f"expected {hint}; got {describe_value(e.get('input'))}"
        lines.append(f"{origin}: {loc or '(top level)'}: {msg}")
    return "\n".join(lines)


def read_yaml_file(path: Path, what: str) -> Any:
    """The YAML document in ``path``; a missing file or invalid YAML is a ``ConfigError`` (``what``
    names the file's kind: ``"loader config"``)."""
    if not path.is_file():
        raise ConfigError(f"{what} {str(path)!r} does not exist")
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {e}") from None


def load_config(source: Union[str, Path, dict[str, Any]], base: Optional[Path] = None) -> LoaderConfig:
    """Parse a loader config from a YAML file (or a dict); errors are ``ConfigError``s."""
    if isinstance(source, dict):
        data, origin, base = source, "config", base or Path.cwd()
    else:
        path = Path(source)
        data, origin, base = read_yaml_file(path, "loader config"), str(path), path.parent
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: a loader config must be a mapping")
    try:
        return LoaderConfig.model_validate(data).resolved(base)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, origin)) from None
