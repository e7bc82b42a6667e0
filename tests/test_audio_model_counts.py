"""Audio placeholders against the code that consumes them: the transformers Nemotron Omni model's
``get_audio_features`` / ``get_placeholder_mask`` and Megatron-Bridge 0.6.2's ``BridgeSoundEncoder``
(real code, tiny random weights) produce exactly as many embeddings as the project puts
``<so_embedding>`` tokens, for clips of many lengths, multi-clip audio and every ``long_audio`` mode."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from transformers import ParakeetEncoder, ParakeetEncoderConfig

from energon_nemotron.media.audio import AudioOptions, audio_metadata, plan_audio, process_audio
from energon_nemotron.media import MediaHandlers
from energon_nemotron.tokenization import TextEncoder
from energon_nemotron.types import MediaRef
from media_corpus import SR, tone_wav
from references.bridge import import_bridge_module

HIDDEN = 32
SECONDS = [0.1, 0.37, 0.64, 1.0, 2.0, 3.2, 7.3, 10.0, 12.8, 29.99, 30.0, 45.0, 61.2]
MODES = ["clips", "whole", "truncate"]


def tiny_config() -> dict:
    return dict(hidden_size=HIDDEN, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                num_mel_bins=128, subsampling_factor=8)


@pytest.fixture(scope="module")
def hf_model():
    torch.manual_seed(0)
    encoder = ParakeetEncoder(ParakeetEncoderConfig(**tiny_config(), subsampling_conv_channels=8,
                                                    max_position_embeddings=8000, scale_input=False)).eval()
    return types.SimpleNamespace(audio_tower=encoder, embed_audio=torch.nn.Linear(HIDDEN, 16))


@pytest.fixture(scope="module")
def bridge_encoder():
    module = import_bridge_module("megatron.bridge.models.nemotron_omni.nemotron_omni_sound")
    torch.manual_seed(0)
    return module.BridgeSoundEncoder(types.SimpleNamespace(**tiny_config())).eval()


@pytest.fixture(scope="module")
def clips():
    """(seconds, mode) -> (plan, features, lengths) of a real WAV, through the project's audio path."""
    out = {}
    for i, seconds in enumerate(SECONDS):
        data = tone_wav(int(round(seconds * SR)), seed=i)
        for mode in MODES:
            options = AudioOptions(long_audio=mode)
            plan = plan_audio(audio_metadata(data), options)
            out[seconds, mode] = (plan, *process_audio(data, plan, options))
    return out


@pytest.mark.omni_reference
@pytest.mark.parametrize("mode", MODES)
def test_transformers_model_embeds_one_vector_per_placeholder(hf_model, clips, mode, demo_tokenizer):
    from transformers.models.nemotron_h_omni.modeling_nemotron_h_omni import NemotronH_Omni_Reasoning_V3 as OmniModel

    handlers = MediaHandlers(demo_tokenizer, TextEncoder(demo_tokenizer), None, None, AudioOptions(long_audio=mode))
    so_embedding = handlers.ids()["<so_embedding>"]
    for seconds in SECONDS:
        plan, features, lengths = clips[seconds, mode]
        # the model's mask is the extractor's: the first L // hop frames, i.e. sound_lengths - 1
        mask = torch.arange(features.shape[1])[None, :] < (lengths - 1)[:, None]
        with torch.no_grad():
            embeds = OmniModel.get_audio_features(hf_model, features, mask).pooler_output
        assert embeds.shape[0] == plan.num_tokens, (seconds, mode)
        data = tone_wav(plan.num_samples, seed=0)
        placeholder = handlers.plan(MediaRef("audio", data, name="a"), 0).placeholder
        ids = torch.tensor([placeholder])
        fake = types.SimpleNamespace(get_input_embeddings=None)
        OmniModel.get_placeholder_mask(fake, ids, torch.zeros(1, ids.shape[1], 16), embeds,
                                                              so_embedding)   # raises on a count mismatch


@pytest.mark.parametrize("mode", MODES)
def test_bridge_sound_encoder_lengths_equal_placeholders(bridge_encoder, clips, mode):
    for seconds in SECONDS:
        plan, features, lengths = clips[seconds, mode]
        with torch.no_grad():
            hidden, emb_lengths = bridge_encoder(features, lengths)
        assert emb_lengths.tolist() == list(plan.tokens), (seconds, mode)
        assert hidden.shape[1] >= max(plan.tokens)


def test_long_audio_modes():
    meta = {"duration": 45.0, "sample_rate": SR, "channels": 1}
    clips_plan = plan_audio(meta, AudioOptions(long_audio="clips"))
    whole = plan_audio(meta, AudioOptions(long_audio="whole"))
    cut = plan_audio(meta, AudioOptions(long_audio="truncate"))
    assert clips_plan.clip_samples == (480000, 240000) and clips_plan.tokens == (376, 188)
    assert whole.clip_samples == (720000,) and whole.frames == (4501,) and whole.tokens == (563,)
    assert cut.clip_samples == (480000,) and cut.tokens == (376,) and cut.truncated == 240000
    short = {"duration": 12.0}
    assert (plan_audio(short, AudioOptions(long_audio="clips")) == plan_audio(short, AudioOptions(long_audio="whole"))
            == plan_audio(short, AudioOptions(long_audio="truncate")))


def test_whole_mode_features_equal_the_extractor_on_the_whole_item():
    """``whole`` normalises over the whole item, as the processor does (one extractor call)."""
    from transformers import ParakeetFeatureExtractor

    data = tone_wav(45 * SR, seed=3)
    options = AudioOptions(long_audio="whole")
    plan = plan_audio(audio_metadata(data), options)
    features, lengths = process_audio(data, plan, options)
    wave = np.frombuffer(data[44:], dtype="<i2").astype(np.float32) / 32768.0
    ref = ParakeetFeatureExtractor(feature_size=128, sampling_rate=SR, hop_length=160)(
        wave, sampling_rate=SR, return_tensors="pt")["input_features"][0]
    assert features.shape == (1, 4501, 128) and lengths.tolist() == [4501] == [ref.shape[0]]
    torch.testing.assert_close(features[0], ref, atol=1e-4, rtol=0)


def test_truncation_is_counted_in_telemetry(demo_tokenizer):
    handlers = MediaHandlers(demo_tokenizer, TextEncoder(demo_tokenizer), None, None,
                             AudioOptions(long_audio="truncate"))
    for seconds in (10.0, 31.0, 40.0):
        ref = MediaRef("audio", tone_wav(int(seconds * SR), seed=1), name="a")
        handlers.process(ref, handlers.plan(ref, 0))
    assert handlers.decodes.totals() == {"audio": 3, "audio_truncated": 2}
