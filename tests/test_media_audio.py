"""Audio path for Nemotron 3 Nano Omni: token rule, header-only planning, decode/resample and Parakeet
features (``energon_nemotron.media.audio``)."""

from __future__ import annotations

import io
import math
import wave

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from energon_nemotron.demo.media import make_audio, make_video
from energon_nemotron.errors import MediaError
from energon_nemotron.media.audio import (
    AudioOptions,
    AudioPlan,
    _extractor,
    audio_metadata,
    audio_tokens,
    decode_audio,
    plan_audio,
    process_audio,
)

SR = 16000


# ---------------------------------------------------------------------------------------------
# Helpers written for the tests
# ---------------------------------------------------------------------------------------------
def conv_out(length: int, kernel: int = 3, stride: int = 2, pad: int = 1) -> int:
    """Output length of a 1-D convolution, the textbook formula."""
    return math.floor((length + 2 * pad - kernel) / stride) + 1


def ref_tokens(n_samples: int, hop: int = 160) -> int:
    """Physical STFT frames ``1 + L // hop`` (center-padded), three stride-2 convs, min 1: the count
    of the Omni processor, the transformers model and Megatron-Bridge's collate."""
    frames = 1 + n_samples // hop
    for _ in range(3):
        frames = conv_out(frames)
    return max(1, frames)


def ref_clips(n_samples: int, sr: int = SR, clip_s: float = 30, tail_s: float = 0.1) -> list[int]:
    """vLLM ``ParakeetExtractor`` clip sizes (notes Appendix A ``vllm_clip_tokens``) for items of at
    least ``tail_s``; a shorter item is one clip of its own samples, as the processor takes it (vLLM
    pads it to ``tail_s``)."""
    clip, tail = int(round(clip_s * sr)), int(round(tail_s * sr))
    if n_samples < tail:
        return [n_samples]
    full, rem = divmod(n_samples, clip)
    return [clip] * full + ([max(rem, tail)] if rem else [])


def wav_bytes(channels: np.ndarray, rate: int, width: int = 2) -> bytes:
    """PCM WAV (stdlib ``wave``; ``width`` 1: u8, 2: s16, 4: s32) of float ``channels`` ``[C, n]``."""
    full = 2.0 ** (8 * width - 1)
    pcm = np.clip(np.round(channels.T * full), -full, full - 1)
    pcm = (pcm + 128).astype("u1") if width == 1 else pcm.astype(f"<i{width}")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels.shape[0])
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return buf.getvalue()


def tone(freq: float, seconds: float, rate: int, amp: float = 0.4) -> np.ndarray:
    t = np.arange(int(round(seconds * rate))) / rate
    return amp * np.sin(2 * np.pi * freq * t)


def peak_hz(x: np.ndarray, rate: int) -> float:
    spec = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.fft.rfftfreq(len(x), 1 / rate)[np.argmax(spec)])


# ---------------------------------------------------------------------------------------------
# Token rule
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seconds, tokens", [(1, 13), (10, 126), (30, 376), (60, 752), (1200, 15040)])
def test_tokens_match_the_notes(seconds, tokens):
    plan = plan_audio({"duration": seconds, "sample_rate": SR, "channels": 1})
    assert plan.num_tokens == tokens
    assert plan.num_clips == math.ceil(seconds / 30)
    if seconds <= 30:
        assert audio_tokens(1 + seconds * SR // 160) == tokens


def test_audio_tokens_small_values():
    assert [audio_tokens(n) for n in range(10)] == [1, 1, 1, 1, 1, 1, 1, 1, 1, 2]
    assert audio_tokens(16) == 2 and audio_tokens(17) == 3
    assert audio_tokens(100, layers=0) == 100 and audio_tokens(100, layers=1) == 50
    with pytest.raises(ValueError):
        audio_tokens(-1)


def test_audio_tokens_exhaustive_against_the_conv_formula():
    for frames in range(0, 20000):
        expected = frames
        for _ in range(3):
            expected = conv_out(expected)
        assert audio_tokens(frames) == max(1, expected)


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=SR * 1800))
def test_audio_tokens_property(n_samples):
    assert audio_tokens(1 + n_samples // 160) == ref_tokens(n_samples)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=320, max_value=SR * 1800))
def test_plan_matches_the_vllm_clip_rule(n_samples):
    plan = plan_audio({"duration": n_samples / SR, "sample_rate": SR, "channels": 1})
    assert plan.num_samples == n_samples
    assert list(plan.clip_samples) == ref_clips(n_samples)
    assert list(plan.frames) == [1 + s // 160 for s in plan.clip_samples]
    assert plan.num_tokens == sum(ref_tokens(s) for s in ref_clips(n_samples))


@pytest.mark.omni_reference
def test_tokens_equal_the_processor_for_every_clip_length():
    """Every length 0.1 s - 30 s: our plan's tokens equal the Omni processor's own
    ``_estimate_audio_num_embeddings`` (the transformers code, run on its defaults)."""
    import types

    from transformers.models.nemotron_h_omni.processing_nemotron_h_omni import NemotronH_Omni_Reasoning_V3Processor

    proc = types.SimpleNamespace(audio_hop_length=160, audio_subsampling_factor=8)
    estimate = NemotronH_Omni_Reasoning_V3Processor._estimate_audio_num_embeddings
    for n in range(1600, 30 * SR + 1):
        plan = plan_audio({"duration": n / SR})
        assert plan.num_samples == n and plan.tokens == (max(1, estimate(proc, n)),), n
    assert plan_audio({"duration": 10.0}).tokens == (126,) and plan_audio({"duration": 30.0}).tokens == (376,)


# ---------------------------------------------------------------------------------------------
# Metadata and plans
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("container, rate, channels, meta_rate", [
    ("wav", 22050, 2, 22050), ("flac", 44100, 2, 44100), ("mp3", 22050, 2, 22050),
    ("mp3", 44100, 1, 44100), ("ogg", 48000, 2, 48000),
    ("ogg", 16000, 1, 16000),    # libsndfile decodes Opus at the input rate its header records
])
def test_metadata_from_headers(container, rate, channels, meta_rate):
    data = make_audio(1.5, rate, channels, 0, container)
    meta = audio_metadata(data)
    assert meta["sample_rate"] == meta_rate and meta["channels"] == channels
    assert abs(meta["duration"] - 1.5) <= AudioOptions().tolerance_seconds
    n = decode_audio(data).shape[0]
    assert abs(n - plan_audio(meta).num_samples) <= AudioOptions().tolerance_seconds * SR


def test_metadata_of_mp4_with_video_and_aac(tmp_path):
    data = make_video(seconds=2.0, with_audio=True)
    meta = audio_metadata(data)
    assert meta["sample_rate"] == 16000 and meta["channels"] >= 1 and meta["duration"] == pytest.approx(2.0)
    path = tmp_path / "clip.mp4"
    path.write_bytes(data)
    assert audio_metadata(path) == meta and audio_metadata(str(path)) == meta
    features, lengths = process_audio(path, plan_audio(meta))     # AAC tail padding within tolerance
    assert features.shape == (1, 201, 128) and lengths.tolist() == [201]


def test_mp4_aac_tail_padding_is_cut_to_the_header_duration():
    # 16 kHz AAC frames are 1024 samples (64 ms) and FFmpeg does not trim the last frame's padding:
    # 2.5 s decodes to 2.56 s, over the default 0.05 s tolerance; the decoder cuts it to the MP4's duration
    data = make_video(seconds=2.5, with_audio=True)
    plan = plan_audio(audio_metadata(data))
    assert decode_audio(data).shape[0] == plan.num_samples == 40000
    features, lengths = process_audio(data, plan)
    assert lengths.tolist() == [251] and features.shape == (1, 251, 128)


def test_adts_duration_from_packets():
    # Raw ADTS has no duration header (FFmpeg guesses from the bitrate: 7.57 s here); packets are summed.
    import av

    from energon_nemotron.demo.media import _write_audio

    buf = io.BytesIO()
    with av.open(buf, mode="w", format="adts") as out:
        stream = out.add_stream("aac", rate=44100)
        stream.layout = "stereo"
        _write_audio(out, stream, 7.3, 44100, 2, 0)
    data = buf.getvalue()
    meta = audio_metadata(memoryview(data))
    assert meta["sample_rate"] == 44100 and meta["channels"] == 2
    assert meta["duration"] == pytest.approx(316 * 1024 / 44100)      # 316 AAC frames
    assert abs(decode_audio(data).shape[0] - plan_audio(meta).num_samples) <= 1


def test_incomplete_quick_probe_falls_back_to_the_full_probe(monkeypatch):
    import energon_nemotron.media.audio_decode as audio_mod

    data = make_video(seconds=1.0, container="mpegts", with_audio=True)
    calls = []
    real_open = audio_mod._open_once
    monkeypatch.setattr(audio_mod, "_FAST_PROBE", {"probesize": "32"})   # too small for MPEG-TS audio
    monkeypatch.setattr(audio_mod, "_open_once", lambda d, o: calls.append(o) or real_open(d, o))
    meta = audio_metadata(data)
    assert calls == [{"probesize": "32"}, None]
    assert meta["sample_rate"] == 16000 and meta["channels"] >= 1


def test_plan_clip_split():
    plan = plan_audio({"duration": 65.0, "sample_rate": 44100, "channels": 2})
    assert isinstance(plan, AudioPlan)
    assert plan.num_samples == 65 * SR and plan.num_clips == 3
    assert plan.clip_samples == (480000, 480000, 80000)
    assert plan.frames == (3001, 3001, 501)
    assert plan.tokens == (376, 376, 63) and plan.num_tokens == 815
    assert plan.frames_per_clip == 3001
    assert (plan.source_sample_rate, plan.channels, plan.duration) == (44100, 2, 65.0)

    tail = plan_audio({"duration": 30.05, "sample_rate": SR, "channels": 1})
    assert tail.num_samples == 480800
    assert tail.clip_samples == (480000, 1600)          # the 0.05 s remainder padded to 0.1 s
    assert tail.frames == (3001, 11) and tail.tokens == (376, 2)

    assert plan_audio({"duration": 30.0}).clip_samples == (480000,)
    assert plan_audio({"duration": 0.05}).clip_samples == (800,)   # a short item is one clip of its samples
    assert plan_audio({"duration": 0.05}).tokens == (1,)
    assert plan_audio({"duration": 0.02}).clip_samples == (320,)


@pytest.mark.parametrize("n", [1, 100, 160, 319])
def test_audio_under_two_hops_is_audio_too_short(n):
    """Under 320 samples the extractor's per-feature normalisation has one frame (the processor's
    features are NaN): a per-sample error with its own reason code."""
    with pytest.raises(MediaError, match="under the 320 samples") as e:
        plan_audio({"duration": n / SR, "sample_rate": SR, "channels": 1})
    assert e.value.code == "audio_too_short"


@pytest.mark.parametrize("bad", [dict(sample_rate=0), dict(min_clip_seconds=40.0), dict(min_clip_seconds=0.0),
                                 dict(tolerance_seconds=-1.0), dict(max_seconds=0.0), dict(hop_length=-160)])
def test_bad_options(bad):
    from energon_nemotron.errors import ConfigError

    with pytest.raises(ConfigError):
        AudioOptions(**bad)


def test_a_hop_longer_than_half_the_shortest_clip_is_refused_at_start():
    """``hop_length: 100000`` used to pass the option check and fail every sample (fewer than two mel
    frames); now the option itself is refused, naming the limit."""
    from energon_nemotron.errors import ConfigError

    with pytest.raises(ConfigError, match=r"audio\.hop_length 100000: the shortest clip \(1600 samples.*at most 800"):
        AudioOptions(hop_length=100000)
    assert AudioOptions(hop_length=800).hop_length == 800


def test_plan_options():
    opts = AudioOptions(clip_seconds=10.0, min_clip_seconds=0.5)
    plan = plan_audio({"duration": 20.2}, opts)
    assert plan.clip_samples == (160000, 160000, 8000) and plan.frames_per_clip == 1001


# ---------------------------------------------------------------------------------------------
# Decode and resample
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rate", [22050, 44100, 48000])
def test_decode_stereo_to_mono_16k(rate):
    seconds, freq = 1.3, 1000.0
    left = tone(freq, seconds, rate, amp=0.4)
    data = wav_bytes(np.stack([left, np.zeros_like(left)]), rate)   # mean -> amplitude 0.2
    out = decode_audio(data)
    assert out.dtype == np.float32 and out.ndim == 1
    assert abs(out.shape[0] - round(seconds * SR)) <= 1
    mid = out[1600:-1600]
    assert abs(peak_hz(mid, SR) - freq) <= SR / len(mid)
    assert np.abs(mid).max() == pytest.approx(0.2, abs=0.01)      # channel mean, not FFmpeg's 0.707 downmix


@pytest.mark.parametrize("container, rate", [("flac", 44100), ("mp3", 44100), ("ogg", 48000), ("wav", 16000)])
def test_decode_compressed(container, rate):
    data = make_audio(1.0, rate, 2, 3, container)
    out = decode_audio(data)
    assert out.dtype == np.float32 and abs(out.shape[0] - SR) <= 0.05 * SR
    assert 0.05 < np.abs(out).max() < 1.0


@pytest.mark.parametrize("channels", range(1, 10))
def test_channel_mean_is_numpys_mean_bit_for_bit(channels):
    """The processor's down-mix is ``frames.T.mean(axis=0)`` on float32; the faster column sum gives
    the same bits (numpy sums up to 7 rows in order; from 8 on its pairwise sum is used)."""
    from energon_nemotron.media.audio_decode import channel_mean

    rng = np.random.default_rng(channels)
    frames = (rng.standard_normal((50021, channels)) * 0.3).astype(np.float32)
    frames[::5] *= np.float32(1e-30)                        # subnormal-range values too
    want = frames.T.mean(axis=0) if channels > 1 else frames[:, 0]
    got = channel_mean(frames)
    assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("width, channels", [(1, 1), (1, 3), (2, 1), (4, 1), (4, 2)])
def test_decode_16k_is_the_channel_mean_up_to_pcm_rounding(width, channels):
    x = np.stack([tone(440.0 * (c + 1), 0.5, SR, amp=0.5 / (c + 1)) for c in range(channels)])
    out = decode_audio(wav_bytes(x, SR, width))
    assert out.shape == x.shape[1:]
    assert np.abs(out - x.mean(axis=0)).max() < (1.5 / 128 if width == 1 else 1e-4)


# ---------------------------------------------------------------------------------------------
# Features: equality with ParakeetFeatureExtractor
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def extractor():
    from transformers import ParakeetFeatureExtractor

    return ParakeetFeatureExtractor(feature_size=128)


def _direct(extractor, clip: np.ndarray, **kw):
    out = extractor(clip, sampling_rate=SR, return_attention_mask=True, return_tensors="pt", **kw)
    return out["input_features"][0], out["attention_mask"][0]


def test_features_equal_parakeet_extractor_31s(extractor):
    rng = np.random.default_rng(0)
    x = tone(300.0, 31.0, SR, 0.3) + tone(1700.0, 31.0, SR, 0.1) + rng.normal(0, 0.01, 31 * SR)
    data = wav_bytes(x[None], SR)
    plan = plan_audio(audio_metadata(data))
    assert plan.clip_samples == (480000, 16000) and plan.frames == (3001, 101)
    features, lengths = process_audio(data, plan)
    assert features.dtype == torch.float32 and features.shape == (2, 3001, 128)
    assert lengths.dtype == torch.int64 and lengths.tolist() == [3001, 101]

    wave16 = decode_audio(data)
    assert wave16.shape[0] == plan.num_samples
    clips = [wave16[:480000], wave16[480000:]]
    for i, clip in enumerate(clips):
        ref, mask = _direct(extractor, clip)
        valid = int(mask.sum())
        assert valid + 1 == plan.frames[i] == int(lengths[i]) == ref.shape[0]
        assert plan.tokens[i] == audio_tokens(valid + 1)
        torch.testing.assert_close(features[i, :ref.shape[0]], ref, atol=1e-5, rtol=0)
        assert not features[i, valid:].any()
    # Padding the tail clip inside the extractor to a full clip gives the same F-frame tensor, up to
    # FFT rounding (a longer torch.stft input moves quiet low mel bins by about 1e-5).
    padded, mask = _direct(extractor, clips[1], padding="max_length", max_length=480000)
    assert padded.shape == (3001, 128) and int(mask.sum()) == 100
    torch.testing.assert_close(features[1], padded, atol=1e-4, rtol=0)


def test_features_of_stereo_44k_with_padded_tail(extractor):
    # 30.05 s at 44.1 kHz stereo: the 0.05 s tail becomes a 0.1 s clip (zero-padded) of 10 frames.
    x = tone(500.0, 30.05, 44100, 0.3)
    data = wav_bytes(np.stack([x, 0.5 * x]), 44100)
    plan = plan_audio(audio_metadata(data))
    assert plan.clip_samples == (480000, 1600) and plan.tokens == (376, 2)
    features, lengths = process_audio(data, plan)
    assert lengths.tolist() == [3001, 11]
    tail = np.zeros(1600, np.float32)
    tail[:800] = decode_audio(data)[480000:480800]
    ref, mask = _direct(extractor, tail)
    assert int(mask.sum()) == 10
    torch.testing.assert_close(features[1, :ref.shape[0]], ref, atol=1e-5, rtol=0)


def test_tolerance_trims_and_pads(extractor):
    x = tone(700.0, 1.5, SR, 0.3)
    data = wav_bytes(x[None], SR)
    longer = plan_audio({"duration": 1.53})        # 0.03 s over: zero-padded
    shorter = plan_audio({"duration": 1.47})       # 0.03 s under: trimmed
    for plan in (longer, shorter):
        features, lengths = process_audio(data, plan)
        assert lengths.tolist() == [1 + plan.num_samples // 160]
        clip = np.zeros(plan.num_samples, np.float32)
        clip[:min(24000, plan.num_samples)] = decode_audio(data)[:plan.num_samples]
        ref, _ = _direct(extractor, clip)
        torch.testing.assert_close(features[0, :ref.shape[0]], ref, atol=1e-5, rtol=0)


def test_extractor_is_cached():
    assert _extractor(AudioOptions()) is _extractor(AudioOptions())
    assert _extractor(AudioOptions(max_seconds=60.0)) is _extractor(AudioOptions())
    assert _extractor(AudioOptions(num_mel_bins=80)) is not _extractor(AudioOptions())


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------
def test_mismatch_beyond_tolerance():
    data = make_audio(1.5, 22050, 2, 0, "wav")
    for duration in (2.0, 1.4):
        with pytest.raises(MediaError, match="metadata says .* but the audio decodes to 1.500 s"):
            process_audio(data, plan_audio({"duration": duration}))


def test_zero_length_wav():
    empty = wav_bytes(np.zeros((1, 0)), SR)
    for data in (empty, make_audio(0.0, 22050, 2, 0, "wav")):
        with pytest.raises(MediaError):
            audio_metadata(data)
        with pytest.raises(MediaError):
            decode_audio(data)


@pytest.mark.parametrize("data", [b"", b"not an audio file" * 50, make_audio(1.0, 22050, 1, 0, "mp3")[:40]])
def test_corrupt_bytes(data):
    with pytest.raises(MediaError):
        audio_metadata(data)
    with pytest.raises(MediaError):
        process_audio(data, plan_audio({"duration": 1.0}))


def test_missing_file_and_no_audio_stream(tmp_path):
    with pytest.raises(MediaError):
        audio_metadata(tmp_path / "missing.wav")
    with pytest.raises(MediaError, match="no audio stream"):
        audio_metadata(make_video(seconds=0.5))
    with pytest.raises(MediaError, match="no audio stream"):
        decode_audio(make_video(seconds=0.5))


def test_too_long_or_empty_plan():
    with pytest.raises(MediaError, match="over the 1800 s limit"):
        plan_audio({"duration": 1800.5, "sample_rate": SR, "channels": 1})
    assert plan_audio({"duration": 1800.0}).num_clips == 60
    meta = audio_metadata(make_audio(1.5, 16000, 1, 0, "wav"))
    with pytest.raises(MediaError):
        plan_audio(meta, AudioOptions(max_seconds=1.0))
    for bad in (0.0, -1.0, float("nan"), float("inf"), 1e-6):
        with pytest.raises(MediaError):
            plan_audio({"duration": bad})
