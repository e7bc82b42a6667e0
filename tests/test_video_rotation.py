"""Display rotation (energon_nemotron.media.rotation) against real PyAV/FFmpeg files.

Sources of truth besides our own code: FFmpeg's mov/matroska demuxers (the matrix they attach to
decoded frames, ``VideoFrame.side_data`` / ``VideoFrame.rotation`` = ``av_display_rotation_get``),
libavutil's ``av_display_rotation_set`` (PyAV's muxer path), FFmpeg's ``transpose``/``hflip``/``vflip``
filters chosen as ``fftools/ffmpeg_filter.c`` chooses them, and the ISO/IEC 14496-12 matrix formula.
"""

from __future__ import annotations

import io
import math

import av
import mp4_rotation as mp4
import numpy as np
import pytest

from energon_nemotron.media import rotation as rot
from energon_nemotron.media.rotation import (
    display_rotation, frame_display_matrix, rotate_frame, rotated_size, video_rotation)

W, H = 64, 48  # stored (coded) size: landscape
ROTATIONS = (0, 90, 180, 270)


@pytest.fixture(scope="module")
def base() -> bytes:
    return mp4.make_mp4(W, H, fps=10, num_frames=3)


def first_frame(data: bytes):
    with av.open(io.BytesIO(data)) as c:
        return next(c.decode(c.streams.video[0]))


def rotation_of(data: bytes) -> int:
    with av.open(io.BytesIO(data)) as c:
        return video_rotation(c.streams.video[0])


def centroid(img: np.ndarray, colour) -> tuple[float, float]:
    """(column, row) centre of the pixels close to ``colour`` (pixel centres at +0.5)."""
    mask = np.all(np.abs(img.astype(int) - np.array(colour)) < 80, axis=-1)
    rows, cols = np.nonzero(mask)
    assert rows.size > 0, f"no {colour} marker"
    return cols.mean() + 0.5, rows.mean() + 0.5


def shown_at(matrix, p: float, q: float) -> tuple[float, float]:
    """ISO/IEC 14496-12: stored (p, q) is shown at (a p + c q + x, b p + d q + y) (16.16 values)."""
    a, b, _, c, d, _, x, y, _ = (v / 65536 for v in matrix)
    return a * p + c * q + x, b * p + d * q + y


def ffmpeg_autorotate_filters(frame) -> list[tuple[str, str | None]]:
    """The filters fftools/ffmpeg_filter.c inserts for ``frame``'s display matrix: its get_rotation
    (theta = -round(av_display_rotation_get), here libavutil's value via ``VideoFrame.rotation``)
    and its branch table on the matrix entries."""
    m = frame_display_matrix(frame)
    theta = -float(frame.rotation)
    theta -= 360 * math.floor(theta / 360 + 0.9 / 360)
    if abs(theta - 90) < 1:
        return [("transpose", "cclock_flip" if m[3] > 0 else "clock")]
    if abs(theta - 180) < 1:
        return [f for f, on in ((("hflip", None), m[0] < 0), (("vflip", None), m[4] < 0)) if on]
    if abs(theta - 270) < 1:
        return [("transpose", "clock_flip" if m[3] < 0 else "cclock")]
    assert abs(theta) < 1, "odd angle: ffmpeg would use the rotate filter"
    return [("vflip", None)] if m is not None and m[4] < 0 else []


def run_filters(rgb, filters) -> np.ndarray:
    graph = av.filter.Graph()
    last = graph.add_buffer(width=rgb.width, height=rgb.height, format="rgb24", time_base=rgb.time_base)
    for name, args in filters:
        node = graph.add(name, args) if args else graph.add(name)
        last.link_to(node)
        last = node
    sink = graph.add("buffersink")
    last.link_to(sink)
    graph.configure()
    graph.push(rgb)
    return graph.pull().to_ndarray()


# -- reading the rotation back ------------------------------------------------------------------

@pytest.mark.parametrize("degrees", ROTATIONS)
def test_reads_back_rotation_written_by_with_rotation(base, degrees):
    data = mp4.with_rotation(base, degrees)
    assert rotation_of(data) == degrees
    frame = first_frame(data)
    # FFmpeg's own reading: av_display_rotation_get is counter-clockwise.
    assert (-frame.rotation) % 360 == degrees
    assert display_rotation(frame_display_matrix(frame)) == degrees


@pytest.mark.parametrize("degrees", ROTATIONS)
def test_header_matrix_equals_the_one_ffmpeg_attaches_to_frames(base, degrees):
    data = mp4.with_rotation(base, degrees)
    with av.open(io.BytesIO(data)) as c:
        s = c.streams.video[0]
        header = rot._header_matrix(c, s.id)
        # FFmpeg attaches no matrix to frames for the identity
        assert header == (frame_display_matrix(next(c.decode(s))) or mp4.IDENTITY)


@pytest.mark.parametrize("degrees", ROTATIONS)
def test_pyav_muxer_writes_the_same_rotation_as_the_byte_patch(base, degrees):
    written = mp4.make_mp4(W, H, 10, 2, rotation=degrees)
    patched = mp4.read_matrix(mp4.with_rotation(base, degrees))
    keep = [0, 1, 2, 3, 4, 5, 8]  # PyAV writes no translation (x, y)
    assert [mp4.read_matrix(written)[i] for i in keep] == [patched[i] for i in keep]
    assert rotation_of(written) == degrees


def test_header_read_does_not_disturb_decoding(base):
    data = mp4.with_rotation(base, 90)
    f = io.BytesIO(data)
    with av.open(f) as c:
        s = c.streams.video[0]
        pos = f.tell()
        assert video_rotation(s) == 90
        assert f.tell() == pos
        assert len(list(c.decode(s))) == 3


def test_container_opened_from_a_path(base, tmp_path):
    path = tmp_path / "portrait.mp4"
    path.write_bytes(mp4.with_rotation(base, 270))
    with av.open(str(path)) as c:
        assert c.file is None  # no file object: the header is read from the path
        assert video_rotation(c.streams.video[0]) == 270


def test_version_1_tkhd(base):
    ismv = mp4.make_mp4(W, H, 10, 2, format="ismv")
    assert ismv[mp4.video_tkhd_offsets(ismv)[0]] == 1  # tkhd version byte
    for degrees in ROTATIONS:
        data = mp4.with_rotation(ismv, degrees)
        assert rotation_of(data) == degrees
        assert (-first_frame(data).rotation) % 360 == degrees


def test_movie_matrix_composes_like_ffmpeg(base):
    quarter = mp4.rotation_matrix(90, W, H)
    only_movie = mp4.with_display_matrix(base, quarter, box=b"mvhd")
    both = mp4.with_display_matrix(mp4.with_rotation(base, 90), quarter, box=b"mvhd")
    for data, expected in ((only_movie, 90), (both, 180)):
        with av.open(io.BytesIO(data)) as c:
            s = c.streams.video[0]
            assert rot._header_matrix(c, s.id) == frame_display_matrix(next(c.decode(s)))
        assert rotation_of(data) == expected


def test_no_display_matrix_is_zero(base):
    assert mp4.read_matrix(base) == mp4.IDENTITY  # PyAV wrote no matrix
    assert frame_display_matrix(first_frame(base)) is None
    assert rotation_of(base) == 0
    assert rotation_of(mp4.with_rotation(base, 0)) == 0
    assert rotation_of(mp4.make_mp4(W, H, 10, 2, rotation=0)) == 0
    assert display_rotation(None) == 0


def test_other_containers_fall_back_to_the_decoded_frame():
    mkv = mp4.make_mp4(W, H, 10, 2, format="matroska")
    assert rotation_of(mkv) == 0
    for degrees in (90, 270):
        assert rotation_of(mp4.make_mp4(W, H, 10, 2, format="matroska", rotation=degrees)) == degrees


def test_mirrored_matrix_raises(base):
    mirrored = mp4.with_display_matrix(base, (-65536, 0, 0, 0, 65536, 0, W << 16, 0, 1 << 30))
    with pytest.raises(ValueError, match="mirror"):
        rotation_of(mirrored)
    with pytest.raises(ValueError, match="mirror"):
        rotation_of(mp4.make_mp4(W, H, 10, 2, rotation=90, hflip=True))


MIRRORS = {  # 2x2 part (a, b, c, d) -> what ffmpeg's table inserts
    (-1, 0, 0, 1): [("hflip", None)],
    (1, 0, 0, -1): [("vflip", None)],
    (0, 1, 1, 0): [("transpose", "cclock_flip")],
    (0, -1, -1, 0): [("transpose", "clock_flip")],
}


@pytest.mark.parametrize("abcd", list(MIRRORS))
def test_mirrored_means_ffmpeg_flips(base, abcd):
    a, b, c, d = (v << 16 for v in abcd)
    data = mp4.with_display_matrix(base, (a, b, 0, c, d, 0, 0, 0, 1 << 30))
    assert ffmpeg_autorotate_filters(first_frame(data)) == MIRRORS[abcd]
    with pytest.raises(ValueError, match="mirror"):
        rotation_of(data)


@pytest.mark.parametrize("degrees", ROTATIONS)
def test_rotations_mean_ffmpeg_does_not_flip(base, degrees):
    filters = ffmpeg_autorotate_filters(first_frame(mp4.with_rotation(base, degrees)))
    expected = {0: [], 90: [("transpose", "clock")], 180: [("hflip", None), ("vflip", None)],
                270: [("transpose", "cclock")]}
    assert filters == expected[degrees]


# -- the picture a player shows ------------------------------------------------------------------

@pytest.mark.parametrize("degrees", ROTATIONS)
def test_markers_land_where_the_matrix_shows_them(base, degrees):
    data = mp4.with_rotation(base, degrees)
    frame = first_frame(data)
    matrix = frame_display_matrix(frame) or mp4.IDENTITY  # as FFmpeg's demuxer read it
    shown = rotate_frame(frame.to_ndarray(format="rgb24"), rotation_of(data))
    assert (shown.shape[1], shown.shape[0]) == rotated_size(W, H, degrees)
    s = mp4.marker_side(W, H) / 2
    stored = {"top_left": (s, s), "top_right": (W - s, s), "bottom_left": (s, H - s)}
    for corner, colour in mp4.CORNER_COLOURS.items():
        expected = shown_at(matrix, *stored[corner])
        assert centroid(shown, colour) == pytest.approx(expected, abs=1.0), corner


def test_portrait_phone_video_is_upright(base):
    """The classic case: landscape storage, ``a b c d = 0 1 -1 0`` (ffprobe: rotation of -90)."""
    data = mp4.with_rotation(base, 90)
    assert mp4.read_matrix(data)[:5] == (0, 65536, 0, -65536, 0)
    shown = rotate_frame(first_frame(data).to_ndarray(format="rgb24"), rotation_of(data))
    assert shown.shape == (W, H, 3)  # portrait
    # stored top-left goes to the top-right, stored bottom-left to the top-left
    assert centroid(shown, mp4.CORNER_COLOURS["top_left"])[0] > H / 2
    assert max(centroid(shown, mp4.CORNER_COLOURS["bottom_left"])) < W / 4


@pytest.mark.parametrize("degrees", ROTATIONS)
def test_rotate_frame_equals_ffmpeg_autorotate_filters(base, degrees):
    data = mp4.with_rotation(base, degrees)
    frame = first_frame(data)
    rgb = frame.reformat(format="rgb24")
    ours = rotate_frame(rgb.to_ndarray(), rotation_of(data))
    np.testing.assert_array_equal(ours, run_filters(rgb, ffmpeg_autorotate_filters(frame)))


# -- pure functions ------------------------------------------------------------------------------

def cw_matrix(degrees: float, scale: float = 1.0) -> tuple[int, ...]:
    """av_display_rotation_set(matrix, degrees) (a clockwise angle), optionally scaled."""
    c, s = math.cos(math.radians(degrees)) * scale, math.sin(math.radians(degrees)) * scale
    return (round(c * 65536), round(s * 65536), 0, round(-s * 65536), round(c * 65536), 0, 0, 0, 1 << 30)


@pytest.mark.parametrize("degrees, expected", [
    (0, 0), (30, 0), (44, 0), (46, 90), (89.4, 90), (90.6, 90), (135, 180), (200, 180),
    (250, 270), (-90, 270), (316, 0), (359.6, 0), (-0.4, 0)])
def test_display_rotation_rounds_to_quarter_turns(degrees, expected):
    assert display_rotation(cw_matrix(degrees)) == expected
    assert display_rotation(cw_matrix(degrees, scale=2.5)) == expected  # scale is ignored


def test_display_rotation_sign_matches_libavutil():
    # PyAV's set_display_rotation(ccw) calls av_display_rotation_set(-ccw); read back by FFmpeg.
    for cw, expected in ((30, 0), (60, 90), (100, 90), (-100, 270)):
        frame = first_frame(mp4.make_mp4(W, H, 10, 1, rotation=cw))
        assert frame.rotation == pytest.approx(-cw, abs=1)  # counter-clockwise, truncated
        assert display_rotation(frame_display_matrix(frame)) == expected


def test_display_rotation_edge_cases():
    assert display_rotation([0] * 9) == 0  # degenerate: NaN in libavutil, no filter in ffmpeg
    with pytest.raises(ValueError):
        display_rotation([1, 2, 3])
    for mirrored in ((0, 65536, 0, 65536, 0, 0, 0, 0, 1 << 30),  # transpose: ffmpeg cclock_flip
                     (65536, 0, 0, 0, -65536, 0, 0, 0, 1 << 30)):  # vflip
        with pytest.raises(ValueError, match="mirror"):
            display_rotation(mirrored)


@pytest.mark.parametrize("degrees", ROTATIONS)
def test_rotate_frame_is_a_clockwise_copy(degrees):
    rng = np.random.default_rng(degrees)
    img = rng.integers(0, 256, size=(5, 7, 3), dtype=np.uint8)
    out = rotate_frame(img, degrees)
    assert out.dtype == np.uint8 and out.flags.c_contiguous and not np.shares_memory(out, img)
    h, w = img.shape[:2]
    assert out.shape == ((w, h, 3) if degrees in (90, 270) else (h, w, 3))
    for r in range(h):
        for c in range(w):
            # clockwise: the top row becomes the right-most column
            target = {0: (r, c), 90: (c, h - 1 - r), 180: (h - 1 - r, w - 1 - c), 270: (w - 1 - c, r)}
            np.testing.assert_array_equal(out[target[degrees]], img[r, c])
    assert sorted(out.reshape(-1).tolist()) == sorted(img.reshape(-1).tolist())


def test_rotate_frame_round_trip_other_dtypes_and_bad_input():
    img = np.arange(2 * 3 * 3, dtype=np.float32).reshape(2, 3, 3)
    back = img
    for _ in range(4):
        back = rotate_frame(back, 90)
    np.testing.assert_array_equal(back, img)
    assert rotate_frame(img, 270).dtype == np.float32
    np.testing.assert_array_equal(rotate_frame(rotate_frame(img, 90), 270), img)
    assert rotate_frame(np.zeros((2, 3), np.uint8), 90).shape == (3, 2)
    with pytest.raises(ValueError):
        rotate_frame(img, 45)


def test_rotated_size():
    assert rotated_size(1920, 1080, 0) == (1920, 1080)
    assert rotated_size(1920, 1080, 90) == (1080, 1920)
    assert rotated_size(1920, 1080, 180) == (1920, 1080)
    assert rotated_size(1920, 1080, 270) == (1080, 1920)
    with pytest.raises(ValueError):
        rotated_size(1920, 1080, -90)


def test_frames_are_distinguishable():
    frames = [mp4.pattern_frame(W, H, i) for i in range(3)]
    assert len({int(f[H // 2, W // 2, 0]) for f in frames}) == 3
    corner = mp4.pattern_frame(W, H, 0, pattern="corner")
    assert corner[0, 0].tolist() == [255, 255, 255] and corner[-1, -1].tolist() != [255, 255, 255]
