"""Model presets: the media layout each consumer model requires (task-encoder option ``preset``).

A preset fixes the image and video options its model cannot do without (``required``), may give
others a default of its own (``defaults``: used where the configuration leaves the key unset) and
lets everything else (frame rate, frame counts, resize kernel, audio) be set as usual. An option the
configuration sets to another value than the preset requires is a ``ConfigError`` at start, naming
the key, the value and the model. ``temporal_patch_dim`` is the value of the Bridge model
provider's field of that name, used by :func:`~energon_nemotron.integrations.megatron_bridge.to_nemotron_omni_step_batch`.

- ``nemotron_omni``: Nemotron 3 Omni as ``transformers``' ``NemotronH_Omni_Reasoning_V3`` serves it
  (dynamic-resolution images, aspect-preserving video frames, 2-frame tubelets), and Bridge's
  Nemotron Omni model with ``temporal_patch_dim 1`` for images (that model takes no video).
- ``nemotron_omni_temporal``: Bridge's Nemotron Omni model with the temporal video embedder
  (``temporal_patch_dim 2``): every image and every frame 512x512 (32x32 patches, 256 tokens),
  2-frame tubelets; frames chosen as Bridge's collate chooses them by default (``video.sampling:
  bridge``, and with it Bridge's 1 fps and no frame cap), since that model is trained only through
  Bridge.
- ``nemotron_nano_vl``: Nemotron Nano v2 VL (512x512 tiles, up to 12, plus a thumbnail; 256
  tokens per tile). Bridge's Nano VL step takes unpacked ``[tiles, 3, 512, 512]`` images, which this
  version does not produce: the preset sets the image layout for ``PackedBatch`` consumers only
  (video is left to the options: the notes this project works from do not fix Nano VL's frames).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from energon_nemotron.errors import ConfigError
from energon_nemotron.registry import MODEL_PRESETS

#: the vision patch layout every preset's model takes: 16x16 px patches, 2x2 pixel shuffle (the
#: ``patch_size`` and ``downsample`` options of image and video; the Bridge adapter reads it too)
VISION_PATCHES = {"patch_size": 16, "downsample": 2}


@dataclass(frozen=True)
class ModelPreset:
    """``image``/``video``: the options the model requires; ``defaults``: ``{kind: {key: value}}``
    taken where the configuration leaves a key unset; ``temporal_patch_dim``: 1 or 2; ``outputs``: the
    task-encoder ``output`` values this model can take."""

    model: str
    image: dict[str, Any] = field(default_factory=dict)
    video: dict[str, Any] = field(default_factory=dict)
    temporal_patch_dim: int = 1
    outputs: tuple[str, ...] = ("packed_batch",)
    defaults: dict[str, dict[str, Any]] = field(default_factory=dict)

    def apply(self, name: str, kind: str, values: dict[str, Any]) -> dict[str, Any]:
        """``values`` (the configured options of ``kind``) with the preset's defaults under them and its
        required ones added; a conflicting value raises ``ConfigError``."""
        required = getattr(self, kind)
        for key, want in required.items():
            if key in values and values[key] != want:
                raise ConfigError(f"task_encoder.options.{kind}.{key} = {values[key]!r}, but preset {name!r} "
                                  f"({self.model}) requires {want!r}")
        return {**self.defaults.get(kind, {}), **values, **required}


MODEL_PRESETS.register("nemotron_omni", ModelPreset(
    model="Nemotron 3 Omni (transformers NemotronH_Omni_Reasoning_V3; Bridge NemotronOmni, temporal_patch_dim 1)",
    image={"mode": "dynamic", **VISION_PATCHES},
    video={"maintain_aspect_ratio": True, "temporal_patch": 2, **VISION_PATCHES},
    temporal_patch_dim=1,
    outputs=("packed_batch", "nemotron_omni_step", "nemotron_omni_expanded", "nemo_rl_packed")))

MODEL_PRESETS.register("nemotron_omni_temporal", ModelPreset(
    model="Nemotron 3 Omni with Bridge's temporal video embedder (temporal_patch_dim 2)",
    image={"mode": "tiling", "tile_size": 512, "max_tiles": 1, "use_thumbnail": False, **VISION_PATCHES},
    video={"maintain_aspect_ratio": False, "target_patches": 1024, "temporal_patch": 2, **VISION_PATCHES},
    temporal_patch_dim=2, outputs=("packed_batch", "nemotron_omni_step", "nemotron_omni_expanded"),
    defaults={"video": {"sampling": "bridge"}}))

MODEL_PRESETS.register("nemotron_nano_vl", ModelPreset(
    model="Nemotron Nano v2 VL (512x512 tiles)",
    image={"mode": "tiling", "tile_size": 512, "max_tiles": 12, "use_thumbnail": True, **VISION_PATCHES},
    temporal_patch_dim=1, outputs=("packed_batch",)))


def preset(name: str) -> ModelPreset:
    """The registered preset ``name`` (``ConfigError`` listing the known ones otherwise)."""
    try:
        return MODEL_PRESETS.get(name)
    except KeyError as e:
        raise ConfigError(f"task_encoder.options.preset: {e.args[0]}") from None
