"""Megatron-Bridge 0.6.2's real video frame sampler runs here, and does what we think it does.

``bridge_sample_video`` calls Bridge's ``sample_video_frames_to_data_urls`` (imported from the
reference cache that ``make references`` fills; missing, these tests fail). The videos carry
their frame index in every frame, so the frames Bridge returns (as JPEG data URLs) say which
indices it picked. Those must equal a plain re-statement of Bridge's rule:

    n = max(1, int(total / avg_fps * fps))          avg_fps: decord's get_avg_fps()
    all frames if n >= total; [0] if n == 1;
    else unique(round_half_even(linspace(0, total - 1, n)))
    metadata.fps = (len - 1) / (t[-1] - t[0]), t = index / avg_fps; None for one frame
"""

from __future__ import annotations

import io
import sys

import av
import numpy as np
import pytest
from PIL import Image

from indexed_video import as_rate, make_indexed_video, read_frame_index
from references.bridge import VIDEO_UTILS, bridge_root, bridge_sample_video, import_bridge_module

# name: (width, height, fps, num_frames)
VIDEOS = {
    "30fps_10s": (160, 96, 30, 300),
    "24fps_3.5s": (160, 96, 24, 84),
    "29.97fps_5s": (160, 96, 29.97, 150),  # written as exactly 30000/1001
    "2fps_1.5s_64x48": (64, 48, 2, 3),  # fps=1: a single frame; fps=2: n >= total, every frame
}
CASES = [(name, fps) for name in VIDEOS for fps in (1, 2)] + [("30fps_10s", 0.5)]


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    folder = tmp_path_factory.mktemp("indexed_videos")
    return {name: make_indexed_video(folder / f"{name}.mp4", w, h, fps, n)
            for name, (w, h, fps, n) in VIDEOS.items()}


def expected_bridge_indices(total: int, avg_fps: float, fps: float) -> list[int]:
    n = max(1, int(total / avg_fps * fps))
    if n >= total:
        return list(range(total))
    if n == 1:
        return [0]
    return sorted({int(i) for i in np.round(np.linspace(0, total - 1, n))})


def test_reference_is_the_cached_wheel_and_megatron_still_imports():
    utils = import_bridge_module(VIDEO_UTILS)
    assert str(bridge_root()) in utils.__file__
    assert callable(utils.sample_video_frames_to_data_urls)
    bridge_pkg = sys.modules["megatron.bridge"]
    assert list(bridge_pkg.__path__) == [str(bridge_root() / "megatron" / "bridge")]
    import megatron.core
    import megatron.energon

    assert "site-packages" in megatron.energon.__file__ and "site-packages" in megatron.core.__file__


@pytest.mark.parametrize("name", ["29.97fps_5s", "2fps_1.5s_64x48"])
def test_read_frame_index_reads_every_pyav_frame(videos, name):
    with av.open(str(videos[name])) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(container.streams.video[0])]
    assert [read_frame_index(f) for f in frames] == list(range(VIDEOS[name][3]))
    # what Bridge does to a frame (JPEG, quality 75), and a resize down to 64x64
    for frame in frames[::7]:
        buf = io.BytesIO()
        Image.fromarray(frame).save(buf, format="JPEG", quality=75)
        jpeg = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
        want = read_frame_index(frame)
        assert read_frame_index(np.asarray(jpeg)) == want
        assert read_frame_index(np.asarray(jpeg.resize((64, 64), Image.BILINEAR))) == want


@pytest.mark.parametrize("name,fps", CASES)
def test_bridge_sampler_matches_restatement(videos, name, fps):
    import decord

    width, height, rate, num_frames = VIDEOS[name]
    reader = decord.VideoReader(str(videos[name]))
    total, avg_fps = len(reader), reader.get_avg_fps()
    del reader
    assert total == num_frames
    assert avg_fps == pytest.approx(float(as_rate(rate)), rel=1e-9)
    if name == "29.97fps_5s":
        assert avg_fps == pytest.approx(30000 / 1001, rel=1e-12)

    frames, metadata = bridge_sample_video(videos[name], fps=fps)

    assert all(f.shape == (height, width, 3) and f.dtype == np.uint8 for f in frames)
    indices = [read_frame_index(f) for f in frames]
    expected = expected_bridge_indices(total, avg_fps, fps)
    assert indices == expected
    assert metadata.total_num_frames == len(expected)
    assert metadata.video_backend is None
    if len(expected) == 1:
        assert metadata.fps is None and metadata.duration is None
    else:
        t = [i / avg_fps for i in expected]
        assert metadata.duration == pytest.approx(t[-1] - t[0], rel=1e-12)
        assert metadata.fps == pytest.approx((len(expected) - 1) / (t[-1] - t[0]), rel=1e-12)
