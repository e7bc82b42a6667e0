"""Runs the official Nemotron Omni processor (``tests/references/hf_omni_processor.py``) in the
``.venv-ref`` environment on the generated corpus (``tests/media_corpus.py``) and loads its outputs.

``.venv-ref`` is built by ``make references`` (``make test`` does it); where it is missing, the
tests that need it fail with that instruction, they never skip.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from media_corpus import build_corpus

REPO = Path(__file__).resolve().parents[1]
REF_PYTHON_ENV = "ENERGON_NEMOTRON_REF_PYTHON"
SCRIPT = REPO / "tests" / "references" / "hf_omni_processor.py"
TOKENIZER = REPO / "energon_nemotron" / "demo" / "tokenizer"


def ref_python() -> Path:
    """The python of ``.venv-ref`` (``$ENERGON_NEMOTRON_REF_PYTHON`` wins); fails the test if missing."""
    path = Path(os.environ.get(REF_PYTHON_ENV) or REPO / ".venv-ref" / "bin" / "python")
    if not path.exists():
        pytest.fail(f"the reference environment is missing ({path}); run `make references` to build .venv-ref",
                    pytrace=False)
    return path


@dataclass
class Reference:
    corpus: Path
    out: Path
    manifest: dict
    results: dict

    def array(self, kind: str, name: str) -> np.ndarray:
        return np.load(self.out / kind / f"{name}.npy")

    def items(self, kind: str) -> list[dict]:
        return self.manifest[kind]


def run_reference(folder: Path, kinds=("images", "videos", "audio")) -> Reference:
    """Build the corpus under ``folder / "corpus"`` and run the processor on it into ``folder / "hf"``."""
    corpus, out = folder / "corpus", folder / "hf"
    manifest = build_corpus(corpus, kinds)
    proc = subprocess.run([str(ref_python()), str(SCRIPT), str(corpus), str(out), "--tokenizer", str(TOKENIZER),
                           "--only", ",".join(kinds)], capture_output=True, text=True, timeout=900)
    if proc.returncode:
        pytest.fail(f"the reference processor failed:\n{proc.stderr[-4000:]}", pytrace=False)
    return Reference(corpus, out, manifest, json.loads((out / "results.json").read_text()))
