"""The Megatron-Bridge steps as task-encoder outputs (``task_encoder.options.output``), for Bridge's
own Energon data module: ``batch`` yields one step's dict per micro-batch instead of a
``PackedBatch`` (one packed row per micro-batch).

Registered in ``registry.BATCH_OUTPUTS`` (``nemotron_omni_step``: Bridge 0.6.2's contract,
``nemotron_omni_expanded``: Bridge main's, ``gpt_step``). Besides what the
step reads (``integrations.megatron_bridge``) each dict carries, for the data loop's logs (unknown
keys are None in Bridge's step): ``sample_keys``, ``skipped`` (this process's skips since its
previous batch, by reason) and ``telemetry`` (samples, tokens, positions, fill ratio, media by kind).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from energon_nemotron.batch import PackedBatch
from energon_nemotron.errors import ConfigError, DataError
from energon_nemotron.encoders.options import media_options
from energon_nemotron.encoders.presets import VISION_PATCHES
from energon_nemotron.integrations.bridge_expanded import to_nemotron_omni_expanded_batch
from energon_nemotron.integrations.megatron_bridge import to_gpt_step_batch, to_nemotron_omni_step_batch
from energon_nemotron.registry import BATCH_OUTPUTS

__all__ = ["StepOutput", "telemetry"]


def telemetry(batch: PackedBatch, row: int = 0) -> dict:
    """What row ``row`` of ``batch`` holds: samples, tokens, positions, fill ratio, media by kind."""
    media: dict[str, int] = {}
    for span in batch.media_spans[row]:
        media[span.kind] = media.get(span.kind, 0) + 1
    tokens = int(batch.cu_seqlens[row][-1])
    return {"samples": len(batch.sample_keys[row]), "tokens": tokens, "positions": batch.seq_length,
            "fill_ratio": tokens / batch.seq_length, "media": media}


def _omni_options(options: Any, output: str) -> None:
    """What Bridge's Nemotron Omni models (0.6.2's and main's) cannot take, known from the options: other than
    16 px patches with 2x2 pixel shuffle, tiled images (more than one unit per image), and
    multi-token prediction (the step's ``cu_seqlens_q`` holds real lengths, so megatron-core's MTP
    roll would cross segments and train pads; ``gpt_step`` is MTP-safe)."""
    where = "task_encoder.options"
    for kind in ("image", "video"):
        typed = media_options(kind, getattr(options, kind))
        for name, want in VISION_PATCHES.items():
            if getattr(typed, name) != want:
                raise ConfigError(f"{where}.{kind}.{name} = {getattr(typed, name)!r}: output {output} "
                                  f"(Bridge's Nemotron Omni vision path) takes {name} {want}; use the "
                                  "nemotron_omni preset")
    image = media_options("image", options.image)
    if image.mode == "tiling" and (image.max_tiles > 1 or image.use_thumbnail):
        raise ConfigError(f"{where}.image: tiling with max_tiles {image.max_tiles}, use_thumbnail "
                          f"{image.use_thumbnail} makes tiled images; output {output} (Bridge's Nemotron "
                          "Omni model) takes one unit per image: use the nemotron_omni or nemotron_omni_temporal "
                          "preset")
    if options.mtp_num_layers:
        raise ConfigError(f"{where}.mtp_num_layers = {options.mtp_num_layers}: output {output} is not "
                          "MTP-safe (its cu_seqlens_q holds real lengths, so megatron-core's MTP roll crosses "
                          "segments and trains pads); use output gpt_step for text, or packed_batch")


def _no_options(options: Any, output: str) -> None:
    """``gpt_step`` takes any layout (it refuses media per sample) and is MTP-safe."""


def _omni_media(key: str, kinds: set[str], options: Any) -> None:
    if "video" in kinds and options.temporal_patch_dim == 1:
        raise DataError(key, "has video; Bridge's Nemotron Omni model takes video only with its temporal "
                             "embedder (preset nemotron_omni_temporal)", "unsupported_media")


def _text_only(key: str, kinds: set[str], options: Any) -> None:
    if kinds:
        raise DataError(key, f"has {', '.join(sorted(kinds))}; output gpt_step takes text only", "unsupported_media")


@dataclass(frozen=True)
class StepOutput:
    """One Bridge step: ``step`` converts one row (``integrations.megatron_bridge``), ``media``
    refuses a sample the step's model cannot take, ``options`` a configuration whose batches it
    cannot take (at start), ``temporal``: the step takes ``temporal_patch_dim``."""

    name: str
    step: Callable[..., dict]
    media: Callable[[str, set, Any], None]
    options: Callable[[Any], None]
    temporal: bool = False

    def check_options(self, options: Any) -> None:
        self.options(options, self.name)

    def check_media(self, key: str, kinds: set[str], options: Any) -> None:
        self.media(key, kinds, options)

    def convert(self, batch: PackedBatch, options: Any, skipped: dict[str, int]) -> dict:
        if batch.batch_size != 1:
            raise ConfigError(f"output {self.name}: one packed row per micro-batch (batch_size / "
                              f"micro_batch_size 1), got {batch.batch_size} rows")
        kwargs = {"temporal_patch_dim": options.temporal_patch_dim} if self.temporal else {}
        out = self.step(batch, 0, **kwargs)
        out["sample_keys"] = batch.sample_keys[0]
        out["skipped"] = skipped
        out["telemetry"] = telemetry(batch, 0)
        return out


BATCH_OUTPUTS.register("nemotron_omni_step", StepOutput("nemotron_omni_step", to_nemotron_omni_step_batch,
                                                        _omni_media, _omni_options, temporal=True))
BATCH_OUTPUTS.register("nemotron_omni_expanded", StepOutput(
    "nemotron_omni_expanded", to_nemotron_omni_expanded_batch, _omni_media, _omni_options, temporal=True))
BATCH_OUTPUTS.register("gpt_step", StepOutput("gpt_step", to_gpt_step_batch, _text_only, _no_options))
