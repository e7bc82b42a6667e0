"""Docs that run: every code block of README.md and docs/*.md is run, validated or marked with the
reason it is not (the harness: tests/doc_blocks.py), the tables that mirror the code match it, the
names and paths the pages cite exist, and the Sphinx build has no warning."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from collections import Counter

import pytest

from doc_blocks import REPO, classify, code_spans, pages, parse_page, resolve, split_row

PAGES = [str(p.relative_to(REPO)) for p in pages()]
#: the paths of a machine that must not appear in a page
MACHINE_PATHS = re.compile(r"(?<![\w.])/(work|home|root|tmp|opt|mnt|Users)/")


def all_blocks():
    return [(page, b) for page in map(parse_page, pages()) for b in page.blocks]


def test_every_block_is_accounted_for():
    """Each block is run, validated, skipped with a reason, or plain text; nothing else passes."""
    counts: Counter = Counter()
    problems = []
    for page in map(parse_page, pages()):
        problems += page.errors
        for block in page.blocks:
            category, error = classify(block)
            if error:
                problems.append(error)
            counts[category] += 1
    assert not problems, "\n".join(problems)
    print("doc blocks:", dict(counts))
    assert counts["run"] >= 20 and counts["validated"] >= 20


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Every page run once by the harness in its own process (its registries, working folder and
    DataLoader workers stay out of the test process)."""
    tmp = tmp_path_factory.mktemp("docs")
    out = tmp / "results.json"
    res = subprocess.run([sys.executable, str(REPO / "tests" / "doc_blocks.py"), str(out), str(tmp / "work"),
                          *PAGES], capture_output=True, text=True, timeout=400, cwd=REPO)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("page", PAGES)
def test_page_runs(results, page):
    got = results[page]
    errors = got["errors"] + [b["error"] for b in got["blocks"] if b["error"]] + \
        [f"{page}:{t['line']}: table: {t['error']}" for t in got["tables"] if t["error"]]
    assert not errors, "\n\n".join(errors)
    expected = [(b.line, classify(b)[0]) for b in parse_page(REPO / page).blocks]
    assert [(b["line"], b["category"]) for b in got["blocks"]] == expected


def test_sphinx_build_has_no_warning(tmp_path):
    """`make docs` in short: the same build, warnings as errors."""
    res = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                          "-d", str(tmp_path / "doctrees"), str(REPO / "docs"), str(tmp_path / "html")],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    assert (tmp_path / "html" / "index.html").is_file()


def test_readme_is_short_and_starts_with_the_two_commands():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    first = next(b for _, b in all_blocks() if b.page == "README.md")
    commands = [line.split("#")[0].strip() for line in first.text.splitlines() if line.strip()]
    assert commands[:2] == ["make demo", "make test"]


def test_links_between_pages_exist():
    for page in pages():
        for target in re.findall(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            assert (page.parent / target).is_file(), f"{page.relative_to(REPO)}: link to missing {target}"


def test_no_paths_of_this_machine():
    for page in [*pages(), REPO / "docs" / "conf.py"]:
        for k, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            assert not MACHINE_PATHS.search(line), f"{page.relative_to(REPO)}:{k}: {line.strip()}"


def expand(name: str) -> list[str]:
    """``a.{b,c}`` -> ``a.b``, ``a.c`` (one brace group)."""
    m = re.search(r"\{([^{}]+)\}", name)
    if not m:
        return [name]
    return [name[:m.start()] + part.strip() + name[m.end():] for part in m[1].split(",")]


def cited(page_text: str) -> tuple[set[str], set[str]]:
    """The dotted ``energon_nemotron.`` names and the repository paths a page cites in backticks."""
    names, paths = set(), set()
    for span in code_spans(page_text):
        span = span.split("(")[0].strip()
        for item in expand(span):
            if re.fullmatch(r"energon_nemotron(\.\w+)+", item):
                names.add(item)
            elif re.fullmatch(r"(energon_nemotron|tests|benchmarks|examples|dataset_configs|docs)/[\w./*-]+", item):
                paths.add(item.rstrip("/"))
    return names, paths


def test_cited_names_and_paths_exist():
    """A module, function or file a page names exists (moved.md's old names are checked apart)."""
    problems = []
    for page in pages():
        if page.name == "moved.md":
            continue
        names, paths = cited(page.read_text(encoding="utf-8"))
        for name in sorted(names):
            try:
                resolve(name)
            except (ImportError, AttributeError) as e:
                problems.append(f"{page.relative_to(REPO)}: `{name}`: {e}")
        for path in sorted(paths):
            if not list(REPO.glob(path)):
                problems.append(f"{page.relative_to(REPO)}: `{path}` does not exist")
    assert not problems, "\n".join(problems)


def moved_rows() -> list[tuple[list[str], list[str]]]:
    rows = []
    for line in (REPO / "docs" / "moved.md").read_text(encoding="utf-8").splitlines():
        cells = split_row(line) if line.startswith("|") else []
        if len(cells) >= 2 and code_spans(cells[0]) and not set(cells[0]) <= set("-: "):
            old = [n for s in code_spans(cells[0]) for n in expand(s) if n.startswith("energon_nemotron.")]
            new = [n for s in code_spans(cells[1]) for n in expand(s) if n.startswith("energon_nemotron.")]
            rows.append((old, new))
    return rows


def gone(name: str) -> bool:
    """Whether an old name no longer resolves (a module imported under another name, as
    ``cookers`` imports ``guards.jsonl_guard``, does not count as the old module)."""
    import types

    try:
        obj = resolve(name)
    except (ImportError, AttributeError):
        return True
    return isinstance(obj, types.ModuleType) and obj.__name__ != name


def test_moved_table_old_names_are_gone_and_new_ones_exist():
    rows = moved_rows()
    assert len(rows) >= 20
    problems = []
    for old, new in rows:
        assert old and new, (old, new)
        for name in old:
            if not gone(name):
                problems.append(f"old name `{name}` still resolves")
        for name in new:
            try:
                resolve(name)
            except (ImportError, AttributeError) as e:
                problems.append(f"new name `{name}`: {e}")
    assert not problems, "\n".join(problems)


def test_design_layers_are_the_import_contracts():
    """docs/design.md's layer table lists the layers of pyproject.toml's import-linter contract, in order."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    contract = next(c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers")
    expected = [sorted(part.strip() for part in layer.split("|")) for layer in contract["layers"]]
    text = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    section = text.split("<!-- layers -->")[1]
    got = []
    for line in section.splitlines():
        if not line.startswith("|"):
            if got:
                break
            continue
        cells = split_row(line)
        if cells[0].isdigit():
            got.append(sorted(code_spans(cells[1])))
    assert got == expected
