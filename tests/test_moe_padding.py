"""MoE routing statistics are not changed by packing (issue 28, item 4): megatron-core 0.19.2's own
``TopKRouter`` (aux loss, z-loss, aux-loss-free expert bias; ``tests/references/moe_router.py``,
a subprocess) routes one packed row of the library with its ``padding_mask`` exactly as it routes
the same samples' tokens unpacked, and differently without the mask: the drift the mask prevents.
megatron-core's own masked expert-bias count fails on the mask's shape; the library's hook
(``integrations.moe_router.mask_expert_bias_counts``) fixes it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from energon_data import text_config, text_dataset
from energon_nemotron.loading import build_train_loader

RUNNER = Path(__file__).parent / "references" / "moe_router.py"
EXPERTS, TOPK = 8, 2


@pytest.fixture(scope="module")
def routed(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe")
    ds, _ = text_dataset(root / "ds", "openai_messages", n=16)
    cfg = text_config(ds, workers=0, seq_length=1024,
                      packing={"algorithm": "first_fit_decreasing", "buffer_size": 8, "pad_multiple": 64})
    batch = next(iter(build_train_loader(cfg, repeat=False)))
    mask = batch.padding_mask[0]
    assert 0 < int(mask.sum()) < mask.numel()
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(mask.numel(), EXPERTS, generator=g)
    # every pad is the same token, so the same hidden state and the same logits: it favours two experts
    logits[mask] = torch.tensor([3.0, 2.5] + [-1.0] * (EXPERTS - 2))
    torch.save({"logits": logits, "padding_mask": mask, "topk": TOPK}, root / "case.pt")
    res = subprocess.run([sys.executable, str(RUNNER), str(root / "case.pt"), str(root / "out.pt")],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    return torch.load(root / "out.pt")


def test_megatron_cores_masked_expert_bias_count_fails_on_the_mask_shape(routed):
    assert "must match the size of tensor b" in routed["raw_masked"]["error"]


def test_with_the_padding_mask_packing_changes_no_routing_statistic(routed):
    masked, unpacked = routed["masked"], routed["unpacked"]
    assert torch.equal(masked["tokens_per_expert"], unpacked["tokens_per_expert"])
    assert masked["aux_loss"] == pytest.approx(unpacked["aux_loss"], rel=1e-5)
    assert masked["z_loss"] == pytest.approx(unpacked["z_loss"], rel=1e-5)
    assert torch.equal(masked["expert_bias"], unpacked["expert_bias"])


def test_without_it_the_pads_skew_expert_load_aux_loss_and_bias(routed):
    unmasked, unpacked = routed["unmasked"], routed["unpacked"]
    extra = unmasked["tokens_per_expert"] - unpacked["tokens_per_expert"]
    assert extra[:2].min() > 0 and float(extra[2:].sum()) == 0.0           # the pads all went to experts 0, 1
    assert unmasked["aux_loss"] != pytest.approx(unpacked["aux_loss"], rel=1e-3)
    assert not torch.equal(unmasked["expert_bias"], unpacked["expert_bias"])
