"""The YAML loader config (pydantic). Unknown keys are errors that list the valid ones.

```yaml
tokenizer: PATH                      # a Hugging Face tokenizer directory
task_encoder: {name: nemotron_multimodal, options: {prompt_format: tokenizer, seq_length: 4096}}
packing: {algorithm: best_fit_decreasing, buffer_size: 256, pad_multiple: 1, max_sequences_per_bin: null,
          max_media_patches_per_pack: null}
data: {train: {path: DATASET_DIR, split: train}, validation: null, default_cooker: null}
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
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

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


class PackingConfig(StrictModel):
    algorithm: str = "minimum_bin_slack"
    buffer_size: int = Field(256, ge=1)
    pad_multiple: int = Field(1, ge=1)
    max_sequences_per_bin: Optional[int] = Field(None, ge=1)
    #: second budget per pack: vision patches (images and video frames), balancing encoder work
    max_media_patches_per_pack: Optional[int] = Field(None, ge=1)

    @field_validator("algorithm")
    @classmethod
    def _known_algorithm(cls, v: str) -> str:
        from energon_nemotron.registry import PACKERS

        if v not in PACKERS:
            raise ValueError(f"unknown packing algorithm {v!r}; known: {', '.join(PACKERS.names())}")
        return v


class EnergonSource(StrictModel):
    """An Energon dataset: a prepared folder, a metadataset ``.yaml`` or a prepared ``.jsonl``."""

    format: Literal["energon"] = "energon"
    path: Path
    split: str = "train"


class MegatronSource(StrictModel):
    """Megatron-LM offline-packed rows (``megatron_sft_packed``); already packed."""

    format: Literal["megatron_sft_packed"]
    path: Path
    seq_length: int = Field(ge=1)
    prompt_format: str = "identity"
    context_parallel_size: int = Field(1, ge=1)
    pad_token: Optional[str] = None
    chat_key: str = "messages"
    identity_masks_prompt: bool = True
    allow_eos_pad: bool = False


Source = Union[EnergonSource, MegatronSource]


def _source(value: Any) -> Any:
    if isinstance(value, dict):
        fmt = value.get("format", "energon")
        if fmt == "megatron_sft_packed":
            return MegatronSource.model_validate(value)
        if fmt != "energon":
            raise ValueError(f"unknown source format {fmt!r}; known: energon, megatron_sft_packed")
        return EnergonSource.model_validate(value)
    return value


class DataConfig(StrictModel):
    train: Source
    validation: Optional[Source] = None
    default_cooker: Optional[str] = None

    @field_validator("train", "validation", mode="before")
    @classmethod
    def _pick_source(cls, v: Any) -> Any:
        return _source(v)


class TaskEncoderConfig(StrictModel):
    name: str = "nemotron_multimodal"
    options: dict[str, Any] = Field(default_factory=dict)


class LoaderSettings(StrictModel):
    batch_size: int = Field(1, ge=1)
    num_workers: int = Field(2, ge=0)
    shuffle_buffer_size: Optional[int] = Field(1000, ge=1)
    seed: int = 1234
    dp_rank: int = Field(0, ge=0)
    dp_size: int = Field(1, ge=1)
    on_error: Literal["raise", "skip"] = "raise"
    #: log a one-line telemetry summary (logger ``energon_nemotron``) every N batches; 0: never
    log_every: int = Field(0, ge=0)

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
            if self.data.default_cooker is not None:
                raise ValueError("data.default_cooker: megatron_sft_packed sources have no cookers")
        return self

    def resolved(self, base: Path) -> "LoaderConfig":
        """A copy with relative paths resolved against ``base``."""

        def fix(p: Path) -> Path:
            return p if p.is_absolute() else (base / p)

        out = self.model_copy(deep=True)
        out.tokenizer = fix(out.tokenizer)
        for name in ("train", "validation"):
            src = getattr(out.data, name)
            if src is not None:
                src.path = fix(src.path)
        return out


def format_validation_error(err: ValidationError, origin: str) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"] if not str(p).startswith("function-"))
        msg = e["msg"].removeprefix("Value error, ")
        lines.append(f"{origin}: {loc or '(top level)'}: {msg}")
    return "\n".join(lines)


def load_config(source: Union[str, Path, dict], base: Optional[Path] = None) -> LoaderConfig:
    """Parse a loader config from a YAML file (or a dict); errors are ``ConfigError``s."""
    if isinstance(source, dict):
        data, origin, base = source, "config", base or Path.cwd()
    else:
        path = Path(source)
        if not path.is_file():
            raise ConfigError(f"loader config {str(path)!r} does not exist")
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: invalid YAML: {e}") from None
        origin, base = str(path), path.parent
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: a loader config must be a mapping")
    try:
        return LoaderConfig.model_validate(data).resolved(base)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, origin)) from None
