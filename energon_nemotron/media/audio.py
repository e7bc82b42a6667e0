"""Audio for Nemotron 3 Nano Omni: plan from metadata, decode to 16 kHz mono, Parakeet log-mel features.

Plan (pre-encode, headers only): :func:`audio_metadata` + :func:`plan_audio` give the sample count,
the clips (``AudioOptions.long_audio``) and the tokens per clip. Process (post-encode):
:func:`process_audio` decodes (:func:`decode_audio`, in :mod:`~energon_nemotron.media.audio_decode`:
as the processor's ``load_audio``), forces the planned length, splits into the clips and runs
``transformers.ParakeetFeatureExtractor`` (per-clip, per-feature normalised log-mel).

Token rule, as the Omni processor (``_estimate_audio_num_embeddings``), the transformers model
(``get_audio_features``: ``subsample(mask.sum() + 1)``) and Megatron-Bridge (``sound_length =
mel.shape[0]``, ``subsample(sound_length)``) all count: a clip of ``L`` samples has ``1 + L // hop``
mel frames (the center-padded STFT; the extractor's attention mask covers the first ``L // hop``,
the last frame is zero), then the FastConformer 8x subsampling (three stride-2 convs, kernel 3,
pad 1): ``n <- (n - 1) // 2 + 1`` three times. 10 s: 1001 frames, 126 tokens.

Short audio: an item of fewer than two hops (320 samples, 20 ms) is refused (``audio_too_short``: the
extractor's per-feature normalisation has nothing to normalise and the processor's features are NaN);
any longer item up to ``clip_seconds`` is one clip of exactly its samples, the processor's input.

Long audio (``long_audio``): ``clips`` splits into ``clip_seconds`` clips (the last one of a split
zero-padded to ``min_clip_seconds``), each featurised and normalised on its own; ``whole`` keeps one clip however
long (the processor's behaviour: one extractor call, normalised over the whole item); ``truncate``
keeps the first ``clip_seconds`` (Megatron-Bridge's ``max_audio_duration``) and drops the rest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

from energon_nemotron.errors import ConfigError, MediaError
from energon_nemotron.media.audio_decode import AudioSource, audio_metadata, decode_audio

__all__ = ["AudioOptions", "AudioPlan", "AudioSource", "audio_metadata", "audio_tokens", "decode_audio",
           "planned_samples", "plan_audio", "process_audio"]
_GROUP = 4                  # clips per feature-extractor call (bounds the STFT's memory)


@dataclass(frozen=True)
class AudioOptions:
    """Audio preprocessing settings (defaults: Nemotron 3 Nano Omni / Parakeet-TDT-0.6B-v2)."""

    sample_rate: int = 16000
    clip_seconds: float = 30.0
    min_clip_seconds: float = 0.1      # the last clip of a split (long_audio: clips) is zero-padded to this
    max_seconds: float = 1800.0        # longer -> MediaError
    num_mel_bins: int = 128
    hop_length: int = 160
    # Parakeet 8x = three stride-2 convs (kernel 3, pad 1); ``min``: the loader config accepts 0
    subsampling_layers: int = field(default=3, metadata={"min": 0})
    # allowed |decoded - metadata| length; then trimmed/zero-padded
    tolerance_seconds: float = field(default=0.05, metadata={"min": 0})
    long_audio: Literal["clips", "whole", "truncate"] = "clips"   # audio over clip_seconds (module docs)
    # a clip's sound_length and token count: ``stft`` 1 + n // hop frames (the processor, transformers'
    # model, Bridge 0.6.2), ``valid`` n // hop (the extractor's mask: Bridge main's NemotronOmniModel)
    sound_length: Literal["stft", "valid"] = "stft"

    def __post_init__(self) -> None:
        if (min(self.sample_rate, self.hop_length, self.num_mel_bins, self.max_seconds) <= 0
                or not 0 < self.min_clip_seconds <= self.clip_seconds
                or self.subsampling_layers < 0 or self.tolerance_seconds < 0):
            raise ConfigError(f"invalid audio options: {self}")
        if self.long_audio not in ("clips", "whole", "truncate"):
            raise ConfigError(f"audio long_audio must be 'clips', 'whole' or 'truncate', not {self.long_audio!r}")
        if self.sound_length not in ("stft", "valid"):
            raise ConfigError(f"audio sound_length must be 'stft' or 'valid', not {self.sound_length!r}")
        if self.min_clip_length // self.hop_length < 2:      # else every sample fails: fewer than 2 mel frames
            raise ConfigError(f"audio.hop_length {self.hop_length}: the shortest clip ({self.min_clip_length} samples, "
                              f"min_clip_seconds {self.min_clip_seconds} at {self.sample_rate} Hz) would have fewer "
                              f"than 2 mel frames; hop_length must be at most {self.min_clip_length // 2}")

    @property
    def clip_length(self) -> int:      # samples of a full clip (480000)
        return int(round(self.clip_seconds * self.sample_rate))

    @property
    def min_clip_length(self) -> int:  # minimum samples of the last clip of a split (1600)
        return int(round(self.min_clip_seconds * self.sample_rate))


@dataclass(frozen=True)
class AudioPlan:
    """What one audio item becomes, decided from metadata only.

    ``num_samples`` (:func:`planned_samples`) is the length of the decoded waveform.
    ``clip_samples``: the samples of each clip (``long_audio``: ``clips`` — ``clip_length`` each, the
    remainder as the last clip, zero-padded to ``min_clip_length`` when it follows a full clip;
    ``whole`` — one clip of all samples; ``truncate`` — one clip of at most ``clip_length``).
    ``frames``: the mel frames each clip counts as, its ``sound_length`` (``options.sound_length``:
    ``stft`` ``1 + n // hop_length``, the processor's, transformers' model's and Megatron-Bridge
    0.6.2's; ``valid`` ``n // hop_length``, the extractor's attention mask, which Bridge main's model
    counts); ``tokens``: their 8x subsampling.
    ``frames_per_clip``: the frame axis ``F`` of the feature tensor (``1 + n // hop_length`` of the
    longest clip, the extractor's output either way).
    ``truncated``: samples dropped by ``truncate``.
    """

    duration: float
    source_sample_rate: int
    channels: int
    num_samples: int
    clip_samples: tuple[int, ...]
    frames: tuple[int, ...]
    tokens: tuple[int, ...]
    frames_per_clip: int
    truncated: int = 0

    @property
    def num_clips(self) -> int:
        return len(self.clip_samples)

    @property
    def num_tokens(self) -> int:       # audio placeholder tokens of the item (sum over clips)
        return sum(self.tokens)


def audio_tokens(frames: int, layers: int = 3) -> int:
    """Encoder output length for ``frames`` mel frames (``1 + L // hop`` of a clip of ``L``
    samples): ``n <- (n - 1) // 2 + 1`` ``layers`` times (stride-2 conv, kernel 3, padding 1), at
    least 1."""
    if frames < 0:
        raise ValueError(f"frames must be >= 0, got {frames}")
    n = int(frames)
    for _ in range(layers):
        n = (n - 1) // 2 + 1
    return max(1, n)


def planned_samples(metadata: dict, rate: int) -> int:
    """Samples of the item at ``rate``: with ``frames`` (the source's exact count, as
    :func:`audio_metadata` gives where libsndfile reads the file) the processor's ``load_audio`` length,
    ``frames`` at the same rate, else ``ceil(frames * rate / sample_rate)``; without it
    ``round(duration * rate)`` (Python ``round``)."""
    frames, source = metadata.get("frames"), metadata.get("sample_rate")
    if frames is not None and source:
        frames, source = int(frames), int(source)
        return frames if source == rate else math.ceil(frames * rate / source)
    return int(round(float(metadata["duration"]) * rate))


def plan_audio(metadata: dict, options: AudioOptions = AudioOptions()) -> AudioPlan:
    """The :class:`AudioPlan` for ``metadata`` (as from :func:`audio_metadata`); no decoding.

    Raises :class:`MediaError` for an empty item, one longer than ``options.max_seconds``
    (``media_too_large``) or one under two hops (320 samples at 16 kHz: ``audio_too_short``, where the
    extractor's per-feature normalisation has no variance and the processor's features are NaN).
    """
    duration = float(metadata["duration"])
    if not math.isfinite(duration) or duration <= 0:
        raise MediaError(f"audio duration {duration} s is empty or invalid")
    if duration > options.max_seconds:
        raise MediaError(f"audio is {duration:.2f} s, over the {options.max_seconds:g} s limit",
                         code="media_too_large")
    num_samples = planned_samples(metadata, options.sample_rate)
    if num_samples < 2 * options.hop_length:
        raise MediaError(f"audio is {num_samples} samples ({num_samples / options.sample_rate:.4f} s) at "
                         f"{options.sample_rate} Hz, under the {2 * options.hop_length} samples (2 mel frames) the "
                         "feature extractor needs", code="audio_too_short")
    clip, tail = options.clip_length, options.min_clip_length
    if options.long_audio == "clips":
        full, rem = divmod(num_samples, clip)
        sizes = [clip] * full + ([max(rem, tail) if full else rem] if rem else [])
    else:
        sizes = [min(num_samples, clip) if options.long_audio == "truncate" else num_samples]
    if min(sizes) // options.hop_length < 2:     # per-feature normalisation needs two frames (sample std)
        raise MediaError(f"a clip of {min(sizes)} samples has fewer than 2 mel frames")
    stft = int(options.sound_length == "stft")
    frames = tuple(stft + s // options.hop_length for s in sizes)
    return AudioPlan(duration=duration, source_sample_rate=int(metadata.get("sample_rate", 0)),
                     channels=int(metadata.get("channels", 0)), num_samples=num_samples, clip_samples=tuple(sizes),
                     frames=frames, tokens=tuple(audio_tokens(f, options.subsampling_layers) for f in frames),
                     frames_per_clip=1 + max(sizes) // options.hop_length, truncated=max(0, num_samples - sum(sizes)))


_EXTRACTORS: dict = {}     # (mel bins, sample rate, hop) -> ParakeetFeatureExtractor, one per process


def _extractor(options: AudioOptions):
    """The cached ``ParakeetFeatureExtractor`` for these options (``setdefault``: one instance even
    when two threads build it at once)."""
    key = (options.num_mel_bins, options.sample_rate, options.hop_length)
    ex = _EXTRACTORS.get(key)
    if ex is None:
        import transformers
        from transformers import ParakeetFeatureExtractor

        try:
            made = ParakeetFeatureExtractor(feature_size=options.num_mel_bins, sampling_rate=options.sample_rate,
                                            hop_length=options.hop_length)
        except ImportError as e:   # an environment fault, never a sample's: Energon stops on it
            raise ImportError(f"transformers {transformers.__version__}'s ParakeetFeatureExtractor needs librosa "
                              "(newer releases do not): pip install 'energon-nemotron[librosa]'") from e
        ex = _EXTRACTORS.setdefault(key, made)
    return ex


def process_audio(data: AudioSource, plan: AudioPlan,
                  options: AudioOptions = AudioOptions()) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode ``data`` and compute the Parakeet features of every planned clip.

    Returns ``features`` float32 ``[num_clips, F, num_mel_bins]`` (``F = plan.frames_per_clip``; a
    clip's ``1 + n // hop`` frames as the extractor returns them, the last one zero, then zero
    padding) and ``lengths`` int64 ``[num_clips]`` (``plan.frames``: ``1 + n // hop``, or ``n // hop``
    with ``options.sound_length`` ``valid``). The waveform is trimmed /
    zero-padded to ``plan.num_samples`` (a difference over ``options.tolerance_seconds`` raises
    :class:`MediaError`), then cut to the clips (``truncate`` drops what follows the first). Each clip
    is featurised as the extractor does it for that clip alone (equal-sized clips batched).
    """
    wave = decode_audio(data, options)
    sr = options.sample_rate
    if abs(wave.shape[0] - plan.num_samples) > options.tolerance_seconds * sr + 1e-6:
        raise MediaError(f"metadata says {plan.num_samples / sr:.3f} s but the audio decodes to "
                         f"{wave.shape[0] / sr:.3f} s")
    total = sum(plan.clip_samples)
    padded = np.zeros(total, dtype=np.float32)
    keep = min(wave.shape[0], plan.num_samples, total)
    padded[:keep] = wave[:keep]
    starts = np.cumsum((0,) + plan.clip_samples[:-1])
    clips = [padded[s:s + n] for s, n in zip(starts, plan.clip_samples)]

    features = torch.zeros(plan.num_clips, plan.frames_per_clip, options.num_mel_bins, dtype=torch.float32)
    ex = _extractor(options)
    by_size: dict[int, list[int]] = {}
    for i, n in enumerate(plan.clip_samples):
        by_size.setdefault(n, []).append(i)
    for idx in by_size.values():
        for g in range(0, len(idx), _GROUP):
            group = idx[g:g + _GROUP]
            out = ex([clips[i] for i in group], sampling_rate=sr, padding="longest",
                     return_attention_mask=True, return_tensors="pt")
            feats = out["input_features"]
            got = [feats.shape[1]] * len(group), [v + 1 for v in out["attention_mask"].sum(-1).tolist()]
            want = [1 + plan.clip_samples[i] // options.hop_length for i in group]
            if got != (want, want):
                raise AssertionError(f"extractor gives {got[0]} frames ({got[1]} with its mask), the plan says {want}")
            features[group, :feats.shape[1]] = feats.to(torch.float32)
    return features, torch.tensor(plan.frames, dtype=torch.int64)
