"""NeMo-RL's augmentations (issue 48) against NeMo-RL's own functions: ``fixtures/nemo_rl/
augmentations.json`` (``make_augmentations.py`` ran NeMo-RL's ``_select_video_frames``,
``_plan_visual_occurrences`` and ``_video_prompt``).

- For every fixed draw (the scale's index, the jitter's uniforms, the tiling's three uniforms) the
  library's rules give NeMo-RL's frame times, frame count, scale, patch grid, embedding widths and
  prompt text, exactly.
- Over 10,000 draws, the library's keyed draws (``media.draws``) give the value sets and the
  frequencies of NeMo-RL's own generators: a chi-square test of homogeneity, which a wrong
  distribution fails (checked too).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from energon_nemotron.media import augment, video
from energon_nemotron.media.augment import nemo_rl_frame_count, nemo_rl_times, pick_scale, scale_values
from energon_nemotron.media.draws import uniforms, uniforms_f32
from energon_nemotron.media.image import ImageOptions, plan_image
from energon_nemotron.media.video import VideoOptions, _frame_grid, plan_video, video_prompt

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "nemo_rl" / "augmentations.json").read_text())
PLACEHOLDER = FIXTURE["meta"]["placeholder"]
#: the least p-value a distribution may have against NeMo-RL's
P_MIN = 1e-3


def video_options(o: dict) -> VideoOptions:
    """The library's options for NeMo-RL's (the fixture's processor: 1024 patches a frame)."""
    return VideoOptions(sampling="nemo_rl", min_frames=o["video_min_num_frames"], max_frames=o["video_max_num_frames"],
                        fps=float(o["video_default_fps"]), temporal_patch=o["temporal_patch_size"],
                        target_patches=FIXTURE["meta"]["processor"]["video_target_num_patches"],
                        maintain_aspect_ratio=o["video_maintain_aspect_ratio"],
                        augment_frames_up=o["video_aug_scale_frames_up"],
                        augment_resolution_up=o["video_aug_scale_resolution_up"],
                        augment_resolution_only=o["video_aug_scale_resolution_only"],
                        temporal_jitter=o["video_frame_temporal_jitter"])


def metadata(v: dict) -> dict:
    return {"width": v["video_width"], "height": v["video_height"], "duration": v["video_duration"],
            "fps": v["video_num_frames"] / v["video_duration"], "num_frames": v["video_num_frames"]}


def prompt_text(plan) -> str:
    """The plan's video text with NeMo-RL's compact placeholder in place of each tubelet's tokens."""
    return "This is a video:\n" + "\n".join(text + PLACEHOLDER for text, _ in video_prompt(plan)) + plan.outro


def homogeneity(a: Counter, b: Counter) -> tuple[float, int, float]:
    """``(chi-square, degrees of freedom, p)`` of the hypothesis that the counts ``a`` and ``b``
    come from one distribution."""
    cats = sorted(set(a) | set(b))
    na, nb = sum(a.values()), sum(b.values())
    stat = 0.0
    for c in cats:
        pooled = (a[c] + b[c]) / (na + nb)
        for observed, n in ((a[c], na), (b[c], nb)):
            stat += (observed - pooled * n) ** 2 / (pooled * n)
    df = len(cats) - 1
    p = 1.0 if df == 0 else float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                                           torch.tensor(stat / 2, dtype=torch.float64)))
    return stat, df, p


def fixed(what: str) -> list[dict]:
    return [c for c in FIXTURE["fixed"] if c["what"] == what]


# -- fixed draws: exactly NeMo-RL's ---------------------------------------------------------------------
def test_every_fixed_video_draw_gives_nemo_rls_frames_grid_and_prompt(monkeypatch):
    cases = fixed("video")
    assert len(cases) == 150
    compared = 0
    for case in cases:
        o, v, want = FIXTURE["video_options"][case["options"]], FIXTURE["videos"][case["video"]], case["nemo_rl"]
        options = video_options(o)
        values = scale_values(options.augment_frames_up, options.augment_resolution_up)
        u = (case["choice"] + 0.5) / len(values)                  # the uniform that picks NeMo-RL's index
        assert pick_scale(values, u) == values[case["choice"]]
        if "start_time" in v or "end_time" in v:                   # a clip: the rules with its start
            start, end = v.get("start_time", 0.0), v.get("end_time", v["video_duration"])
            n, scale = nemo_rl_frame_count(end - start, v["video_num_frames"], values[case["choice"]],
                                           min_frames=options.min_frames, max_frames=options.max_frames,
                                           fps=options.fps, temporal_patch=options.temporal_patch,
                                           resolution_only=options.augment_resolution_only)
            times = nemo_rl_times(end - start, n, case["rand"] or None, clip_start=start)
            grid_h, grid_w = _frame_grid(v["video_width"], v["video_height"], options,
                                         augment.scaled_target(options.target_patches, scale))
            assert (list(times), n, scale) == (want["timestamps"], want["num_frames"], want["scale"]), case
            assert [[grid_w, grid_h]] == want["patch_sizes"], case
            continue
        monkeypatch.setattr(video, "uniforms", lambda key, n: [u] * n)
        monkeypatch.setattr(video, "uniforms_f32", lambda key, n: case["rand"][:n] if len(case["rand"]) == n else
                            pytest.fail(f"{n} jitter draws asked, NeMo-RL drew {len(case['rand'])}"))
        plan = plan_video(metadata(v), options, draw=(0, "d", "k", 0, 0))
        got = {"scale": plan.scale, "timestamps": list(plan.frame_times), "num_frames": plan.num_frames,
               "patch_sizes": [[plan.grid_w, plan.grid_h]], "embedding_widths": [plan.tokens_per_tubelet] * plan.num_tubelets,
               "prompt": prompt_text(plan), "tubelets": plan.num_tubelets}
        assert got == want, (case["options"], case["video"], case["choice"])
        compared += 1
    assert compared == 120                                    # and 30 clips


def test_every_fixed_tiling_draw_gives_nemo_rls_grid():
    cases = fixed("tiling")
    assert len(cases) >= 100
    for case in cases:
        options = ImageOptions(tiling_augment_prob=case["prob"])
        w, h = case["size"]
        plan = plan_image(w, h, options, augment=None if case["draws"] is None else tuple(case["draws"]))
        assert [plan.grid_w, plan.grid_h] == case["nemo_rl"], case
        assert plan.num_tokens == plan.grid_w * plan.grid_h // 4


# -- distributions: NeMo-RL's frequencies -----------------------------------------------------------
def our_counts(case: dict, n: int, shift: dict | None = None) -> Counter:
    """What ``n`` keyed draws (sample keys ``k0`` … of one dataset, pass 0) give in ``case``'s terms;
    ``shift``: options changed, to show that the test rejects another distribution."""
    counts: Counter = Counter()
    if case["what"] == "tiling":
        options = ImageOptions(tiling_augment_prob=(shift or {}).get("prob", case["prob"]))
        w, h = case["size"]
        for i in range(n):
            plan = plan_image(w, h, options, augment=tuple(uniforms((7, "ds", f"k{i}", 0, 0, "tiling"), 3)))
            counts[f"{plan.grid_w}x{plan.grid_h}"] += 1
        return counts
    o = {**FIXTURE["video_options"][case["options"]], **(shift or {})}
    v = FIXTURE["videos"][case["video"]]
    if case["what"] == "video":
        options = video_options({**o, "video_frame_temporal_jitter": False})
        for i in range(n):
            plan = plan_video(metadata(v), options, draw=(7, "ds", f"k{i}", 0, 0))
            counts[f"{plan.scale}|{plan.num_frames}|{plan.grid_w}x{plan.grid_h}"] += 1
        return counts
    options = video_options({**o, "video_aug_scale_frames_up": None, "video_aug_scale_resolution_up": None})
    still = plan_video(metadata(v), video_options({**o, "video_aug_scale_frames_up": None,
                                                    "video_aug_scale_resolution_up": None,
                                                    "video_frame_temporal_jitter": False}))
    k, segment = case["frame"], (v["video_duration"] - 1) / still.num_frames
    for i in range(n):
        t = plan_video(metadata(v), options, draw=(7, "ds", f"k{i}", 0, 0)).frame_times
        counts[str(min(9, int(((t[k] - still.frame_times[k]) / segment + 0.5) * 10)))] += 1
    return counts


@pytest.mark.parametrize("index", range(len(FIXTURE["distributions"])))
def test_keyed_draws_have_nemo_rls_frequencies(index):
    case = FIXTURE["distributions"][index]
    theirs = Counter(case["counts"])
    ours = our_counts(case, case["draws"])
    assert case["draws"] >= 10_000
    common = {c for c in set(ours) | set(theirs) if (ours[c] + theirs[c]) >= 10}
    assert {c for c in ours if c in common} == {c for c in theirs if c in common}, (ours, theirs)
    stat, df, p = homogeneity(ours, theirs)
    assert p >= P_MIN, (case["what"], case.get("size"), stat, df, p, ours, theirs)


@pytest.mark.parametrize("case, shift", [
    (next(c for c in FIXTURE["distributions"] if c["what"] == "tiling" and c["prob"] == 0.4 and c["size"] == [1920, 1080]),
     {"prob": 0.3}),
    (next(c for c in FIXTURE["distributions"] if c["what"] == "video" and c["options"] == 1),
     {"video_aug_scale_resolution_up": 2}),
])
def test_the_chi_square_test_rejects_another_distribution(case, shift):
    """The test can fail: a tiling probability of 0.3 instead of 0.4, or one resolution scale fewer,
    is rejected against NeMo-RL's counts."""
    stat, df, p = homogeneity(our_counts(case, case["draws"], shift), Counter(case["counts"]))
    assert p < P_MIN, (stat, df, p)


# -- the draws themselves ----------------------------------------------------------------------------------
def test_a_draw_is_a_pure_function_of_its_key():
    """The same key draws the same values, in any process and order; any part of the key changed
    (seed, dataset, sample, pass, item, purpose) draws others; float32 draws are torch.rand's values
    (multiples of 2**-24 in [0, 1))."""
    key = (1234, "ds", "shard-0/k7", 0, 1, "scale")
    a = uniforms(key, 5)
    assert a.tolist() == uniforms(key, 5).tolist() and ((0 <= a) & (a < 1)).all()
    for i, other in enumerate([5678, "ds2", "shard-0/k8", 1, 2, "jitter"]):
        changed = key[:i] + (other,) + key[i + 1:]
        assert uniforms(changed, 5).tolist() != a.tolist(), changed
    f = uniforms_f32(key, 1000)
    assert f.dtype.name == "float32" and ((f * 2 ** 24) % 1 == 0).all() and 0 <= f.min() and f.max() < 1
    assert uniforms((1, "a", "b", 0, 0, "x"), 3).tolist() != uniforms((1, "a", "b", 0, 0, "y"), 3).tolist()


def test_augmentation_options_are_checked():
    """The augmentation applies to NeMo-RL's own frame selection only, with NeMo-RL's checks; the
    identity values (a scale of 1, no jitter) need none; the tiling probability is a probability."""
    from energon_nemotron.errors import ConfigError

    with pytest.raises(ConfigError, match="set sampling: nemo_rl"):
        VideoOptions(augment_frames_up=4)
    with pytest.raises(ConfigError, match="set sampling: nemo_rl"):
        VideoOptions(sampling="midpoints", temporal_jitter=True)
    with pytest.raises(ConfigError, match="max_frames a multiple"):
        VideoOptions(sampling="nemo_rl", max_frames=31)
    with pytest.raises(ConfigError, match="augment_frames_up must be a positive int"):
        VideoOptions(sampling="nemo_rl", augment_frames_up=0)
    assert not VideoOptions(augment_frames_up=1, augment_resolution_up=1).augments
    assert VideoOptions(sampling="nemo_rl", augment_resolution_up=2).augments
    with pytest.raises(ValueError, match="needs its draw key"):
        plan_video({"width": 64, "height": 48, "duration": 4.0, "fps": 10.0, "num_frames": 40},
                   VideoOptions(sampling="nemo_rl", temporal_jitter=True))
    with pytest.raises(ConfigError, match="tiling_augment_prob"):
        ImageOptions(tiling_augment_prob=1.5)
    with pytest.raises(ConfigError, match="image mode dynamic"):
        plan_image(640, 480, ImageOptions(mode="tiling"), augment=(0.1, 0.1, 0.1))


def test_nemo_rls_frames_are_decoded_at_their_times(tmp_path):
    """A ``nemo_rl`` plan decodes, for each frame time ``t``, the frame shown at ``t`` (the frame
    index the video's frames carry), with and without a drawn scale and jitter; its prompt ends with
    NeMo-RL's newline."""
    from indexed_video import make_indexed_video, read_frame_index

    from energon_nemotron.media.video import video_metadata
    from energon_nemotron.media.video_frames import _decode

    data = make_indexed_video(tmp_path / "v.mp4", 192, 108, 15, 90).read_bytes()      # 6 s
    md = video_metadata(data)
    for options, draw in ((VideoOptions(sampling="nemo_rl"), None),
                          (VideoOptions(sampling="nemo_rl", augment_frames_up=3, temporal_jitter=True), (1, "d", "k", 0, 0)),
                          (VideoOptions(sampling="nemo_rl", augment_resolution_up=2, augment_resolution_only=True),
                           (1, "d", "k", 2, 0))):
        plan = plan_video(md, options, draw)
        assert plan.num_frames % 2 == 0 and plan.outro == "\n"
        shown = [read_frame_index(f) for f in _decode(data, plan, options)]
        assert shown == [int(t * 15) for t in plan.frame_times], (plan.frame_times, shown)


def test_the_encoder_options_take_the_augmentation():
    """The library's own options take the video augmentation (``sampling: nemo_rl``) and the tiling
    probability; another sampling with the augmentation is refused by name at start."""
    from energon_nemotron.encoders.options import NemotronMultimodalOptions

    o = NemotronMultimodalOptions(seq_length=64, video={"sampling": "nemo_rl", "augment_frames_up": 4,
                                                        "augment_resolution_only": True}, image={"tiling_augment_prob": 0})
    assert o.video["augment_frames_up"] == 4 and o.image["tiling_augment_prob"] == 0
    with pytest.raises(ValueError, match=r"set sampling: nemo_rl"):
        NemotronMultimodalOptions(seq_length=64, video={"augment_frames_up": 4})
