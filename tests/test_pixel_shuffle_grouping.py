"""Which vision patches become one language-model token (issue 28, item 5): megatron-core 0.19.2's
``pixel_shuffle`` on the packed dynamic-resolution path of ``LLaVAModel`` (Bridge's
``nemotron_omni`` provider, ``h``/``w`` given) merges 1x4 raster strips of the patch grid, while
``transformers``' Nemotron Omni model (5.24, what the model is served with) merges 2x2 blocks. Both
functions run as shipped, each in its own environment, on a grid whose features are the patch
indices; the test pins the difference the docs describe beside the ``nemotron_omni`` preset."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hf_reference import ref_python

H, W = 4, 6                                    # a patch grid (rows, columns), both even
TESTS = Path(__file__).parent

MCORE = f"""
import json, sys, warnings
sys.path.insert(0, {str(TESTS)!r})
warnings.simplefilter("ignore")
from references.bridge_runtime import activate
activate()
import torch
torch.cuda.current_device = lambda: "cpu"
from megatron.core.models.multimodal.llava_model import pixel_shuffle
x = torch.arange({H * W}, dtype=torch.float32).reshape(1, {H * W}, 1)
print(json.dumps(pixel_shuffle(x, h={H}, w={W}).reshape(-1, 4).long().tolist()))
"""

HF = f"""
import json
import torch
from transformers.models.nemotron_h_omni import modeling_nemotron_h_omni as m
model = next(v for k, v in vars(m).items() if isinstance(v, type) and hasattr(v, "pixel_shuffle") and hasattr(v, "project_vision_features"))
x = torch.arange({H * W}, dtype=torch.float32).reshape(1, {H}, {W}, 1)
print(json.dumps(model.pixel_shuffle(None, x, 0.5).reshape(-1, 4).long().tolist()))
"""


def groups(python: str, code: str) -> list[list[int]]:
    res = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_megatron_core_merges_raster_strips_where_transformers_merges_blocks():
    strips = [[4 * k + j for j in range(4)] for k in range(H * W // 4)]
    blocks = [sorted([r * W + c, r * W + c + 1, (r + 1) * W + c, (r + 1) * W + c + 1])
              for r in range(0, H, 2) for c in range(0, W, 2)]
    mcore = groups(sys.executable, MCORE)
    hf = groups(str(ref_python()), HF)
    assert mcore == strips                                            # 1x4 strips, in raster order
    assert sorted(map(sorted, hf)) == sorted(blocks)                  # 2x2 blocks
    assert {tuple(sorted(g)) for g in mcore} & {tuple(b) for b in blocks} == set()   # no token alike
