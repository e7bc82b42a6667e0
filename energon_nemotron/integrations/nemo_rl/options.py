"""NeMo-RL's ``nemotron_multimodal`` task-encoder options (``EnergonTaskEncoderOptions``) as the
library's ``task_encoder.options``, key by key.

Each NeMo-RL option either maps to a library option (``patch_dim`` → the image and video
``patch_size``, ``video_max_num_frames`` → ``video.max_frames``, the augmentation →
``video.augment_*`` / ``video.temporal_jitter`` / ``image.tiling_augment_prob``, the audio
durations → ``audio.*``, the prompt format and its thinking-trace settings as named) or is refused
by name with the reason. Videos take NeMo-RL's own frame selection (``video.sampling: nemo_rl``).
Performance-only settings (``video_decode_thread_count``) are accepted and reported as not applied.
"""

from __future__ import annotations

from typing import Any

from energon_nemotron.integrations.nemo_rl.walk import Walk
from energon_nemotron.registry import PROMPT_FORMATS
from energon_nemotron.tokenization.formats import formats_taking

__all__ = ["encoder_options", "NEMO_RL_OPTION_DEFAULTS"]

#: NeMo-RL's defaults (``config.py@4cb727fe``): an option at its default needs nothing here
NEMO_RL_OPTION_DEFAULTS = {
    "patch_dim": 16, "temporal_patch_size": 2, "prompt_format": "nemotron-h-5p5-reasoning",
    "thinking_trace_format": "normalized", "relax_thinking_trace_check": False, "packing_sequence_length": None,
    "video_min_num_frames": 8, "video_max_num_frames": 32, "video_default_fps": 2,
    "video_frame_temporal_jitter": False, "video_aug_scale_frames_up": None, "video_aug_scale_resolution_up": None,
    "video_aug_scale_resolution_only": False, "tiling_augment_prob": 0.4, "allow_large_videos": False,
    "video_decode_thread_count": 8, "audio_subsampling_factor": None, "audio_num_mel_bins": 128,
    "audio_clip_duration_seconds": 30.0, "min_audio_duration_seconds": 0.1, "max_audio_duration_seconds": 1800.0,
}
#: NeMo-RL's augmentation options and the library's (``video.*``, ``media.augment``)
_AUGMENT = {"video_aug_scale_frames_up": "augment_frames_up", "video_aug_scale_resolution_up": "augment_resolution_up",
            "video_aug_scale_resolution_only": "augment_resolution_only", "video_frame_temporal_jitter": "temporal_jitter"}
#: NeMo-RL caps video duration at this many seconds unless allow_large_videos
NEMO_RL_MAX_VIDEO_SECONDS = 600.0
#: what the library uses for "no cap" (its option must be a finite number)
NO_VIDEO_CAP = 1e9


def _task_encoder_name(walk: Walk) -> str:
    key = "data.energon.task_encoder"
    te = walk.get(key, {"name": "generic_sft"})
    name = te if isinstance(te, str) else te.get("name", "generic_sft") if isinstance(te, dict) else None
    if isinstance(te, dict):
        walk.entry_keys(key, te, ("name", "options", "packing"), "task encoder",
                        "this library's encoder is nemotron_multimodal")
    if name != "nemotron_multimodal":
        walk.refuse(f"{key}.name" if isinstance(te, dict) else key,
                    f"{name!r}: this library serves NeMo-RL's nemotron_multimodal encoder (generic_sft runs the "
                    "model's HF processor, which this library does not)")
    if isinstance(te, str):
        walk.report[key] = "honoured: task_encoder.name nemotron_multimodal"
    else:
        walk.use(f"{key}.name", "task_encoder.name nemotron_multimodal")
    return name


def _thinking_options(walk: Walk, given: dict, prompt_format: Any) -> dict[str, Any]:
    """The thinking-trace options the user wrote (``given``), for the library's options. An absent
    one is left out, not filled in with NeMo-RL's default: the library's default is the same
    (``normalized``, no relaxed check) for the formats that take them, and a format that takes none
    (``nemotron6``) must not be refused for an option the user never wrote. One the user wrote that
    the format does not take is refused here, by its key as written."""
    p, out = "data.energon.task_encoder.options", {}
    for name in ("thinking_trace_format", "relax_thinking_trace_check"):
        if name not in given:
            continue
        out[name] = walk.use(f"{p}.{name}", f"task_encoder.options.{name}")
        takers = formats_taking(name)
        known = isinstance(prompt_format, str) and prompt_format in PROMPT_FORMATS   # else the library names it
        if known and prompt_format not in takers and given[name] not in (None, False):
            walk.refuse(f"{p}.{name}", f"{given[name]!r}: prompt_format {prompt_format!r} does not take it (formats "
                                       f"that do: {', '.join(takers)}); remove it")
    return out


def encoder_options(walk: Walk, seq_length: int) -> dict[str, Any]:
    """The library's ``task_encoder.options`` (beyond seq_length and the parallel sizes) for the
    config's ``data.energon.task_encoder.options``."""
    _task_encoder_name(walk)
    te = walk.get("data.energon.task_encoder")
    given = (te.get("options") or {}) if isinstance(te, dict) else {}
    p = "data.energon.task_encoder.options"
    unknown = [k for k in given if k not in NEMO_RL_OPTION_DEFAULTS]
    if unknown:
        walk.refuse(f"{p}.{unknown[0]}", f"not an option of NeMo-RL's nemotron_multimodal encoder (options: "
                                         f"{', '.join(NEMO_RL_OPTION_DEFAULTS)})")

    def opt(name: str, target: str) -> Any:
        return walk.use(f"{p}.{name}", target, NEMO_RL_OPTION_DEFAULTS[name])

    augment = {ours: opt(name, f"video.{ours}") for name, ours in _AUGMENT.items()}
    tiling = opt("tiling_augment_prob", "image.tiling_augment_prob (datasets with data_augment, in training)")
    opt("video_decode_thread_count", "accepted, not applied: decode threads change speed, never the data")
    if given.get("packing_sequence_length") not in (None, seq_length):
        walk.refuse(f"{p}.packing_sequence_length", f"{given['packing_sequence_length']} differs from the sequence "
                                                    f"length {seq_length}: one budget truncates and packs here")
    opt("packing_sequence_length", "checked equal to the sequence length")
    patch = opt("patch_dim", "image.patch_size and video.patch_size")
    subsampling = opt("audio_subsampling_factor", "audio.subsampling_layers (log2)")
    audio: dict[str, Any] = {"num_mel_bins": opt("audio_num_mel_bins", "audio.num_mel_bins"),
                             "clip_seconds": float(opt("audio_clip_duration_seconds", "audio.clip_seconds")),
                             "min_clip_seconds": float(opt("min_audio_duration_seconds", "audio.min_clip_seconds")),
                             "max_seconds": float(opt("max_audio_duration_seconds", "audio.max_seconds"))}
    if subsampling is not None:
        if subsampling < 1 or subsampling & (subsampling - 1):
            walk.refuse(f"{p}.audio_subsampling_factor", f"{subsampling} is not a power of two")
        audio["subsampling_layers"] = subsampling.bit_length() - 1
    large = opt("allow_large_videos", f"video.max_duration ({NEMO_RL_MAX_VIDEO_SECONDS:g} s unless true)")
    video = {"patch_size": patch, "temporal_patch": opt("temporal_patch_size", "video.temporal_patch"),
             "min_frames": opt("video_min_num_frames", "video.min_frames"),
             "max_frames": opt("video_max_num_frames", "video.max_frames"),
             "fps": float(opt("video_default_fps", "video.fps")), "sampling": "nemo_rl", **augment,
             "max_duration": NO_VIDEO_CAP if large else NEMO_RL_MAX_VIDEO_SECONDS}
    out: dict[str, Any] = {"prompt_format": opt("prompt_format", "task_encoder.options.prompt_format"),
                           "image": {"patch_size": patch, "tiling_augment_prob": float(tiling)}, "video": video,
                           "audio": audio}
    out.update(_thinking_options(walk, given, out["prompt_format"]))
    env_patch = walk.get("policy.megatron_cfg.env_vars.NRL_MEDIA_PATCH_DIM", None)
    if env_patch is not None and str(env_patch) != str(patch):
        walk.refuse("policy.megatron_cfg.env_vars.NRL_MEDIA_PATCH_DIM", f"{env_patch!r} differs from the "
                                                                       f"encoder's patch_dim {patch}")
    return out
