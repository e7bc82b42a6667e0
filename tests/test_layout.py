"""The package's import graph: no cycle between modules or between subpackages, imports inside
functions counted (grimp reads every import statement of a module, wherever it is). The layers
themselves are import-linter contracts (``pyproject.toml``, run by ``make lint``); this test finds
what a layer contract cannot: two modules of one layer, or of one subpackage, importing each other."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import grimp

PACKAGE = "energon_nemotron"


def _graph() -> tuple[set[str], dict[str, set[str]]]:
    g = grimp.build_graph(PACKAGE)
    edges = {m: {i for i in g.find_modules_directly_imported_by(m) if i.startswith(PACKAGE) and i != m}
             for m in g.modules}
    return set(g.modules), edges


def _cycles(nodes: set[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _unit(module: str, packages: set[str]) -> str:
    """A root module as itself, anything in a subpackage as the subpackage."""
    parts = module.split(".")
    if len(parts) == 1:
        return module
    top = ".".join(parts[:2])
    return top if top in packages else module


def test_no_module_imports_itself_through_others():
    nodes, edges = _graph()
    assert _cycles(nodes, edges) == []


def test_no_subpackage_imports_itself_through_others():
    nodes, edges = _graph()
    packages = {".".join(m.split(".")[:2]) for m in nodes if m.count(".") >= 2}
    units: dict[str, set[str]] = defaultdict(set)
    for a, targets in edges.items():
        for b in targets:
            ua, ub = _unit(a, packages), _unit(b, packages)
            if ua != ub and ub != PACKAGE:
                units[ua].add(ub)
    assert _cycles({_unit(m, packages) for m in nodes}, units) == []


def test_the_checker_finds_a_cycle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles({"a", "b", "c", "d"}, edges) == [["a", "b", "c"]]


def test_the_package_root_is_small():
    root = Path(__file__).resolve().parents[1] / PACKAGE
    modules = sorted(p.stem for p in root.glob("*.py") if p.stem != "__init__")
    assert len(modules) <= 10, modules
