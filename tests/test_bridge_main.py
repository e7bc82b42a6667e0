"""The expanded output (``output: nemotron_omni_expanded``) against Megatron-Bridge main's own code.

Bridge main is not on PyPI: ``tests/references/bridge_main_fixtures.py`` ran its
``nemotron_omni_step.forward_step`` and ``NemotronOmniModel.forward`` (commit in the fixture; the
runner, ``bridge_main_merge.py``, says what stands in for what) on the rows of
``tests/bridge_main_cases.py`` and kept what the model did in ``tests/fixtures/bridge_main/``. Here
the rows are rebuilt, checked to be the ones the fixtures were made from, and every position the
model merged and every CP rank's share is compared with the project's row.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import torch

from bridge_main_cases import BRIDGE_MAIN_COMMIT, FLOAT_KEYS, build_cases, fixture_inputs
from energon_nemotron.media.audio import audio_tokens
from energon_nemotron.parallel.context_parallel import partition_indices

FIXTURE = Path(__file__).parent / "fixtures" / "bridge_main" / "results.pt.gz"


@pytest.fixture(scope="module")
def fixture():
    with gzip.open(FIXTURE, "rb") as f:
        return torch.load(f, weights_only=False)


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    return {c["name"]: c for c in build_cases(tmp_path_factory.mktemp("bridge_main"))}


@pytest.fixture(scope="module")
def results(fixture):
    return {r["name"]: r for r in fixture["results"]}


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a.to(torch.int64), b.to(torch.int64))
    return a == b


def test_the_rows_are_those_the_fixtures_were_made_from(fixture, cases):
    assert fixture["commit"] == BRIDGE_MAIN_COMMIT
    assert [c["name"] for c in fixture["cases"]] == list(cases)
    for stored in fixture["cases"]:
        case = cases[stored["name"]]
        assert stored["cp_size"] == case["cp_size"] and stored["model"] == case["model"], stored["name"]
        fresh = fixture_inputs(case)
        assert sorted(stored["inputs"]) == sorted(fresh), stored["name"]
        for key, value in fresh.items():
            assert _same(stored["inputs"][key], value), (stored["name"], key)
        assert all(key in FLOAT_KEYS for key, v in fresh.items() if isinstance(v, tuple))


def test_the_cases_cover_what_the_issue_names(cases):
    kinds = {name: {s.kind for s in c["packed"].media_spans[0]} for name, c in cases.items()}
    assert {"image", "audio"} <= kinds["dynamic-0"] and {"image", "video", "audio"} <= kinds["temporal-0"]
    assert {"video"} <= kinds["temporal-cp2-0"] | kinds["temporal-cp2-1"] and kinds["text-0"] == set()
    assert sorted(s.clips for s in cases["audio-0"]["packed"].media_spans[0]) == [1, 1, 1, 2]
    assert {c["cp_size"] for c in cases.values()} == {1, 2}
    assert len(cases["single-0"]["packed"].cu_seqlens[0]) == 2


def test_bridge_main_merges_every_position_as_the_project_row_holds_it(cases, results):
    """ids (the merged embeddings spell each position's id: text, <image>, <so_embedding>), labels,
    the model's loss mask, positions and the padding mask, on every CP rank, in that rank's order."""
    checked = 0
    for name, case in cases.items():
        if case["expect"] == "refused":
            continue
        got, batch = results[name], case["packed"]
        assert got["ok"], (name, got["error"])
        cp = case["cp_size"]
        assert len(got["ranks"]) == cp
        for rank, r in enumerate(got["ranks"]):
            if cp == 1:
                assert r["index"] is None, name
                idx = torch.arange(batch.seq_length)
            else:
                idx = partition_indices(batch.cu_seqlens_padded[0], cp, rank)
                assert torch.equal(r["index"].to(torch.int64), idx), (name, rank)
            for key, want in (("merged_ids", batch.tokens), ("labels", batch.labels),
                              ("position_ids", batch.position_ids)):
                assert torch.equal(r[key].to(torch.int64), want[0][idx]), (name, rank, key)
            assert torch.equal(r["loss_mask"].float(), batch.loss_mask[0][idx]), (name, rank)
            assert torch.equal(r["padding_mask"][0], batch.padding_mask[0][idx]), (name, rank)
            checked += idx.numel()
        assert sum(r["loss_tokens"] for r in got["ranks"]) == int(batch.loss_mask[0].sum()) > 0, name
    assert checked > 40_000


def test_bridge_main_keeps_the_boundaries_and_goes_dense_on_a_single_segment(cases, results):
    for name, case in cases.items():
        if case["expect"] == "refused":
            continue
        batch, packed = case["packed"], results[name]["ranks"][0]["packed"]
        if name == "single-0":
            assert packed is None                       # a one-sample CP-1 pack takes the dense path
            continue
        real, padded = batch.cu_seqlens[0].tolist(), batch.cu_seqlens_padded[0].tolist()
        assert packed["cu_seqlens_q"] == packed["cu_seqlens_kv"] == real, name
        assert packed["cu_seqlens_q_padded"] == (padded if padded != real else None), name
        assert packed["max_seqlen_q"] == batch.max_seqlen[0] and packed["total_tokens"] == batch.seq_length


def test_bridge_main_projects_the_project_s_media_counts(cases, results):
    """The sound encoder's lengths are the <so_embedding> runs (from the valid L // 160 frames, as
    main's own collate counts), the vision packed-sequence params the per-unit patch counts."""
    for name, case in cases.items():
        if case["expect"] == "refused":
            continue
        batch, r = case["packed"], results[name]["ranks"][0]
        audio = [s for s in batch.media_spans[0] if s.is_audio]
        if audio:
            lengths = case["batch"]["sound_length"].tolist()
            assert r["sound_embedding_lengths"] == [audio_tokens(n) for n in lengths], name
            runs = [n for s in audio for _, n in s.runs]
            assert sum(runs) == sum(r["sound_embedding_lengths"]), name
        units = case["batch"].get("imgs_sizes")
        if units is not None:
            patches = [int(h) // 16 * int(w) // 16 for h, w in units.tolist()]
            assert r["vision_cu_seqlens"] == torch.tensor([0] + patches).cumsum(0).tolist(), name


def test_the_audio_rule_decides_whose_counts_a_row_has(cases, results):
    """Main's model projects what ``sound_length`` says: the 0.6.2 rule (1 + L // 160) is taken too,
    with one feature more on clips whose L // 160 is a multiple of 8 (the 10 s and 30 s clips); the
    expanded output's valid rule gives the counts of main's own collate (``collate_fn.py``)."""
    stft, valid = cases["control-stft-audio"], cases["audio-0"]
    assert results["control-stft-audio"]["ok"]
    got = results["control-stft-audio"]["ranks"][0]["sound_embedding_lengths"]
    ours = results["audio-0"]["ranks"][0]["sound_embedding_lengths"]
    frames_stft, frames_valid = stft["batch"]["sound_length"].tolist(), valid["batch"]["sound_length"].tolist()
    assert sorted(f - 1 for f in frames_stft) == sorted(frames_valid)
    assert sorted(got) != sorted(ours)
    assert sorted(got) == sorted(audio_tokens(f) for f in frames_stft)
    assert sum(got) - sum(ours) == sum((f - 1) % 8 == 0 for f in frames_stft) > 0


def test_bridge_main_refuses_the_0_6_2_compact_dict(results):
    got = results["control-compact"]
    assert not got["ok"] and got["error"].startswith("ValueError: The media token-validity mask must have the same "
                                                    "shape as input_ids"), got["error"]
