"""The project's media preprocessing against the official Nemotron Omni processor itself
(``transformers`` 5.24 ``models/nemotron_h_omni``, run in ``.venv-ref`` on a generated corpus):
image ``pixel_values``, audio token counts and features, video frames, labels and pixels."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch

from energon_nemotron.media.audio import AudioOptions, audio_metadata, plan_audio, process_audio
from energon_nemotron.media import MediaHandlers
from energon_nemotron.media.image import ImageOptions, image_header_size, plan_image
from energon_nemotron.media.image_pixels import process_image
from energon_nemotron.media.video import VideoOptions, plan_video, video_metadata, video_prompt
from energon_nemotron.media.video_frames import process_video
from energon_nemotron.tokenization import TextEncoder
from energon_nemotron.types import MediaRef
from hf_reference import run_reference

IMAGE_TOLERANCE = 1e-4          # the goal, on normalised values


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return run_reference(tmp_path_factory.mktemp("omni_processor"))


def test_corpus_covers_every_kind(reference):
    kinds = collections.Counter(item["kind"] for item in reference.items("images"))
    assert min(kinds.values()) >= 40
    assert set(kinds) == {"jpeg", "jpeg_gray", "jpeg_cmyk", "jpeg_exif", "png", "png16", "png_rgba", "png_la",
                          "png_palette", "png_palette_trns", "webp", "webp_rgba", "gif"}
    assert reference.results["versions"]["transformers"] == "5.24.0"


def test_images_equal_processor_pixel_values(reference):
    worst = {}
    for item in reference.items("images"):
        data = (reference.corpus / item["file"]).read_bytes()
        plan = plan_image(*image_header_size(data))
        assert [plan.grid_h, plan.grid_w] == reference.results["images"][item["name"]]["grid"], item["name"]
        result = reference.results["images"][item["name"]]
        ours = process_image(data, plan).numpy()
        assert ours.shape == (result["num_patches"], 768), item["name"]
        # the whole tensor: its sum (float64) agrees to the per-value tolerance times the mean |value|
        assert abs(ours.astype(np.float64).sum() - result["sum"]) <= IMAGE_TOLERANCE * ours.size, item["name"]
        ref = reference.array("images", item["name"])
        rows = ours[result["rows"]] if "rows" in result else ours
        assert rows.shape == ref.shape, item["name"]
        diff = float(np.abs(rows - ref).max())
        worst[item["kind"]] = max(worst.get(item["kind"], 0.0), diff)
        assert diff <= IMAGE_TOLERANCE, f"{item['name']}: max |diff| {diff:.3g} > {IMAGE_TOLERANCE}"
    assert set(worst) >= {"png16", "png_rgba", "jpeg_exif", "gif", "jpeg_cmyk"}


def test_pil_resize_differs_from_processor_as_documented(reference):
    """``image.resize: pil`` (the earlier path) stays a different, bounded resize: same shapes and
    grids, mean difference a few thousandths in normalised units."""
    means = []
    for item in [i for i in reference.items("images") if i["full"]][:12]:
        data = (reference.corpus / item["file"]).read_bytes()
        plan = plan_image(*image_header_size(data), ImageOptions(resize="pil"))
        ours = process_image(data, plan).numpy()
        ref = reference.array("images", item["name"])
        assert ours.shape == ref.shape
        means.append(float(np.abs(ours - ref).mean()))
    assert 0 < float(np.mean(means)) < 0.02


@pytest.fixture(scope="module")
def wide_reference(tmp_path_factory):
    return run_reference(tmp_path_factory.mktemp("omni_processor_wide"), kinds=("wide_images",))


def test_wide_integer_images_equal_processor_or_scale_by_depth(wide_reference):
    """``I;16``, ``I;16B`` and ``I`` images with 8-, 12- and 16-bit data: 8-bit data equals the processor
    fed the image as it opens (it keeps it); wider data equals the processor fed the data scaled by its
    bit depth, where the processor's own conversion clips it near-white (the documented difference)."""
    seen = collections.Counter()
    for item in wide_reference.items("wide_images"):
        data = (wide_reference.corpus / item["file"]).read_bytes()
        result = wide_reference.results["wide_images"][item["name"]]
        ours = process_image(data, plan_image(*image_header_size(data))).numpy()
        ref = wide_reference.array("wide_images", item["name"])
        assert ours.shape == ref.shape == (result["num_patches"], 768), item["name"]
        diff = float(np.abs(ours - ref).max())
        assert diff <= IMAGE_TOLERANCE, f"{item['name']}: max |diff| {diff:.3g} > {IMAGE_TOLERANCE}"
        assert abs(float(ours.mean())) < 1.0, item["name"]          # an image, not a white or black field
        if item["reference_input"] == "scale_depth":                # the processor's own: mostly white
            assert result["as_opened_mean"] > float(ours.mean()) + 0.6, item["name"]
        seen[item["kind"]] += 1
    assert seen == {"wide8": 6, "wide12": 6, "wide16": 6}


# ---------------------------------------------------------------------------------------------
# video
# ---------------------------------------------------------------------------------------------
def video_options(item: dict) -> VideoOptions:
    """The options that ask the ``hf`` rule for what the manifest asked the processor for."""
    return VideoOptions(min_frames=1, max_frames=100000, target_patches=item["target_patches"],
                        **({"fps": item["sampling"]["fps"]} if "fps" in item["sampling"]
                           else {"num_frames": item["sampling"]["num_frames"]}))


def hf_frame_rows(tubelets: np.ndarray, num_frames: int, patch: int = 16) -> np.ndarray:
    """The processor's ``pixel_values_videos[0]`` ``[tubelets, 2*3, H, W]`` as per-frame rows
    ``[frames (padded to whole tubelets) * H/P * W/P, 3*P*P]``, the project's layout."""
    t, c2, h, w = tubelets.shape
    frames = tubelets.reshape(t * 2, c2 // 2, h, w)
    rows = frames.reshape(t * 2, 3, h // patch, patch, w // patch, patch).transpose(0, 2, 4, 1, 3, 5)
    return rows.reshape(-1, 3 * patch * patch)


def test_videos_equal_processor(reference, demo_tokenizer):
    rotations = set()
    for item in reference.items("videos"):
        ref = reference.results["videos"][item["name"]]
        data = (reference.corpus / item["file"]).read_bytes()
        options = video_options(item)
        meta = video_metadata(data)
        rotations.add(meta["rotation"])
        assert meta["fps"] == pytest.approx(ref["fps"]) and meta["num_frames"] == ref["total_num_frames"]
        plan = plan_video(meta, options)
        assert list(plan.frame_indices) == ref["frames_indices"], item["name"]
        assert plan.num_frames == ref["num_frames"]
        text = "\n".join(label + "<img>" + "<image>" * n + "</img>" for label, n in video_prompt(plan))
        assert text == ref["prompt"], item["name"]
        handlers = MediaHandlers(demo_tokenizer, TextEncoder(demo_tokenizer), ImageOptions(), options, AudioOptions())
        assert handlers.plan(MediaRef("video", data, name=item["name"]), 0).placeholder == ref["input_ids"]
        ours = process_video(data, plan, options).numpy()
        theirs = hf_frame_rows(reference.array("videos", item["name"]), plan.num_frames)
        assert ours.shape == theirs.shape, item["name"]
        diff = float(np.abs(ours - theirs).max())
        assert diff <= IMAGE_TOLERANCE, f"{item['name']}: max |diff| {diff:.3g}"
    assert rotations == {0, 90, 180, 270}


# ---------------------------------------------------------------------------------------------
# audio
# ---------------------------------------------------------------------------------------------
def test_audio_counts_and_features_equal_processor(reference):
    for item in reference.items("audio"):
        ref = reference.results["audio"][item["name"]]
        data = (reference.corpus / item["file"]).read_bytes()
        plan = plan_audio(audio_metadata(data))
        assert plan.num_samples == ref["num_samples"] == item["num_samples"]
        assert plan.tokens == (ref["num_tokens"],), item["name"]
        features, lengths = process_audio(data, plan)
        assert lengths.tolist() == [ref["num_frames"]] and ref["mask_sum"] == ref["num_frames"] - 1
        theirs = reference.array("audio", item["name"])
        np.testing.assert_allclose(features[0, :ref["num_frames"]].numpy(), theirs, atol=1e-4, rtol=0)
