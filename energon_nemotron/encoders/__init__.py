"""Task encoders, registered by name (``registry.TASK_ENCODERS``): ``nemotron_multimodal`` wires
the stages of the Energon path; its options (``options``), model presets (``presets``) and the
media-kind checks (``modalities``) sit beside it."""

from energon_nemotron.encoders.nemotron_multimodal import NemotronMultimodalTaskEncoder
from energon_nemotron.encoders.options import NemotronMultimodalOptions, media_options
from energon_nemotron.encoders.presets import ModelPreset, preset

__all__ = ["NemotronMultimodalTaskEncoder", "NemotronMultimodalOptions", "media_options", "ModelPreset", "preset"]
