"""NeMo-RL's batches: ``integrations.nemo_rl``.

- parity with NeMo-RL's own ``prepare_packed_sft_batch`` (``fixtures/nemo_rl/packed_batch.json``,
  made by ``fixtures/nemo_rl/make_packed_batch.py`` from NeMo-RL's source): the library's rows of
  the same sources, assembled by ``packing.assemble``, give the same ``input_ids``, ``token_mask``,
  ``cu_seqlens``, ``cu_seqlens_padded``, ``input_lengths``, ``sample_mask`` and ``source_ids``;
- the loss as NeMo-RL reads it (logits at t predict ``input_ids[t+1]``, weighted by
  ``token_mask[t+1]``) equals the library's (``loss_mask · NLL(labels)``) on every pack, with the
  same trained (row, position, target) triples: on the fixture's packs, on real Energon batches
  (text, images, video, audio) and on Megatron-LM's rows (``fixtures/megatron_lm_sft``);
- the ``megatron_sft_packed`` rows (NeMo-RL PR #3380) against Megatron-LM's reference tensors;
- the ``nemo_rl_packed`` task-encoder output.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml

from conftest import CP_SIZES, FIXTURE_TOKENIZER, FORMATS, TESTS, fixture_rows, load_reference
from energon_data import loader_yaml
from energon_nemotron.demo.datasets import multimodal_dataset
from energon_nemotron.demo.media import make_audio, make_image, make_video
from energon_nemotron.encoders import NemotronMultimodalOptions
from energon_nemotron.integrations.nemo_rl import to_nemo_rl_megatron_rows, to_nemo_rl_packed
from energon_nemotron.loading import build_task_encoder, build_train_loader
from energon_nemotron.loading.evened_validation import padding_batch
from energon_nemotron.media.image_pixels import patchify
from energon_nemotron.megatron_packed import MegatronSFTPackedEncoder, collate_rows
from energon_nemotron.packing import assemble_row, batch_rows
from energon_nemotron.registry import BATCH_OUTPUTS, COOKERS
from energon_nemotron.types import EncodedSource, PackedRow

FIXTURE = json.loads((TESTS / "fixtures" / "nemo_rl" / "packed_batch.json").read_text())
CASES = {c["name"]: c for c in FIXTURE["cases"]}
PACKING = {"algorithm": "best_fit_decreasing", "buffer_size": 6, "pad_multiple": 4, "max_sequences_per_bin": None}
SMALL_MEDIA = {"image": {"min_patches": 64, "max_patches": 256},
               "video": {"target_patches": 64, "min_frames": 2, "max_frames": 4}}


# -- the library's batch of the fixture's sources ---------------------------------------------------
def trained_flags(source: dict, only_final: bool) -> np.ndarray:
    """Which tokens the source trains (NeMo-RL's rule, the input both sides are given): assistant
    messages (only the last message with ``only_unmask_final``), none at multiplier 0."""
    flags: list[bool] = []
    messages = source["messages"]
    for j, m in enumerate(messages):
        on = j == len(messages) - 1 if only_final else m["role"] == "assistant"
        flags += [on and source["loss_multiplier"] != 0] * len(m["token_ids"])
    return np.array(flags, dtype=bool)


def library_batch(case: dict):
    """``PackedBatch`` of the case's packs (NeMo-RL's packer chose them), by ``packing.assemble``."""
    by_key = {s["key"]: s for s in case["sources"]}
    rows = []
    for keys in case["nemo_rl"]["source_ids"]:
        sources = [EncodedSource(k, np.array([t for m in by_key[k]["messages"] for t in m["token_ids"]], dtype=np.int64),
                                 trained_flags(by_key[k], case["only_unmask_final"])) for k in keys]
        fields = assemble_row(sources, case["pack_capacity"], case["pad_multiple"], case["pad_id"])
        rows.append(PackedRow(__key__=",".join(keys), __restore_key__=(), **fields))
    batch = batch_rows(rows)
    batch.validate()
    return batch


# -- the two readings of the loss -------------------------------------------------------------------
def nemo_rl_loss(logits: torch.Tensor, d: dict) -> tuple[torch.Tensor, set]:
    """NeMo-RL's NLL per pack: Σ_t token_mask[:, t+1] · −log p(input_ids[:, t+1] | logits[:, t]);
    and the trained (row, logit position, target) triples."""
    ids, mask = d["input_ids"], d["token_mask"]
    logp = torch.log_softmax(logits[:, :ids.shape[1] - 1].double(), -1).gather(-1, ids[:, 1:, None])[..., 0]
    loss = -(logp * mask[:, 1:]).sum(1)
    triples = {(r, t, int(ids[r, t + 1])) for r, t in (mask[:, 1:] != 0).nonzero().tolist()}
    return loss, triples


def library_loss(logits: torch.Tensor, batch) -> tuple[torch.Tensor, set]:
    """The library's NLL per row, Σ_t loss_mask[:, t] · −log p(labels[:, t] | logits[:, t]), and its triples."""
    labels = batch.labels.clamp(min=0)                  # -100 is never trained (validate checks it)
    logp = torch.log_softmax(logits.double(), -1).gather(-1, labels[..., None])[..., 0]
    loss = -(logp * batch.loss_mask).sum(1)
    triples = {(r, t, int(batch.labels[r, t])) for r, t in (batch.loss_mask != 0).nonzero().tolist()}
    return loss, triples


def assert_same_loss(batch, d: dict, vocab: int, seed: int = 0) -> None:
    """Both readings of the loss over the same random logits: the same NLL per pack and the same
    trained (row, position, target) triples; NeMo-RL's normaliser counts the library's trained labels.

    Every id either side holds must be below ``vocab``. The logits cover those ids only, renumbered
    in order on both sides (a bijection, so a target that differs still differs): a target's NLL
    depends on its own logit and the normaliser over the others, and logits over the whole
    vocabulary (rows × positions × ~20k ids, in float64) cost seconds a batch and test nothing more."""
    labels = batch.labels
    used = torch.unique(torch.cat([labels.clamp(min=0).flatten(), d["input_ids"].flatten().long()]))
    assert int(used.min()) >= 0 and int(used.max()) < vocab, (int(used.min()), int(used.max()), vocab)
    compact = batch.replace(labels=torch.where(labels < 0, labels, torch.searchsorted(used, labels.clamp(min=0))))
    compact_d = {**d, "input_ids": torch.searchsorted(used, d["input_ids"].long())}
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch.batch_size, batch.seq_length, used.numel(), generator=gen)
    ours, our_triples = library_loss(logits, compact)
    theirs, their_triples = nemo_rl_loss(logits, compact_d)
    assert our_triples == their_triples
    torch.testing.assert_close(theirs, ours, rtol=1e-12, atol=1e-9)
    # NeMo-RL's normaliser, Σ token_mask[:, 1:] · sample_mask, counts the library's trained labels
    assert int((d["token_mask"][:, 1:] * d["sample_mask"][:, None]).sum()) == batch.num_valid_tokens


def assert_prepacked_accepts(d: dict) -> None:
    """What NeMo-RL's ``_prepare_prepacked`` (``nemo_rl/models/megatron/data.py``) checks of one pack."""
    for i in range(d["input_ids"].shape[0]):
        cu, padded = d["cu_seqlens"][i], d["cu_seqlens_padded"][i]
        real, width = cu[1:] - cu[:-1], padded[1:] - padded[:-1]
        assert cu.dtype == padded.dtype == torch.int32 and cu.shape == padded.shape and cu.numel() >= 2
        assert int(cu[0]) == int(padded[0]) == 0 and int(padded[-1]) <= d["input_ids"].shape[1]
        assert bool((real > 0).all()) and bool((real <= width).all())


# -- parity with NeMo-RL's prepare_packed_sft_batch -------------------------------------------------
def test_fixture_is_nemo_rls_code():
    files = {f["path"]: f["commit"] for f in FIXTURE["meta"]["nemo_rl_files"]}
    assert files["nemo_rl/data/energon/multimodal/packing.py"].startswith("735f113b")
    assert FIXTURE["meta"]["command"].startswith("python tests/fixtures/nemo_rl/make_packed_batch.py")
    assert len(CASES) == 4 and sum(len(c["nemo_rl"]["source_ids"]) for c in CASES.values()) >= 16


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_nemo_rl_prepare_packed_sft_batch(name):
    case = CASES[name]
    ref = case["nemo_rl"]
    d = to_nemo_rl_packed(library_batch(case), pad_multiple=case["pad_multiple"])
    assert d["input_ids"].tolist() == ref["input_ids"] and str(d["input_ids"].dtype) == ref["input_ids_dtype"]
    assert d["token_mask"].tolist() == ref["token_mask"] and str(d["token_mask"].dtype) == ref["token_mask_dtype"]
    assert d["input_lengths"].tolist() == ref["input_lengths"]
    assert str(d["input_lengths"].dtype) == ref["input_lengths_dtype"]
    assert d["sample_mask"].tolist() == ref["sample_mask"] and str(d["sample_mask"].dtype) == ref["sample_mask_dtype"]
    assert [c.tolist() for c in d["cu_seqlens"]] == ref["cu_seqlens"]
    assert [c.tolist() for c in d["cu_seqlens_padded"]] == ref["cu_seqlens_padded"]
    assert str(d["cu_seqlens"].dtype) == str(d["cu_seqlens_padded"].dtype) == ref["cu_seqlens_dtype"]
    assert d["source_ids"] == ref["source_ids"]
    # NeMo-RL's input_lengths: the packs' physical lengths, the last padded boundary
    assert ref["input_lengths"] == [c[-1] for c in ref["cu_seqlens_padded"]]
    assert_prepacked_accepts(d)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_default_keeps_the_row_width(name):
    case = CASES[name]
    ref, s = case["nemo_rl"], case["pack_capacity"]
    batch = library_batch(case)
    d = to_nemo_rl_packed(batch)
    width = len(ref["input_ids"][0])
    assert d["input_ids"].shape == d["token_mask"].shape == (len(ref["input_ids"]), s)
    assert d["input_ids"][:, :width].tolist() == ref["input_ids"] and d["token_mask"][:, :width].tolist() == ref["token_mask"]
    assert not d["token_mask"][:, width:].any() and d["input_lengths"].tolist() == [s] * batch.batch_size
    assert [c.tolist() for c in d["cu_seqlens"]] == ref["cu_seqlens"]
    assert [c.tolist()[:-1] + [s] for c in d["cu_seqlens_padded"]] == [c[:-1] + [s] for c in ref["cu_seqlens_padded"]]
    assert d["sample_mask"].tolist() == ref["sample_mask"]
    assert_prepacked_accepts(d)
    assert_same_loss(batch, d, vocab=512)
    assert_same_loss(batch, to_nemo_rl_packed(batch, pad_multiple=case["pad_multiple"]), vocab=512, seed=1)


def test_padding_rows_train_nothing():
    batch = library_batch(CASES["multiple4"])
    d = to_nemo_rl_packed(padding_batch(batch, None))
    assert d["sample_mask"].tolist() == [0.0] * batch.batch_size and not d["token_mask"].any()
    empty = padding_batch(None, SimpleNamespace(task_encoder=SimpleNamespace(options={"seq_length": 16})))
    d = to_nemo_rl_packed(empty)                            # a rank with no data: one row of pad ids
    assert d["sample_mask"].tolist() == [0.0] and d["cu_seqlens"][0].tolist() == [0, 16]
    assert_prepacked_accepts(d)


def test_what_nemo_rl_cannot_state_is_refused():
    batch = library_batch(CASES["multiple4"])
    with pytest.raises(ValueError, match=r"pad_multiple=8"):
        to_nemo_rl_packed(batch, pad_multiple=8)
    labels = batch.labels.clone()
    labels[batch.loss_mask != 0] += 1                     # a trained target that is not the next token
    with pytest.raises(ValueError, match=r"not the next token"):
        to_nemo_rl_packed(batch.replace(labels=labels))
    last = batch.loss_mask.clone()
    last[0, -1] = 1
    with pytest.raises(ValueError, match=r"row 0: the last position is trained"):
        to_nemo_rl_packed(batch.replace(loss_mask=last))
    with pytest.raises(ValueError, match=r"megatron_sft_packed rows are Megatron-LM's"):
        to_nemo_rl_megatron_rows(batch)


def test_pixel_layout_is_nemo_rls_patchify():
    """NeMo-RL's ``patchify`` mode (notes: nemo_rl.md §1.2): [n, C, H, W] → reshape (n, C, H/P, P,
    W/P, P), permute (0, 2, 4, 1, 3, 5), [n·(H/P)·(W/P), C·P·P]; the library's patches, frame by frame."""
    x = torch.randn(3, 3, 32, 48, generator=torch.Generator().manual_seed(0))
    n, c, h, w = x.shape
    nemo = x.reshape(n, c, h // 16, 16, w // 16, 16).permute(0, 2, 4, 1, 3, 5).reshape(n * (h // 16) * (w // 16), -1)
    assert torch.equal(torch.cat([patchify(frame, 16) for frame in x]), nemo)


# -- real Energon batches ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def energon_batches(tmp_path_factory):
    root = tmp_path_factory.mktemp("nemo_rl_mm")
    multimodal_dataset(root / "mm", n=10)
    cfg = loader_yaml(root / "l.yaml", {"path": "mm"}, packing=PACKING, seq_length=1024, prompt_format="nemotron6",
                      extra_options=SMALL_MEDIA)
    settings = yaml.safe_load(cfg.read_text())
    settings["loader"]["batch_size"] = 2
    cfg.write_text(yaml.safe_dump(settings))
    return list(build_train_loader(cfg, repeat=False))


def test_energon_batches_loss_and_media(energon_batches, demo_tokenizer):
    kinds = set()
    for k, batch in enumerate(energon_batches):
        batch.validate()
        d = to_nemo_rl_packed(batch)
        assert_prepacked_accepts(d)
        assert_same_loss(batch, d, vocab=len(demo_tokenizer), seed=k)
        p = batch.media.patch_size
        for r in range(batch.batch_size):
            items = batch.media_items(r)
            kinds |= {s.kind for s, _ in items}
            visual = [i for s, i in items if not s.is_audio]
            audio = [i for s, i in items if s.is_audio]
            if batch.media.num_visual:
                pixels, sizes = d["pixel_values"][r], d["imgs_sizes"][r]
                assert torch.equal(pixels, torch.cat([batch.media.pixel_values[i] for i in visual])
                                   if visual else pixels.new_zeros((0, 3 * p * p)))
                assert sizes.dtype == torch.int32 and d["num_frames"][r].dtype == torch.int64
                assert pixels.shape[0] == int((sizes[:, 0] // p * (sizes[:, 1] // p)).sum())
                assert int(d["num_frames"][r].sum()) == sizes.shape[0]        # one frame or image unit a row
            if batch.media.num_audio:
                lengths = d["sound_length"][r]
                assert lengths.tolist() == [n for i in audio for n in batch.media.sound_lengths[i].tolist()]
                assert d["sound_clips"][r].shape[:2] == (lengths.numel(), int(batch.media.sound_lengths.as_tensor().max()))
        for key in ("pixel_values", "imgs_sizes", "num_frames", "sound_clips", "sound_length"):
            assert key not in d or len(d[key]) == batch.batch_size
    assert kinds == {"image", "video", "audio"}


# -- Megatron-LM's rows: the megatron_sft_packed path (#3380) and the token-aligned reading -------
@pytest.mark.parametrize("cp", CP_SIZES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_megatron_rows_match_megatron_lm(fmt, cp, fixture_tokenizer):
    encoder = MegatronSFTPackedEncoder(FIXTURE_TOKENIZER, 96, prompt_format=fmt, context_parallel_size=cp,
                                       allow_eos_pad=fmt == "default")
    rows = [encoder.encode(row, f"train.jsonl.packed:{i + 1}") for i, row in enumerate(fixture_rows())]
    batch = collate_rows(rows)
    ref = load_reference(fmt, cp)["rows"]
    d = to_nemo_rl_megatron_rows(batch)
    assert d["input_ids"].tolist() == [r["tokens"] for r in ref] and d["target_ids"].tolist() == [r["labels"] for r in ref]
    assert d["token_mask"].tolist() == [r["loss_mask"] for r in ref]
    assert d["position_ids"].tolist() == [r["position_ids"] for r in ref]
    k = max(len(r["cu_seqlens_stripped"]) for r in ref)
    assert d["packed_cu_seqlens"].tolist() == [r["cu_seqlens_stripped"] + [-1] * (k - len(r["cu_seqlens_stripped"]))
                                               for r in ref]
    assert d["packed_cu_seqlens"].dtype == torch.int32
    assert d["packed_cu_seqlens_lengths"].tolist() == [len(r["cu_seqlens_stripped"]) for r in ref]
    assert d["packed_max_seqlen"].tolist() == [r["max_seqlen"] for r in ref]
    assert d["input_lengths"].tolist() == [96, 96] and d["sample_mask"].tolist() == [1.0, 1.0]
    assert d["task_name"] == ["megatron_sft_packed"] * 2 and d["idx"] == batch.sample_keys
    # #3380's loss (MCore's per-position CE, unshifted): Σ token_mask · NLL(target_ids)
    logits = torch.randn(2, 96, len(fixture_tokenizer), generator=torch.Generator().manual_seed(cp))
    logp = torch.log_softmax(logits.double(), -1).gather(-1, d["target_ids"].clamp(min=0)[..., None])[..., 0]
    ours, _ = library_loss(logits, batch)
    torch.testing.assert_close(-(logp * d["token_mask"]).sum(1), ours, rtol=1e-12, atol=1e-9)
    # the same rows read the Energon-packed way (token-aligned mask, shifted loss) train the same targets
    assert_same_loss(batch, to_nemo_rl_packed(batch), vocab=len(fixture_tokenizer), seed=cp)
    pad = padding_batch(batch, None)
    assert to_nemo_rl_megatron_rows(pad, idx=[3, 4])["sample_mask"].tolist() == [0.0, 0.0]


# -- the nemo_rl_packed output of the task encoder ----------------------------------------------------
def crude(key: str, text: str, **members) -> dict:
    turns = [{"from": "human", "value": text}, {"from": "gpt", "value": "It is a test."}]
    return {"__key__": key, "__restore_key__": ("test", key), "__shard__": "parts/data-0.tar",
            "__subflavors__": {"cooker": "general_conversations"}, "__sources__": (),
            "json": json.dumps({"conversations": turns}).encode(), **members}


def encoder(tmp_path: Path, **extra):
    cfg = loader_yaml(tmp_path / f"c{len(extra)}.yaml", {"path": "unused"}, seq_length=2048, prompt_format="nemotron6",
                      extra_options={**SMALL_MEDIA, **extra})
    return build_task_encoder(cfg)


def test_the_encoder_output_yields_nemo_rls_dict(tmp_path):
    assert "nemo_rl_packed" in BATCH_OUTPUTS.names()
    assert NemotronMultimodalOptions(seq_length=64, output="nemo_rl_packed").output == "nemo_rl_packed"
    enc, plain = encoder(tmp_path, output="nemo_rl_packed"), encoder(tmp_path)
    cook = COOKERS.get("general_conversations")
    samples = [enc.postencode_sample(enc.preencode_sample(cook(c))) for c in (
        crude("i", "<image>\nWhat is it?", jpg=make_image(96, 64)),
        crude("v", "<video>\nWhat happens?", mp4=make_video(64, 48, seconds=1.0, fps=4)),
        crude("a", "<audio>\nWhat is said?", wav=make_audio(seconds=1.0)))]
    d = enc.batch(samples)                                 # one row per sample, three packs
    want = to_nemo_rl_packed(plain.batch(samples))
    assert sorted(d) == sorted(want) == sorted(["input_ids", "input_lengths", "token_mask", "sample_mask", "cu_seqlens",
                                                "cu_seqlens_padded", "source_ids", "pixel_values", "imgs_sizes",
                                                "num_frames", "sound_clips", "sound_length"])
    for key, value in d.items():
        if key == "source_ids":
            assert value == want[key]
        elif isinstance(value, torch.Tensor):
            assert torch.equal(value, want[key]), key
        else:                                              # a PackedTensor: items and their data
            assert torch.equal(value.offsets, want[key].offsets) and torch.equal(value.data, want[key].data), key
    assert d["source_ids"] == [["i"], ["v"], ["a"]] and d["sample_mask"].tolist() == [1.0, 1.0, 1.0]
    assert [len(d["pixel_values"][r]) > 0 for r in range(3)] == [True, True, False]
    assert d["num_frames"][1].tolist() == [int(d["imgs_sizes"][1].shape[0])] and d["sound_length"][2].numel() >= 1
