"""Model presets, the ``output`` option and the conversion's refusals (what Bridge's model cannot take)."""

from __future__ import annotations


import pytest
import torch
from pydantic import ValidationError

from bridge_data import crude, encode, encoder
from energon_data import loader_yaml
from energon_nemotron.demo.media import make_image, make_video
from energon_nemotron.encoders import NemotronMultimodalOptions
from energon_nemotron.errors import ConfigError, DataError
from energon_nemotron.integrations import BridgeBatchError, to_gpt_step_batch, to_nemotron_omni_step_batch
from energon_nemotron.loading import build_task_encoder, build_train_loader
from energon_nemotron.media import plan_image
from energon_nemotron.registry import MODEL_PRESETS


def options(**kw) -> NemotronMultimodalOptions:
    return NemotronMultimodalOptions(seq_length=4096, prompt_format="nemotron6", **kw)


def test_presets_set_the_layout_their_model_needs():
    assert MODEL_PRESETS.names() == ["nemotron_nano_vl", "nemotron_omni", "nemotron_omni_temporal"]
    t = options(preset="nemotron_omni_temporal", video={"fps": 1.0})
    assert t.image == {"mode": "tiling", "tile_size": 512, "max_tiles": 1, "use_thumbnail": False,
                       "patch_size": 16, "downsample": 2}
    assert t.video["fps"] == 1.0 and t.video["maintain_aspect_ratio"] is False and t.video["target_patches"] == 1024
    assert t.temporal_patch_dim == 2
    assert options(preset="nemotron_omni").image["mode"] == "dynamic" and options().temporal_patch_dim == 1
    assert options(preset="nemotron_nano_vl").image["max_tiles"] == 12


def test_the_temporal_preset_chooses_frames_as_bridges_collate_unless_told_otherwise():
    from energon_nemotron.media.video import VideoOptions

    t = options(preset="nemotron_omni_temporal")
    assert t.video["sampling"] == "bridge"
    resolved = VideoOptions(**t.video)
    assert (resolved.fps, resolved.max_frames) == (1.0, None)                   # Bridge's own values
    assert options(preset="nemotron_omni_temporal", video={"sampling": "hf"}).video["sampling"] == "hf"
    assert "sampling" not in options(preset="nemotron_omni").video            # the served model's rule


@pytest.mark.parametrize("kw, match", [
    ({"preset": "nemotron_omni_temporal", "image": {"mode": "dynamic"}},
     r"image.mode = 'dynamic', but preset 'nemotron_omni_temporal' .* requires 'tiling'"),
    ({"preset": "nemotron_omni", "video": {"temporal_patch": 4}}, r"video.temporal_patch = 4, but preset"),
    ({"preset": "nemotron_nano_vl", "output": "nemotron_omni_step"}, r"serves packed_batch"),
    ({"preset": "nemotron_omni_2"}, r"unknown model preset 'nemotron_omni_2'; known: nemotron_nano_vl, nemotron_omni"),
    ({"output": "llava_step"}, r"output"),
])
def test_preset_conflicts_are_configuration_errors(kw, match):
    with pytest.raises((ConfigError, ValidationError), match=match):
        options(**kw)


def test_output_refuses_media_its_step_cannot_carry(tmp_path):
    video = crude("v1", "<video>\nWhat happens?", mp4=make_video(64, 48, seconds=1.0, fps=4))
    image = crude("i1", "<image>\nWhat is it?", jpg=make_image(64, 48))
    with pytest.raises(DataError, match=r"^v1: has video; Bridge's Nemotron Omni model takes video only") as e:
        encode(encoder(tmp_path, preset="nemotron_omni", output="nemotron_omni_step"), video)
    assert e.value.code == "unsupported_media"
    with pytest.raises(DataError, match=r"^i1: has image; output gpt_step takes text only"):
        encode(encoder(tmp_path, output="gpt_step"), image)


def test_dict_output_is_one_row_per_micro_batch(tmp_path):
    enc = encoder(tmp_path, preset="nemotron_omni", output="nemotron_omni_step")
    a, b = (encode(enc, crude(k, "<image>\nWhat is it?", jpg=make_image(96, 64, seed=i))) for i, k in enumerate("ab"))
    d = enc.batch([a])
    assert d["sample_keys"] == ["a"] and d["skipped"] == {} and d["attention_mask"] is None
    tokens = int(a.sources[0].tokens.shape[0])
    assert d["telemetry"] == {"samples": 1, "tokens": tokens, "positions": 4096, "fill_ratio": tokens / 4096,
                              "media": {"image": 1}}
    assert d["tokens"].dtype == torch.int64 and d["loss_mask"].dtype == torch.float32
    assert d["imgs_sizes"].dtype == torch.int64 and d["num_image_tiles"].dtype == torch.int32
    plan = plan_image(96, 64)                                        # the dynamic grid, in pixels
    assert d["imgs_sizes"].tolist() == [[plan.grid_h * 16, plan.grid_w * 16]]
    assert int(d["num_image_tiles"][0]) == int(d["imgs_sizes"][0, 0] * d["imgs_sizes"][0, 1]) // (32 * 32)
    assert d["pixel_values"].shape == (1, int(d["imgs_sizes"][0].prod()) // 256, 768)
    with pytest.raises(ConfigError, match=r"one packed row per micro-batch .* got 2 rows"):
        enc.batch([a, b])


def test_the_project_loader_refuses_dict_output(tmp_path):
    from energon_data import text_dataset

    text_dataset(tmp_path / "t", "general_conversations", 3)
    cfg = loader_yaml(tmp_path / "c.yaml", {"path": str(tmp_path / "t")}, seq_length=4096,
                      extra_options={"output": "gpt_step"})
    with pytest.raises(ConfigError, match=r"yield Megatron-Bridge step dicts"):
        build_train_loader(cfg)


def test_conversion_refuses_rows_the_model_cannot_take(tmp_path):
    enc = encoder(tmp_path)                                           # dynamic images, aspect-kept video
    image = enc.batch([encode(enc, crude("i1", "<image>\nWhat is it?", jpg=make_image(96, 64)))])
    video = enc.batch([encode(enc, crude("v1", "<video>\nWhat happens?", mp4=make_video(64, 48, seconds=1.0, fps=4)))])
    with pytest.raises(BridgeBatchError, match=r"^i1: image units of \[.*\] patches; the temporal embedder"):
        to_nemotron_omni_step_batch(image, temporal_patch_dim=2)
    with pytest.raises(BridgeBatchError, match=r"^v1: video needs Bridge's temporal embedder"):
        to_nemotron_omni_step_batch(video, temporal_patch_dim=1)
    with pytest.raises(BridgeBatchError, match=r"^i1: gpt_step takes text only"):
        to_gpt_step_batch(image)
    with pytest.raises(BridgeBatchError, match=r"not one run of the image placeholder id"):
        to_nemotron_omni_step_batch(image, image_token_id=0)
    tiled = encoder(tmp_path, image={"mode": "tiling", "max_tiles": 4})
    wide = tiled.batch([encode(tiled, crude("t1", "<image>\nWhat is it?", jpg=make_image(1200, 400)))])
    with pytest.raises(BridgeBatchError, match=r"^t1: a tiled image"):
        to_nemotron_omni_step_batch(wide)


@pytest.mark.parametrize("kw, match", [
    ({"image": {"mode": "tiling", "max_tiles": 4}}, r"image: tiling with max_tiles 4, use_thumbnail True makes tiled"),
    ({"image": {"mode": "tiling", "max_tiles": 1}}, r"max_tiles 1, use_thumbnail True makes tiled images"),
    ({"image": {"patch_size": 8}}, r"image\.patch_size = 8: output nemotron_omni_step .* takes patch_size 16"),
    ({"video": {"downsample": 1}}, r"video\.downsample = 1: .* takes downsample 2"),
    ({"preset": "nemotron_omni", "mtp_num_layers": 1}, r"mtp_num_layers = 1: output nemotron_omni_step is not MTP-safe"),
])
def test_the_omni_step_refuses_at_start_what_its_model_cannot_take(tmp_path, kw, match):
    """Known from the options: refused when the encoder is built, not pack by pack while training
    (where a refused pack takes its innocent samples with it)."""
    with pytest.raises(ConfigError, match=match):
        encoder(tmp_path, output="nemotron_omni_step", **kw)
    encoder(tmp_path, **kw)                                  # packed_batch takes them all
    if "mtp_num_layers" in kw:
        encoder(tmp_path, output="gpt_step", mtp_num_layers=1)   # gpt_step is MTP-safe


def test_a_loader_that_does_not_pack_as_configured_is_refused_at_start(tmp_path):
    """Bridge's data module (or any Energon loader) given no or another packing_buffer_size than the
    encoder's packing.buffer_size: one sample per row, silently, without this check."""
    from megatron.energon import WorkerConfig, get_train_dataset

    from energon_data import text_dataset

    text_dataset(tmp_path / "t", "general_conversations", 12)
    packing = {"algorithm": "first_fit_decreasing", "buffer_size": 8}
    cfg = loader_yaml(tmp_path / "c.yaml", {"path": str(tmp_path / "t")}, seq_length=4096, packing=packing)
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)

    def build(enc, size):
        return get_train_dataset(str(tmp_path / "t"), worker_config=wc, batch_size=1, shuffle_buffer_size=None,
                                 max_samples_per_sequence=None, task_encoder=enc, packing_buffer_size=size)

    with pytest.raises(ConfigError, match=r"^packing.buffer_size is 8 but the loader builds the dataset with "
                                          r"packing_buffer_size None: every row would hold one sample; pass "
                                          r"packing_buffer_size=8 \(Megatron-Bridge: EnergonMultiModalDataModule"):
        build(build_task_encoder(cfg), None)
    with pytest.raises(ConfigError, match=r"packing_buffer_size 16: the packer would see other buffers"):
        build(build_task_encoder(cfg), 16)
    unpacked = loader_yaml(tmp_path / "u.yaml", {"path": str(tmp_path / "t")}, seq_length=4096)
    with pytest.raises(ConfigError, match=r"the loader packs \(packing_buffer_size 8\) but the encoder has no packing"):
        build(build_task_encoder(unpacked), 8)
    assert build(build_task_encoder(cfg), 8) is not None
