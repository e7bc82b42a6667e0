"""The ``hf``, ``bridge`` and ``midpoints`` video samplings, rotation, and the decode checks.

``bridge`` is compared with Megatron-Bridge 0.6.2's own sampler (``sample_video_frames_to_data_urls``,
run from the reference cache on videos whose frames carry their index); ``hf`` with a re-statement
of ``transformers``' ``default_sample_indices_fn`` here and with the processor itself in
``test_processor_parity.py``. Decoded frames are checked against a full PyAV decode.
"""

from __future__ import annotations

import io
from fractions import Fraction

import av
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from energon_nemotron.errors import ConfigError, MediaError
from energon_nemotron.media.video import VideoOptions, plan_video, video_metadata
from energon_nemotron.media.video_frames import process_video
from energon_nemotron.media.video_sampling import bridge_indices, hf_indices, hf_label_times
from indexed_video import make_indexed_video, read_frame_index
from mp4_rotation import with_rotation
from references.bridge import bridge_sample_video

CLIP_MEAN = torch.tensor((0.48145466, 0.4578275, 0.40821073)).view(3, 1, 1)
CLIP_STD = torch.tensor((0.26862954, 0.26130258, 0.27577711)).view(3, 1, 1)

# name: (width, height, fps, frames)
VIDEOS = {"30fps_10s": (160, 96, Fraction(30), 300), "24fps_3.5s": (176, 144, Fraction(24), 84),
          "2997_5s": (160, 96, Fraction(30000, 1001), 150), "25fps_0.8s": (128, 96, Fraction(25), 20),
          # 112 wide: decord2 3.4.0 returns 96-wide frames with 4 channels on some machines (seen on a
          # fresh CPU-only VM, any height and frame rate), which Bridge's JPEG encoding then refuses
          "60fps_40s": (112, 64, Fraction(60), 2400), "10fps_3_frames": (64, 48, Fraction(10), 3)}


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sampling_videos")
    return {name: make_indexed_video(folder / f"{name}.mp4", w, h, fps, n) for name, (w, h, fps, n) in VIDEOS.items()}


def full_decode(data) -> list[np.ndarray]:
    with av.open(io.BytesIO(data) if isinstance(data, bytes) else str(data)) as c:
        return [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]


def hf_rows(frame: np.ndarray, grid_h: int, grid_w: int, p: int = 16) -> torch.Tensor:
    """The processor's video arithmetic on one frame: float32 interpolate(bicubic, antialias),
    ``(v / 255 - mean) / std``, raster patches ``(C, P, P)``."""
    x = torch.from_numpy(frame).permute(2, 0, 1)[None].float()
    if x.shape[-2:] != (grid_h * p, grid_w * p):
        x = torch.nn.functional.interpolate(x, size=(grid_h * p, grid_w * p), mode="bicubic", antialias=True,
                                            align_corners=False)
    x = (x[0] / 255.0 - CLIP_MEAN) / CLIP_STD
    return x.reshape(3, grid_h, p, grid_w, p).permute(1, 3, 0, 2, 4).reshape(grid_h * grid_w, 3 * p * p)


# ---------------------------------------------------------------------------------------------
# the hf rule
# ---------------------------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(st.integers(1, 20000), st.floats(1.0, 120.0), st.sampled_from([0.5, 1.0, 2.0, 4.0]),
       st.sampled_from([(8, 32), (1, 64), (1, 100000)]))
def test_hf_plan_is_the_processors_rule(total, fps_src, fps, bounds):
    lo, hi = bounds
    meta = {"width": 320, "height": 240, "duration": total / fps_src, "fps": fps_src, "num_frames": total}
    plan = plan_video(meta, VideoOptions(fps=fps, min_frames=lo, max_frames=hi, max_duration=1e9))
    n = max(1, int(total / fps_src * fps))                   # default_sample_indices_fn with fps
    n = min(max(n, lo), hi, total)
    assert plan.frame_indices == tuple(int(k * total // n) for k in range(n))
    step = int(1000.0 / fps_src)
    assert plan.frame_times == tuple(i * step / 1000.0 for i in plan.frame_indices)
    assert not plan.intro


def test_hf_indices_and_labels_examples():
    assert hf_indices(300, 20)[:3] == (0, 15, 30) and hf_indices(300, 20)[-1] == 285
    assert hf_indices(84, 7) == (0, 12, 24, 36, 48, 60, 72)
    # 60 fps: int(1000 / 60) = 16 ms a frame, so labels drift (frame 2370 is at 39.50 s, labelled 37.92)
    assert hf_label_times([2370], 60.0) == (37.92,)
    with pytest.raises(ValueError):
        hf_indices(5, 6)


def test_num_frames_option_fixes_the_count():
    meta = {"width": 320, "height": 240, "duration": 10.0, "fps": 30.0, "num_frames": 300}
    assert plan_video(meta, VideoOptions(num_frames=20, max_frames=64)).frame_indices == hf_indices(300, 20)
    assert plan_video(meta, VideoOptions(num_frames=20, sampling="midpoints")).num_frames == 20
    with pytest.raises(ConfigError):
        VideoOptions(num_frames=0)
    with pytest.raises(ConfigError, match="set video.num_frames"):
        VideoOptions(sampling="bridge", fps=0.5)


def test_hf_frames_are_the_decoded_indices(videos):
    for name in ("30fps_10s", "2997_5s", "10fps_3_frames"):
        data = videos[name].read_bytes()
        plan = plan_video(video_metadata(data), VideoOptions(min_frames=1))
        out = process_video(data, plan)
        frames = full_decode(data)
        per = plan.grid_h * plan.grid_w
        for f, idx in enumerate(plan.frame_indices):
            rows = out[f * per:(f + 1) * per]
            torch.testing.assert_close(rows, hf_rows(frames[idx], plan.grid_h, plan.grid_w), atol=2e-5, rtol=0)
            assert read_frame_index(frames[idx]) == idx


# ---------------------------------------------------------------------------------------------
# the bridge rule, against Megatron-Bridge's own sampler
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(VIDEOS))
@pytest.mark.parametrize("fps", [1, 2])
def test_bridge_plan_equals_bridge_sampler(videos, name, fps):
    path = videos[name]
    plan = plan_video(video_metadata(path.read_bytes()), VideoOptions(sampling="bridge", fps=fps, max_frames=10000))
    frames, metadata = bridge_sample_video(str(path), fps=fps)     # what its Nemotron Omni collate calls
    assert plan.frame_indices == tuple(read_frame_index(f) for f in frames)
    sampled_fps = float(metadata.fps or fps)                         # the collate's fallback for one frame
    assert [f"{t:.2f}" for t in plan.frame_times] == [f"{k / sampled_fps:.2f}" for k in range(len(frames))]
    assert plan.intro


@pytest.mark.parametrize("name", list(VIDEOS))
def test_bridge_sampling_alone_takes_bridges_own_values(videos, name):
    """``sampling: bridge`` with ``fps`` and ``max_frames`` unset is Bridge's collate as it ships: its
    ``video_fps`` 1.0 and ``nframe_max`` -1 (no cap), not the Omni defaults of 2 fps and 32 frames."""
    path = videos[name]
    options = VideoOptions(sampling="bridge")
    assert (options.fps, options.max_frames) == (1.0, None)
    plan = plan_video(video_metadata(path.read_bytes()), options)
    frames, metadata = bridge_sample_video(str(path), fps=1)
    assert plan.frame_indices == tuple(read_frame_index(f) for f in frames)
    sampled_fps = float(metadata.fps or 1)
    assert [f"{t:.2f}" for t in plan.frame_times] == [f"{k / sampled_fps:.2f}" for k in range(len(frames))]


def test_sampling_defaults_and_overrides():
    assert (VideoOptions().fps, VideoOptions().max_frames) == (2.0, 32)
    assert (VideoOptions(sampling="midpoints").fps, VideoOptions(sampling="midpoints").max_frames) == (2.0, 32)
    assert (VideoOptions(sampling="bridge", fps=2.0, max_frames=16).fps,
            VideoOptions(sampling="bridge", fps=2.0, max_frames=16).max_frames) == (2.0, 16)
    assert VideoOptions(sampling="bridge", max_frames=4, min_frames=8).max_frames == 4   # no lower bound
    with pytest.raises(ConfigError, match="min_frames <= max_frames"):
        VideoOptions(max_frames=4, min_frames=8)


def test_bridge_cap_and_fixed_count():
    meta = {"width": 320, "height": 240, "duration": 40.0, "fps": 60.0, "num_frames": 2400}
    assert plan_video(meta, VideoOptions(sampling="bridge")).num_frames == 40                 # Bridge: no cap
    assert plan_video(meta, VideoOptions(sampling="bridge", max_frames=32)).num_frames == 32  # max_frames cap
    assert plan_video(meta, VideoOptions(sampling="bridge", num_frames=5)).frame_indices == bridge_indices(2400, 5)
    assert bridge_indices(3, 5) == (0, 1, 2) and bridge_indices(100, 1) == (0,)


# ---------------------------------------------------------------------------------------------
# rotation, size and count checks, max_pixels
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("degrees", [90, 180, 270])
@pytest.mark.parametrize("sampling", ["hf", "midpoints"])
def test_rotated_video_is_decoded_upright(tmp_path, degrees, sampling):
    path = make_indexed_video(tmp_path / "v.mp4", 192, 108, Fraction(15), 30)
    data = with_rotation(path.read_bytes(), degrees)
    meta = video_metadata(data)
    assert meta["rotation"] == degrees
    assert (meta["width"], meta["height"]) == ((108, 192) if degrees != 180 else (192, 108))
    options = VideoOptions(sampling=sampling, resize="hf", min_frames=2)
    plan = plan_video(meta, options)
    out = process_video(data, plan, options)
    stored = full_decode(path.read_bytes())
    upright = np.rot90(stored[plan.frame_indices[0] if plan.frame_indices else int(plan.frame_times[0] * 15)],
                       k=-degrees // 90, axes=(0, 1)).copy()
    torch.testing.assert_close(out[:plan.grid_h * plan.grid_w], hf_rows(upright, plan.grid_h, plan.grid_w),
                               atol=2e-5, rtol=0)


def test_frame_size_other_than_planned_is_an_error(videos):
    data = videos["30fps_10s"].read_bytes()
    wrong = {**video_metadata(data), "width": 192}        # e.g. a cooker's stale metadata
    with pytest.raises(MediaError, match="a decoded frame is 160x96 but the plan is for 192x96"):
        process_video(data, plan_video(wrong))
    unrotated = {**video_metadata(data), "rotation": 90, "width": 96, "height": 160}
    with pytest.raises(MediaError, match="display rotation of 0 degrees, the plan 90"):
        process_video(data, plan_video(unrotated))


def test_missing_frames_are_an_error(videos):
    data = videos["24fps_3.5s"].read_bytes()
    longer = {**video_metadata(data), "num_frames": 90, "duration": 3.75}
    with pytest.raises(MediaError, match=r"frames \[.*\] of 90 planned do not decode"):
        process_video(data, plan_video(longer, VideoOptions(num_frames=16)))


def test_max_pixels_checked_before_decoding(videos):
    data = videos["30fps_10s"].read_bytes()
    with pytest.raises(MediaError, match="over video.max_pixels") as e:
        plan_video(video_metadata(data), VideoOptions(max_pixels=160 * 95))
    assert e.value.code == "media_too_large"
    # a plan from metadata that understates the size: the stream header is checked before decoding
    for sampling in ("hf", "bridge", "midpoints"):
        options = VideoOptions(max_pixels=80 * 48, sampling=sampling)
        small = plan_video({**video_metadata(data), "width": 80, "height": 48}, options)
        with pytest.raises(MediaError, match="160x96 = 15360 pixels, over video.max_pixels 3840"):
            process_video(data, small, options)
