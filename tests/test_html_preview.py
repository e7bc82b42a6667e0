"""``preview --html``: a page with coloured segments, trained tokens, media thumbnails and hover
details; rendered by headless Chromium (a test dependency: ``make test-deps`` installs it)."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest
import torch

from energon_data import loader_yaml
from energon_nemotron.demo.datasets import multimodal_dataset
from energon_nemotron.inspection.html import mel_image, unpatchify
from energon_nemotron.inspection import run_preview

SMALL = {"image": {"min_patches": 64, "max_patches": 256},
         "video": {"target_patches": 64, "min_frames": 2, "max_frames": 4}}


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    root = tmp_path_factory.mktemp("html")
    multimodal_dataset(root / "mm", n=10)
    cfg = loader_yaml(root / "l.yaml", {"path": "mm"}, seq_length=2048, prompt_format="nemotron6",
                      packing={"algorithm": "minimum_bin_slack", "buffer_size": 10}, extra_options=SMALL)
    out = root / "preview.html"
    assert run_preview(str(cfg), html=str(out), batches=3) == 0
    return out


def test_page_content(page):
    text = page.read_text()
    assert text.startswith("<!doctype html>") and "<script" not in text
    assert len(re.findall(r'class="seg"', text)) >= 3
    assert 't tr" title="pos ' in text                      # trained tokens, with hover details
    assert re.search(r'title="pos \d+ · id \d+ · label (-100|\d+) · loss [01]"', text)
    kinds = re.findall(r'class="media" title="(image|video|audio) of', text)
    assert {"image", "video", "audio"} <= set(kinds)
    assert text.count('src="data:image/png;base64,') >= len(kinds)


def test_unpatchify_inverts_the_image_path():
    from energon_nemotron.demo.media import make_image
    from energon_nemotron.media.image import ImageOptions, image_header_size, plan_image
    from energon_nemotron.media.image_pixels import process_image

    data = make_image(96, 64, seed=3, fmt="PNG")
    plan = plan_image(*image_header_size(data), ImageOptions(min_patches=16, max_patches=64))
    rows = process_image(data, plan).numpy()
    from PIL import Image
    import io

    want = np.asarray(Image.open(io.BytesIO(data)).convert("RGB").resize((plan.grid_w * 16, plan.grid_h * 16),
                                                                          Image.Resampling.BICUBIC))
    got = unpatchify(rows, plan.grid_h, plan.grid_w)
    assert got.shape == want.shape and np.abs(got.astype(int) - want.astype(int)).max() <= 1
    mel = mel_image(np.random.default_rng(0).normal(size=(50, 128)).astype(np.float32), 40)
    assert mel.shape == (128, 40) and mel.dtype == np.uint8


def chromium() -> str:
    """Chromium is part of the test setup (``make test-deps``, run by ``make test``, installs Debian's
    package): a missing one fails the test, it never skips it."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.fail("chromium is not installed: run `make test-deps` (make test does), which installs "
                    "Debian's chromium package", pytrace=False)
    return exe


@pytest.mark.slow
def test_headless_chromium_renders_a_non_blank_page(page, tmp_path):
    from PIL import Image

    shot = tmp_path / "shot.png"
    res = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                          "--disable-background-networking", "--disable-component-update", "--disable-sync",
                          f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
                          "--window-size=1280,1600", page.as_uri()], capture_output=True, text=True, timeout=180)
    assert shot.exists(), res.stderr[-2000:]
    img = np.asarray(Image.open(shot).convert("RGB"))
    assert img.shape[0] >= 1000 and img.shape[1] == 1280
    colours = np.unique(img.reshape(-1, 3), axis=0)
    assert len(colours) > 200 and img.std() > 20            # text, bands and thumbnails, not a blank page
    # the trained-token highlight colour (#ffe066) is on the page
    assert (np.abs(img.astype(int) - [0xff, 0xe0, 0x66]).sum(axis=2) < 12).sum() > 500
