"""``examples/bridge_smoke.py``, the smoke a user runs in their Megatron-Bridge environment, runs here.

This machine has no Megatron-Bridge installed: as ``tests/test_megatron_bridge.py`` does, the script
runs in a subprocess on the reference wheels ``make references`` unpacks (Bridge 0.6.2,
megatron-core 0.19.2) with the shims of ``tests/references/bridge_runtime.py``. The script itself
has no hook for them: a few lines (``PRELUDE``) activate the shims, then run it with ``runpy`` as
``python examples/bridge_smoke.py`` would. A missing reference fails these tests, never skips them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from references.bridge import BRIDGE_VERSION, bridge_root
from references.bridge_runtime import MCORE_VERSION, mcore_root

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "examples" / "bridge_smoke.py"
#: argv: SCRIPT ARGS...; Bridge's code from the reference cache, then the script as __main__
PRELUDE = """
import runpy, sys
from references.bridge_runtime import activate
activate()
from references.bridge import import_bridge_module
import_bridge_module("megatron.bridge.package_info")    # the finder for Bridge's packages, without their __init__s
script, sys.argv = sys.argv[1], sys.argv[1:]
runpy.run_path(script, run_name="__main__")
"""
#: argv: SCRIPT ARGS...; ``megatron.bridge`` made unimportable, then the script
NO_BRIDGE = """
import runpy, sys
sys.modules["megatron.bridge"] = None
script, sys.argv = sys.argv[1], sys.argv[1:]
runpy.run_path(script, run_name="__main__")
"""


def run_script(prelude: str, *args: str) -> subprocess.CompletedProcess:
    path = [str(REPO / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    return subprocess.run([sys.executable, "-c", prelude, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=600, cwd=REPO, env=env)


def test_bridge_smoke_runs_on_bridges_own_code(tmp_path):
    bridge_root()          # a missing reference raises here: the test fails, it does not skip
    mcore_root()
    proc = run_script(PRELUDE, "--out", str(tmp_path / "smoke"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("OK ")]
    assert [line.split(":")[0] for line in lines] == [
        "OK imports", "OK demo data",
        "OK nemotron_omni_step batch 0", "OK nemotron_omni_step batch 1", "OK nemotron_omni_step",
        "OK gpt_step batch 0", "OK gpt_step batch 1"], proc.stdout
    assert f"megatron-bridge {BRIDGE_VERSION}" in lines[0] and f"megatron-core {MCORE_VERSION}" in lines[0], lines[0]
    assert "image, video and audio all reached the step" in lines[4]
    assert proc.stdout.rstrip().endswith("bridge smoke OK")
    assert "FAILED" not in proc.stdout + proc.stderr
    out = tmp_path / "smoke"
    assert (out / "encoder_omni.yaml").is_file() and (out / "encoder_gpt.yaml").is_file()
    assert (out / "multimodal_dataset" / ".nv-meta" / "dataset.yaml").is_file()


def test_bridge_smoke_names_what_is_missing(tmp_path):
    proc = run_script(NO_BRIDGE, "--out", str(tmp_path / "smoke"))
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "megatron.bridge is not importable" in proc.stderr
    assert f"megatron-bridge=={BRIDGE_VERSION}" in proc.stderr and "docs/install.md" in proc.stderr
    assert "OK " not in proc.stdout
