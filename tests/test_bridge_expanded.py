"""``output: nemotron_omni_expanded`` (Megatron-Bridge main's Nemotron Omni contract): the options that
go with it, checked at start, and the dict it yields. Bridge main's own code on these dicts:
``tests/test_bridge_main.py``."""

from __future__ import annotations


import pytest
import torch
from pydantic import ValidationError
from transformers import AutoTokenizer

from bridge_data import crude, encode, encoder
from conftest import DEMO_TOKENIZER
from energon_nemotron.demo.media import make_audio, make_image, make_video
from energon_nemotron.encoders import NemotronMultimodalOptions
from energon_nemotron.errors import ConfigError, DataError
from energon_nemotron.integrations import BridgeBatchError, to_nemotron_omni_expanded_batch
from energon_nemotron.media import AudioOptions, plan_audio
from energon_nemotron.media.audio import audio_tokens

EXPANDED = "nemotron_omni_expanded"


def options(**kw) -> NemotronMultimodalOptions:
    return NemotronMultimodalOptions(seq_length=4096, prompt_format="nemotron6", **kw)


@pytest.mark.parametrize("kw, match", [
    ({"output": EXPANDED, "contract": "llava_collapse_expand_v1"},
     r"contract 'llava_collapse_expand_v1': output 'nemotron_omni_expanded' makes expanded_sequence_v1 batches; "
     r"a llava_collapse_expand_v1 checkpoint takes output 'nemotron_omni_step'"),
    ({"output": "nemotron_omni_step", "contract": "expanded_sequence_v1"},
     r"a expanded_sequence_v1 checkpoint takes output 'nemotron_omni_expanded'"),
    ({"contract": "expanded_sequence_v1"}, r"but output 'packed_batch' is not a Nemotron Omni step"),
    ({"output": "gpt_step", "contract": "llava_collapse_expand_v1"}, r"output 'gpt_step' is not a Nemotron Omni"),
    ({"contract": "expanded_sequence_v2"}, r"contract"),
    ({"output": EXPANDED, "audio": {"sound_length": "stft"}},
     r"audio.sound_length 'stft': output 'nemotron_omni_expanded' counts audio by 'valid' mel frames"),
    ({"output": "nemotron_omni_step", "audio": {"sound_length": "valid"}},
     r"audio.sound_length 'valid': output 'nemotron_omni_step' counts audio by 'stft'"),
    ({"preset": "nemotron_nano_vl", "output": EXPANDED}, r"serves packed_batch"),
])
def test_contract_and_output_must_agree(kw, match):
    with pytest.raises((ConfigError, ValidationError), match=match):
        options(**kw)


def test_each_omni_output_names_its_contract_and_audio_rule():
    for output, contract, rule in ((EXPANDED, "expanded_sequence_v1", "valid"),
                                   ("nemotron_omni_step", "llava_collapse_expand_v1", "stft")):
        for preset in ("nemotron_omni", "nemotron_omni_temporal"):
            o = options(preset=preset, output=output, contract=contract)
            assert o.audio == {"sound_length": rule}
    assert options(audio={"sound_length": "valid"}).audio == {"sound_length": "valid"}   # packed_batch: either
    assert options().audio == {}


def test_the_expanded_output_refuses_at_start_what_bridge_cannot_take(tmp_path):
    for kw, match in (({"image": {"patch_size": 8}}, r"image\.patch_size = 8: output nemotron_omni_expanded"),
                      ({"image": {"mode": "tiling", "max_tiles": 4}}, r"output nemotron_omni_expanded .* one unit"),
                      ({"mtp_num_layers": 1}, r"output nemotron_omni_expanded is not MTP-safe")):
        with pytest.raises(ConfigError, match=match):
            encoder(tmp_path, output=EXPANDED, **kw)


@pytest.mark.parametrize("frames", [16, 17, 23, 24, 25, 800, 2992, 2999])
def test_valid_sound_length_counts_the_extractor_mask(frames):
    """Bridge main counts a clip of L samples as L // 160 mel frames (the Parakeet mask), the processor
    and Bridge 0.6.2 as 1 + L // 160: the token counts differ exactly where L // 160 is a multiple of 8."""
    samples = frames * 160 + 37
    md = {"duration": samples / 16000, "sample_rate": 16000, "channels": 1}
    stft, valid = plan_audio(md), plan_audio(md, AudioOptions(sound_length="valid"))
    assert stft.frames == (frames + 1,) and valid.frames == (frames,)
    assert stft.frames_per_clip == valid.frames_per_clip == frames + 1       # the extractor's output either way
    assert valid.tokens == (audio_tokens(frames),) and stft.tokens == (audio_tokens(frames + 1),)
    assert (valid.tokens != stft.tokens) == (frames % 8 == 0)
    assert valid.tokens[0] == -(-frames // 8)                                 # three (t + 1) // 2 halvings


def test_the_dict_is_the_row_itself_with_main_s_boundaries(tmp_path):
    enc = encoder(tmp_path, preset="nemotron_omni", output=EXPANDED, contract="expanded_sequence_v1")
    raw = encoder(tmp_path, preset="nemotron_omni", audio={"sound_length": "valid"})   # the PackedBatch of it
    samples = [crude("i1", "<image>\nWhat is it?", jpg=make_image(96, 64, seed=1)),
               crude("a1", "<audio>\nTranscribe.", wav=make_audio(1.6 + 37 / 16000, sample_rate=16000, seed=2))]
    d = enc.batch([enc.pack_selected_samples([encode(enc, s) for s in samples])])
    batch = raw.batch([raw.pack_selected_samples([encode(raw, s) for s in samples])])
    assert len(batch.cu_seqlens[0]) == 3                                    # one row, two segments
    for name in ("tokens", "labels", "loss_mask", "position_ids", "padding_mask"):
        assert torch.equal(d[name], getattr(batch, name)), name          # nothing collapsed
    assert d["tokens"].dtype == d["labels"].dtype == torch.int64 and d["loss_mask"].dtype == torch.float32
    assert d["sample_keys"] == ["i1", "a1"] and d["attention_mask"] is None and "num_image_tiles" not in d
    assert d["imgs_sizes"].tolist() == (batch.media.image_sizes[0] * 16).tolist() and d["num_frames"].tolist() == [1]
    assert d["pixel_values"].shape == (1, int(d["imgs_sizes"][0].prod()) // 256, 768)
    vocab = AutoTokenizer.from_pretrained(str(DEMO_TOKENIZER)).get_vocab()
    image_id, sound_id = vocab["<image>"], vocab["<so_embedding>"]
    assert int((d["tokens"] == image_id).sum()) == int(d["imgs_sizes"][0].prod()) // (32 * 32)
    assert d["sound_length"].tolist() == [160] and d["sound_clips"].shape == (1, 160, 128)   # L // 160, trimmed
    assert int((d["tokens"] == sound_id).sum()) == 20                       # 160 valid frames -> 20 (not 21)
    cu = batch.cu_seqlens[0].to(torch.int32)
    assert torch.equal(d["cu_seqlens_q"], cu) and torch.equal(d["cu_seqlens_kv"], cu)
    assert d["cu_seqlens_q"].dtype == torch.int32
    assert torch.equal(d["cu_seqlens_q_padded"], batch.cu_seqlens_padded[0].to(torch.int32))
    assert d["max_seqlen_q"].dtype == torch.int32 and d["max_seqlen_q"].dim() == 0
    assert int(d["max_seqlen_q"]) == batch.max_seqlen[0] and d["total_tokens"] == 4096


def test_padded_boundaries_are_left_out_where_they_equal_the_real_ones(tmp_path):
    enc = encoder(tmp_path, preset="nemotron_omni")
    a = encode(enc, crude("i1", "<image>\nWhat is it?", jpg=make_image(96, 64, seed=1)))
    batch = enc.batch([a])
    n = int(batch.cu_seqlens[0][-1])
    batch.cu_seqlens_padded[0][-1] = n                          # a row that ends where its last segment ends
    trimmed = type(batch)(**{**batch.__dict__, "tokens": batch.tokens[:, :n], "labels": batch.labels[:, :n],
                             "loss_mask": batch.loss_mask[:, :n], "position_ids": batch.position_ids[:, :n],
                             "padding_mask": batch.padding_mask[:, :n], "max_seqlen": [n]})
    d = to_nemotron_omni_expanded_batch(trimmed)
    assert "cu_seqlens_q_padded" not in d and "cu_seqlens_kv_padded" not in d and d["total_tokens"] == n


def test_the_conversion_names_the_sample_the_model_cannot_take(tmp_path):
    enc = encoder(tmp_path, preset="nemotron_omni")
    image = enc.batch([encode(enc, crude("i1", "<image>\nWhat is it?", jpg=make_image(96, 64)))])
    video = enc.batch([encode(enc, crude("v1", "<video>\nWhat happens?", mp4=make_video(64, 48, seconds=1.0, fps=4)))])
    with pytest.raises(BridgeBatchError, match=r"^i1: positions \d+\.\.\d+ are not all the image placeholder id 0"):
        to_nemotron_omni_expanded_batch(image, image_token_id=0)
    with pytest.raises(BridgeBatchError, match=r"^i1: image units of \[.*\] patches; the temporal embedder"):
        to_nemotron_omni_expanded_batch(image, temporal_patch_dim=2)
    with pytest.raises(BridgeBatchError, match=r"^v1: video needs Bridge's temporal embedder"):
        to_nemotron_omni_expanded_batch(video, temporal_patch_dim=1)
    span = image.media_spans[0][0]
    image.media_spans[0][0] = type(span)(**{**span.__dict__, "runs": ((span.runs[0][0], span.runs[0][1] - 1),)})
    with pytest.raises(BridgeBatchError, match=r"^i1: image of 1 unit\(s\) of .* has \d+ placeholders; Bridge main"):
        to_nemotron_omni_expanded_batch(image)
    with pytest.raises(DataError, match=r"^v1: has video"):
        encode(encoder(tmp_path, preset="nemotron_omni", output=EXPANDED),
               crude("v1", "<video>\nWhat happens?", mp4=make_video(64, 48, seconds=1.0, fps=4)))
