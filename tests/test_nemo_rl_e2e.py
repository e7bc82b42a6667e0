"""End to end (lands with the NeMo-RL cooker names and prompt formats): the docs' shape-B config on a
generated blend with 0 and 2 workers, NeMo-RL's batches, its state envelope, elastic resume."""

from __future__ import annotations

import copy
import json
import multiprocessing
from collections import Counter

import pytest
import torch
import yaml

from pathlib import Path

from energon_nemotron.errors import ConfigError
from energon_nemotron.integrations.nemo_rl.loader import build_nemo_rl_loader
from energon_nemotron.integrations.nemo_rl import to_nemo_rl_packed
from energon_nemotron.integrations.nemo_rl.config import from_nemo_rl
from energon_nemotron.loading import build_train_loader
from test_nemo_rl_batches import assert_prepacked_accepts, assert_same_loss
from test_nemo_rl_config import SHAPE_A, blend, master, shape_b  # noqa: F401  (the fixture and the configs)

#: the test tokenizer with the ids NeMo-RL's nemotron6-moe checks (tests/fixtures/nemo_rl/README.md)
FIXTURE_TOKENIZER = Path(__file__).parent / "fixtures" / "nemo_rl" / "tokenizer" / "nemotron6"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    """The fixture tokenizer plus the image frame tokens (``<img>``, ``</img>``) the media path needs,
    added after its last id (the ids NeMo-RL checks stay where they are)."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(FIXTURE_TOKENIZER)
    tok.add_special_tokens({"additional_special_tokens": ["<img>", "</img>"]})
    out = tmp_path_factory.mktemp("nemotron6_tokenizer")
    tok.save_pretrained(out)
    return out


# -- end to end: NeMo-RL's batches and its checkpoint envelope -----------------------------------------
def take(loader, n: int) -> list[dict]:
    it, out = iter(loader), []
    for _ in range(n):
        out.append(next(it))
    return out


def same(a: dict, b: dict) -> bool:
    return torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["token_mask"], b["token_mask"]) \
        and a["source_ids"] == b["source_ids"]


def assert_the_librarys_loss(cfg: dict, tokenizer: Path, batches: list[dict]) -> None:
    """The same config's library batches: NeMo-RL's loss over ``batches`` equals the library's, pack
    by pack, on the same trained tokens; every leaf of the blend, with its media, is in them."""
    library = build_train_loader(from_nemo_rl(cfg, tokenizer=tokenizer).loader)
    kinds, leaves = set(), set()
    for n, (ours, theirs) in enumerate(zip(library, batches)):
        assert same(to_nemo_rl_packed(ours), theirs)
        assert_same_loss(ours, theirs, vocab=ours.tokens.max().item() + 1, seed=n)
        assert_prepacked_accepts(theirs)
        kinds |= {s.kind for row in ours.media_spans for s in row}
        leaves |= {k.split(".tar:")[-1].rstrip("0123456789").removesuffix(".jsonl:")
                   for row in ours.sample_keys for k in row}
    assert "image" in kinds and leaves == {"vqa", "g", "t"}      # every leaf, its cooker, its media


def test_shape_a_end_to_end(blend, tokenizer):
    """The docs' shape-A config (packing from policy.sequence_packing) yields NeMo-RL's batches."""
    cfg = master(SHAPE_A, data__train__path=str(blend / "blend.yaml"))
    cfg["data"]["energon"]["num_workers"] = 0
    batches = take(build_nemo_rl_loader(cfg, tokenizer=tokenizer), 3)
    assert all(b["input_ids"].shape == (2, 4096) for b in batches)
    assert_the_librarys_loss(cfg, tokenizer, batches)


@pytest.mark.parametrize("workers", [0, 2])
def test_end_to_end_batches_and_exact_resume(blend, tokenizer, workers):
    before = set(multiprocessing.active_children())
    cfg = shape_b(blend, workers)
    first = build_nemo_rl_loader(cfg, tokenizer=tokenizer)
    batches = take(first, 4)
    for b in batches:                  # gbs 2 on one DP rank: two packs per batch
        assert b["input_ids"].shape == (2, 4096) and b["token_mask"].shape == (2, 4096)
        assert b["sample_mask"].tolist() == [1.0, 1.0] and float(b["token_mask"][:, 0].sum()) == 0.0
        for row in range(2):           # no source's first token is trained
            starts = b["cu_seqlens_padded"][row][:-1].long()
            assert float(b["token_mask"][row, starts].sum()) == 0.0
    assert_the_librarys_loss(cfg, tokenizer, batches)
    state = first.state_dict()
    assert set(state) == {"backend", "format_version", "fingerprint", "identity", "loader_state"}
    assert state["loader_state"].dtype == torch.uint8 and json.dumps(state["identity"])
    after = take(first, 2)
    again = build_nemo_rl_loader(cfg, tokenizer=tokenizer)
    again.load_state_dict(state)
    resumed = take(again, 2)
    assert all(same(a, b) for a, b in zip(after, resumed))
    started = [p for p in multiprocessing.active_children() if p not in before]
    assert len(started) == 2 * workers
    first.close()
    again.close()                      # both mid-epoch: their workers end on their own, at once
    assert [p.exitcode for p in started] == [0] * len(started)


def test_a_changed_identity_is_refused_with_the_keys(blend, tokenizer):
    state = build_nemo_rl_loader(shape_b(blend), tokenizer=tokenizer).state_dict()
    changed = shape_b(blend)
    changed["data"]["energon"]["task_encoder"]["packing"]["buffer_size"] = 32
    other = build_nemo_rl_loader(changed, tokenizer=tokenizer)
    with pytest.raises(ConfigError, match=r"the loader identity changed: .*loader.packing.buffer_size 16 -> 32"):
        other.load_state_dict(state)
    damaged = copy.copy(state)
    damaged["format_version"] = 2
    with pytest.raises(ConfigError, match=r"unsupported state format_version 2"):
        build_nemo_rl_loader(shape_b(blend), tokenizer=tokenizer).load_state_dict(damaged)


def test_elastic_resume_across_a_dp_change(blend, tokenizer):
    """Two DP ranks save; one rank resumes from both envelopes (its per-rank batch twice theirs, the
    global batch unchanged): together the three read no sample more often than the epoch holds it
    (NeMo-RL refuses a DP change)."""
    cfg = shape_b(blend, shuffle_buffer_size=4)      # buffers well under a pass: the passes do not overlap
    cfg["data"]["energon"]["task_encoder"]["packing"]["buffer_size"] = 4
    ranks = [build_nemo_rl_loader(cfg, tokenizer=tokenizer, dp_rank=r, dp_size=2) for r in range(2)]
    seen = [k for r in ranks for b in take(r, 1) for row in b["source_ids"] for k in row]
    states = [r.state_dict() for r in ranks]
    alone = build_nemo_rl_loader(cfg, tokenizer=tokenizer)
    with pytest.raises(ConfigError, match=r"logical_world_size 2 -> 1"):
        alone.load_state_dict(states[0])
    alone = build_nemo_rl_loader(cfg, tokenizer=tokenizer)
    alone.load_elastic(states)
    rest = [k for b in take(alone, 1) for row in b["source_ids"] for k in row]
    # the blend reads the text leaf twice per epoch (repetitions: 2), the image leaves once
    counts = Counter(seen) + Counter(rest)
    assert rest and all(n <= (2 if k.startswith("t") else 1) for k, n in counts.items()), counts


def test_production_augmentation_loads_as_written_and_draws_alike_twice(blend, tokenizer):
    """Shape B as written (production's augmentation: NeMo-RL's frame selection, a scale up to 4 on
    the resolution; tiling probability 0.4) over the blend with its ``general`` leaf marked
    ``data_augment: true``: that leaf's image grids are tiled (some differ from the unmarked leaf's),
    the other leaves' are not, and two runs with one seed give the same batches."""
    from energon_nemotron.parallel.broadcast import batches_equal

    meta = yaml.safe_load((blend / "blend.yaml").read_text())
    for leaf in meta["splits"]["train"]["blend_epochized"]:
        if leaf["subflavors"].get("name") == "general":
            leaf["subflavors"]["data_augment"] = True
    (blend / "blend_augment.yaml").write_text(yaml.safe_dump(meta))

    def image_grids(path: Path) -> tuple[dict, list]:
        cfg = shape_b(blend)
        cfg["data"]["train"]["path"] = str(path)
        batches = list(build_train_loader(from_nemo_rl(cfg, tokenizer=tokenizer).loader, repeat=False))
        return {s.sample_key: s.grid for b in batches for row in b.media_spans for s in row if s.kind == "image"}, batches

    plain, _ = image_grids(blend / "blend.yaml")
    tiled, batches = image_grids(blend / "blend_augment.yaml")
    assert set(plain) == set(tiled)
    changed = {k for k in plain if plain[k] != tiled[k]}
    assert changed and all(".tar:g" in k for k in changed), changed            # the general leaf only
    _, again = image_grids(blend / "blend_augment.yaml")
    assert len(again) == len(batches) and all(batches_equal(a, b) for a, b in zip(batches, again))
