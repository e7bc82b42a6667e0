"""NeMo-RL's augmentations in the loader (issue 48): each sample's draws are a pure function of the
seed, its key and its pass over the data (``media.draws``, ``_energon.passes``), so its media plan
(frame times in the prompt, frame grid, image grid) is the same for 0 and 2 workers and for 1 and
2 data-parallel ranks, after an exact resume, and two runs with one seed agree; the next pass draws
anew; validation draws as pass 0 every time and never tiles. The demo's multimodal samples (images,
videos) through the real Energon loader."""

from __future__ import annotations

import json

import pytest
import yaml

from energon_data import text_config
from energon_nemotron.loading import build_train_loader, build_val_loader
from energon_nemotron.parallel.broadcast import batches_equal

N = 20


@pytest.fixture(scope="module")
def mix(tmp_path_factory):
    """The demo's multimodal dataset (20 samples: text, one image, two images, a video, audio, in
    turn) as a metadataset leaf with ``data_augment: true``."""
    from energon_nemotron.demo.datasets import multimodal_dataset

    root = tmp_path_factory.mktemp("augment")
    multimodal_dataset(root / "mm", n=N, per_shard=5)
    meta = root / "mix.yaml"
    meta.write_text(yaml.safe_dump({"__module__": "megatron.energon", "__class__": "MetadatasetV2", "splits": {
        "train": {"blend_epochized": [{"repetitions": 1, "path": "mm", "subflavors": {"data_augment": True}}]}}}))
    return meta


def config(path, workers: int = 0, augment: bool = True, **loader) -> dict:
    cfg = text_config(path, workers=workers, packing={"algorithm": "first_fit_decreasing", "buffer_size": 6},
                      seq_length=8192, shuffle_buffer_size=8)
    video = {"sampling": "nemo_rl", "target_patches": 64, "min_frames": 4, "max_frames": 8}
    if augment:
        video.update(augment_frames_up=3, augment_resolution_up=2, temporal_jitter=True)
    cfg["task_encoder"]["options"].update({"image": {"min_patches": 64, "max_patches": 256,
                                                     "tiling_augment_prob": 1.0 if augment else 0.0},
                                           "video": video})
    cfg["loader"].update(loader)
    return cfg


def per_sample(batches) -> dict:
    """key -> (its token ids, its media spans' kind, tokens, grid and frames), each sample once."""
    out = {}
    for batch in batches:
        for row, keys in enumerate(batch.sample_keys):
            cu, at = batch.cu_seqlens[row].tolist(), batch.cu_seqlens_padded[row].tolist()
            for i, key in enumerate(keys):
                tokens = tuple(batch.tokens[row][at[i]:at[i] + cu[i + 1] - cu[i]].tolist())
                spans = tuple((s.kind, s.num_tokens, s.grid, s.frames) for s in batch.media_spans[row]
                              if s.sample_key == key)
                assert key not in out, key
                out[key] = (tokens, spans)
    return out


def grids(plans: dict, kind: str) -> dict:
    return {k: [s[2] for s in spans if s[0] == kind] for k, (_, spans) in plans.items()
            if any(s[0] == kind for s in spans)}


def test_the_draws_are_the_samples_own_for_any_workers_and_ranks(mix):
    """0 and 2 workers, 1 and 2 ranks: every sample's tokens and media grids are the same; they
    differ from the unaugmented plans (videos scaled, image grids moved by 32 patches)."""
    one = per_sample(build_train_loader(config(mix, 0), repeat=False))
    assert len(one) == N
    assert per_sample(build_train_loader(config(mix, 2), repeat=False)) == one
    ranks = {}
    for rank in range(2):
        ranks.update(per_sample(build_train_loader(config(mix, 1), repeat=False, dp_rank=rank, dp_size=2)))
    assert ranks == one
    plain = per_sample(build_train_loader(config(mix, 0, augment=False), repeat=False))
    ours, theirs = grids(one, "image"), grids(plain, "image")
    # probability 1: each image's grid shrinks (not these small ones: no side over 32 patches) or
    # grows by 32 patches on one side, before both are rounded to even (``test_nemo_rl_augment``
    # holds the exact grids against NeMo-RL's)
    changes = {(a - b, c - d) for k in ours for (a, c), (b, d) in zip(ours[k], theirs[k])} - {(0, 0)}
    assert changes and all(sorted(map(abs, c))[0] <= 2 and 30 <= sorted(map(abs, c))[1] <= 34 for c in changes), \
        changes
    videos = grids(plain, "video")
    assert videos and any(one[k] != plain[k] for k in videos)          # scaled or jittered


def saved_after(cfg: dict, repeat: bool, n: int):
    """``(the loader's iterator after n batches, its state then, through JSON)``."""
    loader = build_train_loader(cfg, repeat=repeat)
    it = iter(loader)
    for _ in range(n):
        next(it)
    return it, json.loads(json.dumps(loader.state_dict()))


def restored(cfg: dict, repeat: bool, state: dict):
    again = build_train_loader(cfg, repeat=repeat)
    again.load_state_dict(state)
    return again


def test_a_resume_in_the_middle_of_an_epoch_draws_what_the_first_run_drew(mix):
    cfg = config(mix, 2)
    it, state = saved_after(cfg, False, 2)
    rest = list(it)
    resumed = list(restored(cfg, False, state))
    assert len(resumed) == len(rest) > 0 and all(batches_equal(a, b) for a, b in zip(rest, resumed))


def test_a_resume_across_passes_restores_each_buffered_samples_own_pass(mix):
    """Saved while the shuffle and packing buffers hold samples of two passes (a repeating loader,
    past its third pass): the restored samples keep the pass their restore keys name, so the next
    batches are those of the uninterrupted run, bit for bit."""
    cfg = config(mix, 0)
    it, state = saved_after(cfg, True, 12)
    assert '"Webdataset", ' in json.dumps(state) and any(p >= 2 for p in passes_in(state)), passes_in(state)
    rest = [next(it) for _ in range(8)]
    resumed = [b for _, b in zip(range(8), restored(cfg, True, state))]
    assert all(batches_equal(a, b) for a, b in zip(rest, resumed))


def passes_in(value) -> list[int]:
    """The passes the restore keys of a saved state name."""
    if isinstance(value, dict):
        return [p for v in value.values() for p in passes_in(v)]
    if isinstance(value, list):
        flat = [p for v in value for p in passes_in(v)]
        at = [i for i, v in enumerate(value) if v == "Webdataset"]
        return flat + [value[i + 2] for i in at if i + 2 < len(value) and isinstance(value[i + 2], int)]
    return []


def test_the_next_pass_draws_anew_and_two_runs_agree(mix):
    """Four passes of a repeating loader: most augmented samples are planned in more than one way
    over them (the draw keys name the pass; a draw may repeat by chance: an image's grid stays
    unchanged half the time here); a second run with the same seed reads the same four passes,
    another seed other draws."""
    def passes(seed: int, n: int = 4) -> list[dict]:
        # no shuffle buffer: a sample's k-th time is its k-th pass (a buffer may yield a sample's
        # next pass before the end of this one)
        cfg = config(mix, 0, seed=seed, shuffle_buffer_size=None)
        out: list[dict] = [{} for _ in range(n)]
        seen: dict = {}
        for _, batch in zip(range(400), build_train_loader(cfg, repeat=True)):
            for key, plan in per_sample([batch]).items():
                seen[key] = seen.get(key, 0) + 1
                if seen[key] <= n:
                    out[seen[key] - 1][key] = plan
            if len(out[-1]) == N:
                return out
        raise AssertionError(f"{n} passes not read in 400 batches: {[len(p) for p in out]}")

    runs = passes(3)
    augmented = set(grids(runs[0], "image")) | set(grids(runs[0], "video"))
    varied = [k for k in augmented if len({run[k] for run in runs}) > 1]
    assert len(augmented) == 12 and len(varied) >= 10, (len(varied), sorted(augmented - set(varied)))
    assert passes(3) == runs
    other = passes(4, 1)[0]
    assert any(other[k] != runs[0][k] for k in augmented)


def test_validation_draws_as_the_first_pass_every_time_and_never_tiles(mix):
    """Validation reads the ``data_augment`` leaf without the tiling augmentation (training only,
    as NeMo-RL) and with the video draws of pass 0, the same at every evaluation."""
    cfg = config(mix, 0)
    cfg["data"]["validation"] = {"path": str(mix)}
    evaluation = per_sample(build_val_loader(cfg))
    plain = per_sample(build_train_loader(config(mix, 0, augment=False), repeat=False))
    assert grids(evaluation, "image") == grids(plain, "image")
    assert per_sample(build_val_loader(cfg)) == evaluation


def test_preview_shows_each_items_draw(mix, tmp_path):
    """``preview`` names, per video, the drawn scale and the jitter, and per image of a
    ``data_augment`` leaf what the tiling did to its grid (JSON and text)."""
    import io

    from energon_nemotron.inspection.preview import run_preview

    path = tmp_path / "loader.yaml"
    path.write_text(yaml.safe_dump(config(mix, 0)))
    out = io.StringIO()
    assert run_preview(str(path), batches=None, as_json=True, out=out) == 0
    media = [m for line in out.getvalue().splitlines() if line.startswith("{")
             for m in json.loads(line).get("media", [])]
    notes = {m["kind"]: set() for m in media}
    for m in media:
        notes[m["kind"]].add(m.get("augment"))
    assert all(n and n.startswith("scale ") and n.endswith(", jitter") for n in notes["video"]), notes
    assert all(n == "tiling: grid unchanged" or n.startswith("tiling ") for n in notes["image"]), notes
    assert any(n != "tiling: grid unchanged" for n in notes["image"]) and notes["audio"] == {None}
    text = io.StringIO()
    assert run_preview(str(path), batches=2, color="never", out=text) == 0
    assert "augment scale " in text.getvalue() or "augment tiling" in text.getvalue()


def test_the_drawn_plans_price_the_packs_and_survive_reread_media(mix, monkeypatch):
    """The draws enter phase 1's plan: every batch's cost is what the pre-packer planned for its
    samples from their headers; with ``packing.max_buffer_bytes`` small enough that media bytes are
    dropped from the buffer and read again for their pack, every sample is planned as without it."""
    from energon_nemotron.encoders import pre_pack
    from energon_nemotron.loading.stats import batch_cost
    from test_balance import loader_packing, planned_extras

    planned = planned_extras(monkeypatch)
    cfg = config(mix, 0)
    model = pre_pack.cost_model(loader_packing(cfg))
    batches = list(build_train_loader(cfg, repeat=False))
    for batch in batches:
        keys = [k for row in batch.sample_keys for k in row]
        assert batch_cost(batch, model) == pytest.approx(batch.batch_size * batch.seq_length +
                                                         sum(planned[k] for k in keys), rel=1e-9)
    small = config(mix, 0)
    small["packing"]["max_buffer_bytes"] = 0              # no media bytes held: each read again for its pack
    loader = build_train_loader(small, repeat=False)
    again = list(loader)
    assert per_sample(again) == per_sample(batches)
    assert len(again) == len(batches) and all(batches_equal(a, b) for a, b in zip(again, batches))
    assert loader.telemetry()["buffer_bytes"]["reread"] > 0


def test_an_elastic_resume_keeps_every_samples_draw(mix):
    """Two ranks (2 workers each) save after 2 batches; one rank with 1 worker reads the rest of the
    epoch: what the ranks had read and what it reads are every sample once, each planned as in an
    uninterrupted epoch on one rank."""
    from energon_nemotron.resume import merge_rank_states

    read, states = {}, []
    for rank in range(2):
        loader = build_train_loader(config(mix, 2), repeat=False, dp_rank=rank, dp_size=2)
        it = iter(loader)
        read.update(per_sample([next(it), next(it)]))
        states.append(loader.state_dict())
        list(it)                                         # read to its end: its workers exit now
    one = build_train_loader(config(mix, 1), repeat=False)
    one.load_state_dict(merge_rank_states(states), elastic=True)
    rest = per_sample(one)
    assert not set(rest) & set(read) and {**read, **rest} == per_sample(build_train_loader(config(mix, 0),
                                                                                           repeat=False))
