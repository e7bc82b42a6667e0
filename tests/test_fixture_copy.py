"""The vendored Megatron-LM fixtures equal the project's shared copy (when a checkout has it)."""

from __future__ import annotations

import pytest

from conftest import MEGATRON_FIXTURES, REPO

CANDIDATES = [REPO / "shared" / "fixtures" / "megatron_lm_sft", REPO.parent / "shared" / "fixtures" / "megatron_lm_sft"]


def test_vendored_fixtures_match_shared():
    shared = next((p for p in CANDIDATES if p.is_dir()), None)
    if shared is None:
        pytest.skip("no shared/ folder beside this checkout")
    files = sorted(p.relative_to(shared) for p in shared.rglob("*") if p.is_file() and p.name != "README.md")
    assert files, "shared fixtures folder is empty"
    for rel in files:
        assert (MEGATRON_FIXTURES / rel).read_bytes() == (shared / rel).read_bytes(), rel
