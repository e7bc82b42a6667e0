"""``task_encoder.options`` of the ``nemotron_multimodal`` task encoder, validated when the
encoder (or the loader config naming it) is built."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import Field, model_validator

from energon_nemotron.config import StrictModel, check_dataclass_values
from energon_nemotron.encoders.presets import preset
from energon_nemotron.errors import ConfigError
from energon_nemotron.media.audio import AudioOptions
from energon_nemotron.media.image import ImageOptions
from energon_nemotron.media.video import VideoOptions
from energon_nemotron.registry import PROMPT_FORMATS

#: the options dataclass of each media kind
MEDIA_OPTIONS = {"image": ImageOptions, "video": VideoOptions, "audio": AudioOptions}
#: the ``nemotron_omni_contract`` tag of the Megatron-Bridge checkpoints each Nemotron Omni output
#: serves (Bridge main's model provider records it and refuses a checkpoint of the other contract)
OMNI_CONTRACTS = {"nemotron_omni_step": "llava_collapse_expand_v1", "nemotron_omni_expanded": "expanded_sequence_v1"}
#: the audio ``sound_length`` rule (``AudioOptions.sound_length``) each Nemotron Omni output's model counts
OMNI_SOUND_LENGTH = {"nemotron_omni_step": "stft", "nemotron_omni_expanded": "valid"}


def media_options(kind: str, values: dict):
    """The options dataclass of a media kind (:data:`MEDIA_OPTIONS`) from a dict; a
    ``ConfigError`` naming ``task_encoder.options.{kind}.FIELD`` for an unknown key, a wrongly typed
    value (checked against the dataclass's annotations) or a value out of range."""
    where = f"task_encoder.options.{kind}"
    cls = MEDIA_OPTIONS[kind]
    check_dataclass_values(cls, values, where)
    try:
        return cls(**values)
    except ConfigError as e:           # a combination of values (e.g. min_frames > max_frames)
        raise ConfigError(f"{where}: {e}") from None


class NemotronMultimodalOptions(StrictModel):
    """``task_encoder.options`` of ``nemotron_multimodal``; ``image``/``video``/``audio`` hold the
    fields of ``media.image.ImageOptions``, ``media.video.VideoOptions``, ``media.audio.AudioOptions``."""

    prompt_format: str = "tokenizer"
    seq_length: int = Field(ge=2)
    #: how ``nemotron6-moe`` / ``nemotron-h-5p5-reasoning`` rewrite assistant thinking traces
    #: (NeMo-RL's option; ``default`` = ``normalized``); None: the format's own default
    thinking_trace_format: Optional[Literal["default", "normalized", "ultra"]] = None
    #: those formats take assistant texts as they are (NeMo-RL's ``relax_thinking_trace_check``)
    relax_thinking_trace_check: bool = False
    train_only_on_last_assistant_turn: bool = False
    over_length: Literal["error", "skip", "truncate"] = "error"
    image: dict[str, Any] = Field(default_factory=dict)
    video: dict[str, Any] = Field(default_factory=dict)
    audio: dict[str, Any] = Field(default_factory=dict)
    context_parallel_size: int = Field(1, ge=1)
    tensor_parallel_size: int = Field(1, ge=1)
    sequence_parallel: bool = False
    mtp_num_layers: int = Field(0, ge=0)
    max_media_bytes: int = Field(2 * 2**30, ge=1)
    #: a model preset (``encoders.presets``): the image/video layout the consumer model requires
    preset: Optional[str] = None
    #: what ``batch`` yields: a ``PackedBatch``, or the dict of one Megatron-Bridge step (one row
    #: per micro-batch; ``integrations.megatron_bridge``)
    output: Literal["packed_batch", "nemotron_omni_step", "nemotron_omni_expanded", "gpt_step",
                    "nemo_rl_packed"] = "packed_batch"
    #: the ``nemotron_omni_contract`` of the Bridge checkpoint trained on (:data:`OMNI_CONTRACTS`):
    #: checked against ``output`` at start; None: not checked
    contract: Optional[Literal["expanded_sequence_v1", "llava_collapse_expand_v1"]] = None
    #: the bad-sample policy when the encoder runs under another loader than this project's (e.g.
    #: Bridge's Energon data module, whose WorkerConfig has no handler); None: the loader's
    on_error: Optional[Literal["raise", "skip"]] = None
    #: the media kinds the data may hold: their placeholder tokens are checked when the encoder is
    #: built, and a sample with another kind is ``unsupported_media`` (``encoders.modalities``);
    #: None: any kind, each checked at its first item
    modalities: Optional[list[Literal["image", "video", "audio"]]] = None

    @property
    def parallel_multiple(self) -> int:
        """What every source is padded to for parallelism: 2·CP when CP > 1, times TP with
        sequence parallelism (as Megatron-LM pads SFT sequences)."""
        cp = 2 * self.context_parallel_size if self.context_parallel_size > 1 else 1
        return cp * (self.tensor_parallel_size if self.sequence_parallel else 1)

    @property
    def temporal_patch_dim(self) -> int:
        """The Bridge model provider's ``temporal_patch_dim`` this configuration serves (1 without a preset)."""
        return preset(self.preset).temporal_patch_dim if self.preset else 1

    @model_validator(mode="after")
    def _preset(self) -> "NemotronMultimodalOptions":
        if self.preset is None:
            return self
        p = preset(self.preset)
        self.image = p.apply(self.preset, "image", self.image)
        self.video = p.apply(self.preset, "video", self.video)
        if self.output not in p.outputs:
            raise ConfigError(f"task_encoder.options.output {self.output!r}: preset {self.preset!r} ({p.model}) "
                              f"serves {', '.join(p.outputs)}")
        return self

    @model_validator(mode="after")
    def _contract(self) -> "NemotronMultimodalOptions":
        where = "task_encoder.options"
        if self.contract is not None:
            want = OMNI_CONTRACTS.get(self.output)
            served = ", ".join(f"{o}: {c}" for o, c in OMNI_CONTRACTS.items())
            if want is None:
                raise ConfigError(f"{where}.contract {self.contract!r} names a Nemotron Omni checkpoint's contract, "
                                  f"but output {self.output!r} is not a Nemotron Omni step ({served})")
            if want != self.contract:
                other = next(o for o, c in OMNI_CONTRACTS.items() if c == self.contract)
                raise ConfigError(f"{where}.contract {self.contract!r}: output {self.output!r} makes {want} batches; "
                                  f"a {self.contract} checkpoint takes output {other!r}")
        rule = OMNI_SOUND_LENGTH.get(self.output)
        if rule is not None:
            given = self.audio.get("sound_length", rule)
            if given != rule:
                raise ConfigError(f"{where}.audio.sound_length {given!r}: output {self.output!r} counts audio "
                                  f"by {rule!r} mel frames (leave it unset)")
            self.audio = {**self.audio, "sound_length": rule}
        return self

    @model_validator(mode="after")
    def _media(self) -> "NemotronMultimodalOptions":
        for kind in ("image", "video", "audio"):
            media_options(kind, getattr(self, kind))
        return self

    @model_validator(mode="after")
    def _known_format(self) -> "NemotronMultimodalOptions":
        if self.prompt_format not in PROMPT_FORMATS:
            raise ValueError(f"unknown prompt_format {self.prompt_format!r}; known: {', '.join(PROMPT_FORMATS.names())}")
        return self
