"""The package as a user's type checker sees it: the built wheel ships ``py.typed``, the README's
Python examples type-check against that wheel with basedpyright (0 errors), and a call that breaks
the public signatures is reported there (so the check reads the library's types, not ``Any``).
The package root's names are typed for the checker (a ``TYPE_CHECKING`` import of each, strict-clean)
while they are still loaded on first use at run time."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import energon_nemotron
from doc_blocks import REPO, parse_page

#: a user's file with calls the public signatures reject: (line, rule) of each expected error
WRONG_CALLS = '''from energon_nemotron import build_train_loader, load_state_file

loader = build_train_loader(42)
state = load_state_file("state.json", "extra")
'''
WRONG_EXPECTED = {(3, "reportArgumentType"), (4, "reportCallIssue")}


def basedpyright() -> str:
    """The checker installed beside this interpreter (``.[dev]``); missing is a failure."""
    found = Path(sys.executable).parent / "basedpyright"
    if not found.exists():
        found = Path(shutil.which("basedpyright") or "")
    assert found.name == "basedpyright" and found.exists(), "basedpyright is missing: `make install` installs .[dev]"
    return str(found)


def check(folder: Path, config: dict) -> dict:
    """basedpyright's JSON report for ``config`` (written to ``folder/pyrightconfig.json``), run
    with this interpreter's environment."""
    (folder / "pyrightconfig.json").write_text(json.dumps(config))
    out = subprocess.run([basedpyright(), "-p", str(folder / "pyrightconfig.json"), "--pythonpath", sys.executable,
                          "--outputjson"], capture_output=True, text=True, timeout=600, cwd=folder)
    assert out.stdout.strip(), out.stderr[-3000:]
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a copy of the sources (so that the build writes nothing into the repository)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(REPO / "energon_nemotron", src / "energon_nemotron",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                          "-w", str(tmp / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    (built,) = (tmp / "dist").glob("energon_nemotron-*.whl")
    return built


def test_wheel_ships_py_typed(wheel: Path):
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    assert "energon_nemotron/py.typed" in names
    assert "energon_nemotron/__init__.py" in names


def test_readme_examples_type_check_against_the_wheel(wheel: Path, tmp_path: Path):
    site, user = tmp_path / "site", tmp_path / "user"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    user.mkdir()
    blocks = [b for b in parse_page(REPO / "README.md").blocks if b.lang == "python"]
    assert len(blocks) >= 2, "the README's Python examples were not found"
    for b in blocks:
        (user / f"readme_line_{b.line}.py").write_text(b.text)
    (user / "wrong_calls.py").write_text(WRONG_CALLS)
    report = check(tmp_path, {"include": ["user"], "typeCheckingMode": "standard", "pythonVersion": "3.11",
                              "extraPaths": [str(site)], "reportMissingModuleSource": "error"})
    errors = [d for d in report["generalDiagnostics"] if d["severity"] == "error"]
    readme = [f"{Path(d['file']).name}:{d['range']['start']['line'] + 1}: {d['message']} ({d.get('rule')})"
              for d in errors if Path(d["file"]).name != "wrong_calls.py"]
    assert readme == [], "the README's examples do not type-check:\n" + "\n".join(readme)
    wrong = {(d["range"]["start"]["line"] + 1, d.get("rule")) for d in errors if Path(d["file"]).name == "wrong_calls.py"}
    assert wrong == WRONG_EXPECTED, f"the wrong calls gave {sorted(wrong)}: the checker did not read the library's types"
    assert report["summary"]["filesAnalyzed"] == len(blocks) + 1


def test_root_names_pass_strict(tmp_path: Path):
    """basedpyright's strict mode on the package root: every public name's type is fully known
    (no ``Unknown`` in a signature: parameters like ``dict[str, Any]``, registries with their item type)."""
    report = check(tmp_path, {"include": [str(REPO / "energon_nemotron" / "__init__.py")],
                              "typeCheckingMode": "strict", "pythonVersion": "3.11", "extraPaths": [str(REPO)]})
    errors = [f"{d['range']['start']['line'] + 1}: {d['message']}" for d in report["generalDiagnostics"]
              if d["severity"] == "error"]
    assert errors == [], "the package root is not strict-clean:\n" + "\n".join(errors)
    assert report["summary"]["filesAnalyzed"] == 1


def test_root_names_are_typed_and_still_lazy():
    """Every public name of the package root is imported under ``TYPE_CHECKING`` from the module
    ``_EXPORTS`` loads it from at run time, and ``__all__`` lists exactly them."""
    tree = ast.parse(Path(energon_nemotron.__file__).read_text())
    typed: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom), ast.dump(imp)
                typed.update({alias.name: str(imp.module) for alias in imp.names})
    assert typed == energon_nemotron._EXPORTS
    assert energon_nemotron.__all__ == ["__version__", *energon_nemotron._EXPORTS]
    probe = subprocess.run([sys.executable, "-c", "import sys, energon_nemotron; print('torch' in sys.modules)"],
                           capture_output=True, text=True, timeout=120)
    assert probe.stdout.strip() == "False", probe.stdout + probe.stderr
