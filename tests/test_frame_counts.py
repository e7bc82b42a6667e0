"""``PackedBatch.media.num_frames`` is a video's frame count as the Omni processor gives it (the sampled
frames); ``num_units`` the padded count its rows hold (frames up to whole 2-frame tubelets, the last
one repeated). The consumers' adapters send the padded count with the padded rows, one count per
item: what their models take (Bridge's, like megatron-core, pads a tubelet with the last frame)."""

from __future__ import annotations

import pytest
import torch

from bridge_data import crude, encode, encoder
from energon_nemotron.demo.media import make_video
from energon_nemotron.integrations import to_nemotron_omni_expanded_batch, to_nemotron_omni_step_batch
from energon_nemotron.integrations.nemo_rl import to_nemo_rl_packed
from energon_nemotron.media.video import VideoOptions, plan_video, video_metadata

SEVEN = dict(width=64, height=48, seconds=1.0, fps=7)      # 7 frames: hf sampling takes them all


def seven_frame_batch(tmp_path, **options):
    enc = encoder(tmp_path, **options)
    return enc.batch([encode(enc, crude("v7", "<video>\nWhat happens?", mp4=make_video(**SEVEN)))])


def test_num_frames_is_the_processors_count_and_num_units_the_padded_one(tmp_path):
    batch = seven_frame_batch(tmp_path)
    plan = plan_video(video_metadata(make_video(**SEVEN)), VideoOptions())
    assert plan.num_frames == 7 and plan.num_tubelets == 4     # the processor's count (test_processor_parity)
    span = batch.media_spans[0][0]
    assert batch.media.num_frames.tolist() == [7] == [span.frames]
    assert batch.media.num_units.tolist() == [8] == [batch.media.image_sizes[0].shape[0]]
    gh, gw = span.grid
    assert batch.media.pixel_values[0].shape[0] == 8 * gh * gw
    rows = batch.media.pixel_values[0].reshape(8, gh * gw, -1)
    assert torch.equal(rows[7], rows[6])                        # the padding unit repeats the last frame
    batch.validate()


@pytest.mark.parametrize("convert", [to_nemotron_omni_step_batch, to_nemotron_omni_expanded_batch])
def test_bridge_dicts_send_the_padded_count_with_the_padded_rows(tmp_path, convert):
    batch = seven_frame_batch(tmp_path, preset="nemotron_omni_temporal", video={"sampling": "hf"},
                              audio={"sound_length": "valid"} if convert is to_nemotron_omni_expanded_batch else {})
    d = convert(batch, temporal_patch_dim=2)
    assert d["num_frames"].tolist() == [8] == batch.media.num_units.tolist()
    assert d["imgs_sizes"].shape[0] == 8 and d["pixel_values"].shape[1] == batch.media.pixel_values[0].shape[0]


def test_nemo_rl_rows_count_the_units_they_hold(tmp_path):
    batch = seven_frame_batch(tmp_path, output="packed_batch")
    d = to_nemo_rl_packed(batch)
    assert d["num_frames"][0].tolist() == [8] and d["imgs_sizes"][0].shape[0] == 8
