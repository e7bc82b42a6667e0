"""The doc-test harness of README.md and docs/*.md (run by tests/test_docs.py).

Every fenced code block of a page falls in one of four categories, decided from its language and
from the markers right above it (HTML comments, ``<!-- docs: NAME ARG -->``, one per line):

- **run**: ``python`` blocks, executed in page order in one namespace per page, in a working
  folder laid out as the repository after ``make demo`` (``dataset_configs/``, ``demo_out/`` with
  the demo's datasets and Megatron-LM rows, the demo tokenizer); ``bash`` blocks whose every
  command is ``energon-nemotron ...`` (run in process through ``energon_nemotron.cli.main``, which
  must return 0) or ``energon ...`` (Energon's own command line, run as a subprocess).
- **validated**: ``yaml`` blocks (a loader config goes through ``load_config`` and its task
  encoder's options model; a fragment of one is merged into a minimal config first; an Energon
  ``dataset.yaml`` has its cooker and subflavors checked; a metadataset its structure and the
  subflavors of every entry, and the real start-up check when its datasets exist), ``json``
  (parsed; with ``sample COOKER`` cooked by that cooker; with ``row`` encoded as a Megatron-LM
  row), ``toml`` (parsed), ``python`` with ``file`` (compiled and written, not run) and ``bash``
  with ``usage`` (a synopsis: its subcommand and every ``--option`` exist in the CLI's parser).
- **skipped**: ``<!-- docs: skip: REASON -->`` (a reason is required). Python is still compiled,
  YAML, JSON and TOML still parsed.
- **text**: ``text`` blocks (output, diagrams); not code. MyST directives (```` ```{toctree} ````)
  are not code either (category ``directive``).

Markers: ``skip: REASON``; ``file PATH`` (write the block to PATH in the page's folder first, for
later blocks to use); ``usage``; ``sample COOKER``; ``row``. Before a table instead of a block:
``fields DOTTED.NAME`` (the table's first column lists every field of that pydantic model or
dataclass, or every parameter of that class or function, the second its default) and ``keys DOTTED.NAME`` (the first column lists exactly the
names of that list, tuple, dict, registry, dataclass's fields or argparse parser's subcommands). A block in any other
language, an unmarked bash command of another program, or a marker that belongs to nothing is an
error, so every block is accounted for.

``python tests/doc_blocks.py RESULTS.json WORKDIR PAGE...`` builds the demo tree under WORKDIR,
runs every page and writes the results (tests/test_docs.py reads them).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

REPO = Path(__file__).resolve().parent.parent
LANGUAGES = {"python", "yaml", "bash", "json", "toml", "text"}
MARKERS = {"skip", "file", "usage", "sample", "row", "fields", "keys"}
TABLE_MARKERS = {"fields", "keys"}
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
MARKER = re.compile(r"^\s*<!--\s*docs:\s*(?P<name>[a-z]+):?\s*(?P<arg>.*?)\s*-->\s*$")
LOADER_KEYS = {"tokenizer", "task_encoder", "packing", "data", "loader"}


@dataclass
class Block:
    page: str
    line: int                       # 1-based line of the opening fence
    lang: str
    text: str
    markers: dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


@dataclass
class Table:
    page: str
    line: int
    rows: list[list[str]]
    markers: dict[str, str]


@dataclass
class Page:
    path: str
    blocks: list[Block]
    tables: list[Table]
    errors: list[str]


def _markers_above(lines: list[str], i: int, page: str, errors: list[str]) -> tuple[dict[str, str], set[int]]:
    """The markers on the lines above line ``i`` (blank lines between them are allowed)."""
    found: dict[str, str] = {}
    used: set[int] = set()
    j = i - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    while j >= 0:
        m = MARKER.match(lines[j])
        if not m:
            break
        name, arg = m["name"], m["arg"]
        if name not in MARKERS:
            errors.append(f"{page}:{j + 1}: unknown docs marker {name!r} (known: {', '.join(sorted(MARKERS))})")
        found[name] = arg
        used.add(j)
        j -= 1
    return found, used


def parse_page(path: Path) -> Page:
    """The fenced blocks and marked tables of one Markdown page."""
    page = str(path.relative_to(REPO))
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    tables: list[Table] = []
    errors: list[str] = []
    used: set[int] = set()
    inside: set[int] = set()                    # lines of code blocks (a marker shown there is text)
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m:
            indent, fence, info = len(m["indent"]), m["fence"], m["info"].strip()
            markers, marker_lines = _markers_above(lines, i, page, errors)
            used |= marker_lines
            body: list[str] = []
            j = i + 1
            while j < len(lines):
                s = lines[j].strip()
                if s.startswith(fence[0] * len(fence)) and set(s) == {fence[0]}:
                    break
                body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j].lstrip())
                j += 1
            else:
                errors.append(f"{page}:{i + 1}: code block never closed")
            blocks.append(Block(page, i + 1, info.split()[0] if info else "", "\n".join(body) + "\n", markers))
            inside.update(range(i, j + 1))
            i = j + 1
            continue
        if lines[i].lstrip().startswith("|") and (i == 0 or not lines[i - 1].lstrip().startswith("|")):
            markers, marker_lines = _markers_above(lines, i, page, errors)
            rows = []
            j = i
            while j < len(lines) and lines[j].lstrip().startswith("|"):
                rows.append(split_row(lines[j]))
                j += 1
            if markers:
                used |= marker_lines
                tables.append(Table(page, i + 1, rows, markers))
            i = j
            continue
        i += 1
    for k, line in enumerate(lines):
        if MARKER.match(line) and k not in used and k not in inside:
            errors.append(f"{page}:{k + 1}: a docs marker must sit right above a code block or a table")
    return Page(page, blocks, tables, errors)


def split_row(line: str) -> list[str]:
    """The cells of one Markdown table row (``\\|`` and pipes inside backticks do not split)."""
    cells, cell, code = [], "", False
    s = line.strip().strip("|") if not line.strip().endswith("\\|") else line.strip()[1:]
    k = 0
    while k < len(s):
        c = s[k]
        if c == "\\" and k + 1 < len(s) and s[k + 1] == "|":
            cell += "|"
            k += 2
            continue
        if c == "`":
            code = not code
        if c == "|" and not code:
            cells.append(cell.strip())
            cell = ""
        else:
            cell += c
        k += 1
    cells.append(cell.strip())
    return cells


# ---------------------------------------------------------------------------------------------
# classification (static: no package import)

def bash_commands(text: str) -> list[list[str]]:
    """The commands of a bash block: continuation lines joined, comments and blank lines dropped."""
    out, pending = [], ""
    for line in text.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        words = shlex.split(pending + line, comments=True)
        pending = ""
        if words:
            out.append(words)
    return out


def classify(block: Block) -> tuple[str, str]:
    """(category, error): run | validated | skipped | text, or "" and why the block is not accounted for."""
    mk = block.markers
    if block.lang.startswith("{"):             # a MyST directive (toctree, note, ...): not code
        return ("", f"{block.where}: a directive takes no docs marker") if mk else ("directive", "")
    if block.lang not in LANGUAGES:
        return "", (f"{block.where}: code block of language {block.lang or '(none)'!r}: give it one of "
                    f"{', '.join(sorted(LANGUAGES))} (text for output)")
    stray = set(mk) & TABLE_MARKERS
    if stray:
        return "", f"{block.where}: marker {sorted(stray)[0]!r} applies to tables"
    if "skip" in mk:
        if not mk["skip"]:
            return "", f"{block.where}: a skip marker needs a reason (<!-- docs: skip: REASON -->)"
        return "skipped", ""
    if block.lang == "text":
        return ("", f"{block.where}: a text block takes no docs marker") if mk else ("text", "")
    if "usage" in mk:
        return ("validated", "") if block.lang == "bash" else ("", f"{block.where}: usage applies to bash blocks")
    if ("sample" in mk or "row" in mk) and block.lang != "json":
        return "", f"{block.where}: sample/row apply to json blocks"
    if block.lang == "python":
        return ("validated" if "file" in mk else "run"), ""
    if block.lang == "bash":
        for words in bash_commands(block.text):
            if words[0] not in ("energon-nemotron", "energon"):
                return "", (f"{block.where}: bash command {words[0]!r} is not run by the doc tests: mark the block "
                            "<!-- docs: skip: REASON --> or <!-- docs: usage -->")
        return "run", ""
    if block.lang == "yaml":
        try:
            data = yaml.safe_load(block.text)
        except yaml.YAMLError as e:
            return "", f"{block.where}: invalid YAML: {e}"
        if yaml_kind(data) is None:
            return "", (f"{block.where}: a YAML block must be a loader config (or a part of one), an Energon "
                        "dataset.yaml or a metadataset")
    return "validated", ""


def yaml_kind(data: Any) -> Optional[str]:
    if not isinstance(data, dict):
        return None
    if data.get("__class__") == "MetadatasetV2":
        return "metadataset"
    if "__class__" in data:
        return "dataset"
    if data and set(data) <= LOADER_KEYS:
        return "loader" if {"tokenizer", "data"} <= set(data) else "loader fragment"
    return None


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


# ---------------------------------------------------------------------------------------------
# running (imports the package)

def build_tree(root: Path) -> Path:
    """The repository's layout after ``make demo``, built with the demo's own builders."""
    from concurrent.futures import ThreadPoolExecutor

    from energon_nemotron import MegatronSFTPackedEncoder
    from energon_nemotron.demo.conversations import make_conversations
    from energon_nemotron.demo.datasets import asr_dataset, multimodal_dataset, text_dataset
    from energon_nemotron.demo.run import ENERGON_SAMPLES, NUM_CONVERSATIONS, SEQ_LENGTH, TOKENIZER_DIR
    from energon_nemotron.megatron_packed import pack_file

    out = root / "demo_out"
    out.mkdir(parents=True)
    shutil.copytree(REPO / "dataset_configs", root / "dataset_configs")
    shutil.copytree(REPO / "examples", root / "examples")
    os.symlink(REPO / "energon_nemotron", root / "energon_nemotron")     # the package, as in the repository
    with ThreadPoolExecutor(3) as pool:          # each waits on its `energon prepare` subprocess
        jobs = [pool.submit(text_dataset, out / "text_dataset", "openai_messages", ENERGON_SAMPLES, seed=1,
                            per_shard=32),
                pool.submit(asr_dataset, out / "asr_dataset", ENERGON_SAMPLES // 3, seed=3),
                pool.submit(multimodal_dataset, out / "multimodal_dataset", ENERGON_SAMPLES, seed=2, per_shard=20)]
        raw = out / "raw_conversations.jsonl"
        with open(raw, "w", encoding="utf-8") as f:
            for conv in make_conversations(NUM_CONVERSATIONS, seed=0):
                f.write(json.dumps({"messages": conv}) + "\n")
        encoder = MegatronSFTPackedEncoder(TOKENIZER_DIR, SEQ_LENGTH, prompt_format="nemotron-h-aligned")
        pack_file(raw, out / "train.jsonl.packed", encoder, progress=False)
        for job in jobs:
            job.result()
    return root


def resolve(dotted: str) -> Any:
    """The object a dotted name names: the longest importable module prefix, then attributes."""
    import importlib

    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        for name in parts[k:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(f"no module in {dotted!r}")


def minimal_config() -> dict:
    return {"tokenizer": "energon_nemotron/demo/tokenizer",
            "task_encoder": {"name": "nemotron_multimodal", "options": {"seq_length": 4096}},
            "data": {"train": {"path": "demo_out/text_dataset"}}}


def merge(base: dict, part: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in part.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def check_loader(data: dict, folder: Path) -> None:
    from energon_nemotron import TASK_ENCODERS, load_config

    cfg = load_config(data, base=folder)
    sources = [s for s in (cfg.data.train, cfg.data.validation) if s is not None]
    if all(s.format == "megatron_sft_packed" for s in sources):
        return
    TASK_ENCODERS.get(cfg.task_encoder.name).Options(**cfg.task_encoder.options)


def check_subflavors(sub: Any, where: str) -> None:
    from types import SimpleNamespace

    from energon_nemotron.cookers.selection import CookerSelection
    from energon_nemotron.cookers.subflavors import subflavor_problems

    leaf = SimpleNamespace(subflavors=sub or {}, origin={}, path=Path(where))
    problems = subflavor_problems(leaf, CookerSelection()) if sub and "cooker" in sub else []
    if sub and "cooker" not in sub:         # keys without a cooker here: known to some cooker
        from energon_nemotron import COOKERS
        from energon_nemotron.cookers import subflavor_keys

        every = {k for c in COOKERS.names() for k in subflavor_keys(c)}
        problems = [f"unknown subflavor {k!r}" for k in sub if k not in every and not k.startswith("__")]
    if problems:
        raise ValueError("; ".join(problems))


ENTRY_KEYS = {"path", "weight", "repetitions", "subflavors", "split_part", "shuffle_over_epochs_multiplier",
              "dataset_config", "split_config", "aux", "subset", "join", "joiner", "nonmatch", "blend",
              "blend_epochized"}


def check_metadataset(data: dict, where: str, file: Optional[Path]) -> None:
    if data.get("__module__") != "megatron.energon":
        raise ValueError("__module__ must be megatron.energon")
    splits = data.get("splits")
    if not isinstance(splits, dict) or not splits:
        raise ValueError("a metadataset needs splits: {NAME: ...}")

    def node(n: Any, at: str) -> None:
        if not isinstance(n, dict) or not set(n) <= ENTRY_KEYS:
            raise ValueError(f"{at}: unknown key(s) {sorted(set(n) - ENTRY_KEYS) if isinstance(n, dict) else n}")
        check_subflavors(n.get("subflavors"), at)
        for key in ("blend", "blend_epochized"):
            for k, child in enumerate(n.get(key) or []):
                node(child, f"{at}.{key}[{k}]")
        if not ({"path", "blend", "blend_epochized", "join"} & set(n)):
            raise ValueError(f"{at}: needs path, blend, blend_epochized or join")

    for name, split in splits.items():
        node(split, f"splits.{name}")
    if file is not None and all((file.parent / p).exists() for p in _paths(splits)):
        from energon_nemotron.loading import check_source

        for name in splits:
            check_source(file, name, None)


def _paths(n: Any) -> list[str]:
    if isinstance(n, dict):
        return ([n["path"]] if isinstance(n.get("path"), str) else []) + [p for v in n.values() for p in _paths(v)]
    if isinstance(n, list):
        return [p for v in n for p in _paths(v)]
    return []


def check_yaml(block: Block, folder: Path, file: Optional[Path]) -> None:
    data = yaml.safe_load(block.text)
    kind = yaml_kind(data)
    if kind == "loader":
        check_loader(data, (file or folder / "x").parent)
    elif kind == "loader fragment":
        check_loader(merge(minimal_config(), data), folder)
    elif kind == "dataset":
        if data.get("__module__") != "megatron.energon":
            raise ValueError("__module__ must be megatron.energon")
        import megatron.energon

        if not hasattr(megatron.energon, data["__class__"]):
            raise ValueError(f"megatron.energon has no sample type {data['__class__']!r}")
        check_subflavors(data.get("subflavors"), block.where)
    else:
        check_metadataset(data, block.where, file)


def check_json(block: Block, folder: Path) -> None:
    obj = json.loads(block.text)
    if "sample" in block.markers:
        from energon_nemotron import COOKERS

        cook = COOKERS.get(block.markers["sample"])
        sample = {"__key__": "docs-sample", "__restore_key__": ("Webdataset", 0), "__sources__": (),
                  "__subflavors__": {"cooker": block.markers["sample"]}, "json": json.dumps(obj).encode()}
        cook(sample)
    if "row" in block.markers:
        from energon_nemotron import MegatronSFTPackedEncoder
        from energon_nemotron.demo import TOKENIZER_DIR

        out = MegatronSFTPackedEncoder(TOKENIZER_DIR, 256).encode(obj, where=block.where)
        if not out["sample_keys"]:
            raise ValueError("the row encodes to no conversation")


def check_usage(block: Block) -> None:
    from energon_nemotron.cli import build_parser

    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices
    for words in bash_commands(block.text):
        if words[0] != "energon-nemotron":
            raise ValueError(f"a usage line starts with energon-nemotron, not {words[0]!r}")
        if words[1] not in sub:
            raise ValueError(f"energon-nemotron has no subcommand {words[1]!r}")
        options = {o for a in sub[words[1]]._actions for o in a.option_strings}
        for w in words[2:]:
            for opt in re.findall(r"(?<![\w-])--[a-z][a-z-]*", w):
                if opt not in options:
                    raise ValueError(f"energon-nemotron {words[1]} has no option {opt}")


def run_bash(block: Block, folder: Path) -> str:
    from energon_nemotron.cli import main

    shown = io.StringIO()
    for words in bash_commands(block.text):
        if words[0] == "energon-nemotron":
            with contextlib.redirect_stdout(shown), contextlib.redirect_stderr(shown):
                code = main(words[1:])
            if code != 0:
                raise RuntimeError(f"`{shlex.join(words)}` exited {code}:\n{shown.getvalue()[-3000:]}")
        else:
            res = subprocess.run([sys.executable, "-m", "megatron.energon.cli.main", *words[1:]], cwd=folder,
                                 capture_output=True, text=True)
            if res.returncode:
                raise RuntimeError(f"`{shlex.join(words)}` exited {res.returncode}:\n{res.stdout[-2000:]}"
                                   f"{res.stderr[-2000:]}")
    return shown.getvalue()


def run_block(block: Block, folder: Path, namespace: dict) -> None:
    category, error = classify(block)
    if error:
        raise ValueError(error)
    file = folder / block.markers["file"] if "file" in block.markers else None
    if file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(block.text, encoding="utf-8")
    if block.lang == "python":
        code = compile(block.text, block.where, "exec")
        if category == "run":
            with contextlib.redirect_stdout(io.StringIO()):
                exec(code, namespace)
    elif block.lang == "yaml":
        if category == "validated":
            check_yaml(block, folder, file)
        else:
            yaml.safe_load(block.text)
    elif block.lang == "json":
        if category == "validated":
            check_json(block, folder)
        else:
            json.loads(block.text)
    elif block.lang == "toml":
        tomllib.loads(block.text)
    elif block.lang == "bash" and category == "validated":
        check_usage(block)
    elif block.lang == "bash" and category == "run":
        run_bash(block, folder)


def default_text(value: Any) -> str:
    """A default as the reference tables write it (YAML spelling)."""
    if value is None:
        return "null"
    if hasattr(value, "model_fields"):           # a nested section at its defaults
        return "{}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(default_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {default_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, Path):
        return str(value)
    return str(value)


def model_fields(obj: Any) -> dict[str, str]:
    """name -> default text of a pydantic model's or a dataclass's fields, or of a class's or a
    function's parameters ("required" without one)."""
    import dataclasses
    import inspect

    out = {}
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            if f.default is not dataclasses.MISSING:
                out[f.name] = default_text(f.default)
            elif f.default_factory is not dataclasses.MISSING:
                out[f.name] = default_text(f.default_factory())
            else:
                out[f.name] = "required"
        return out
    if not hasattr(obj, "model_fields"):
        for p in inspect.signature(obj).parameters.values():
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                out[p.name] = "required" if p.default is p.empty else default_text(p.default)
        return out
    for name, f in obj.model_fields.items():
        if f.is_required():
            out[f.alias or name] = "required"
        else:
            out[f.alias or name] = default_text(f.get_default(call_default_factory=True))
    return out


def names_of(obj: Any) -> set[str]:
    import argparse
    import dataclasses

    if isinstance(obj, type) and dataclasses.is_dataclass(obj):
        return {f.name for f in dataclasses.fields(obj)}
    if isinstance(obj, argparse.ArgumentParser):
        return set(obj._subparsers._group_actions[0].choices)
    if hasattr(obj, "names") and callable(obj.names):
        return set(obj.names())
    if callable(obj):
        return names_of(obj())
    return {str(k) for k in obj}


def code_spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def check_table(table: Table) -> None:
    body = [r for r in table.rows[2:] if r and r[0]]
    if "fields" in table.markers:
        expected = model_fields(resolve(table.markers["fields"]))
        got = {}
        for r in body:
            names = code_spans(r[0])
            if len(names) != 1 or len(r) < 2:
                raise ValueError(f"{table.page}:{table.line}: row {r!r}: the first cell names one field in backticks")
            spans = code_spans(r[1])
            got[names[0]] = spans[0] if spans else r[1].split()[0] if r[1] else ""
        missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
        wrong = [f"{k}: documented {got[k]!r}, code {expected[k]!r}" for k in sorted(set(got) & set(expected))
                 if got[k] != expected[k]]
        if missing or extra or wrong:
            raise ValueError(f"{table.page}:{table.line} vs {table.markers['fields']}: missing {missing}, "
                             f"not in the code {extra}, defaults {wrong}")
    if "keys" in table.markers:
        expected = names_of(resolve(table.markers["keys"]))
        got = {n for r in body for n in code_spans(r[0])}
        if got != expected:
            raise ValueError(f"{table.page}:{table.line} vs {table.markers['keys']}: missing "
                             f"{sorted(expected - got)}, not in the code {sorted(got - expected)}")


def run_page(page: Page, folder: Path) -> dict:
    """Every block and marked table of ``page``, in order, in ``folder``."""
    results = []
    namespace: dict = {"__name__": "__docs__"}
    failed = None
    cwd, path = os.getcwd(), list(sys.path)
    os.chdir(folder)
    sys.path.insert(0, str(folder))
    try:
        tables = []                 # before the blocks: a block may register components the tables list
        for table in page.tables:
            try:
                check_table(table)
                tables.append({"line": table.line, "error": ""})
            except Exception as e:  # noqa: BLE001
                tables.append({"line": table.line, "error": f"{type(e).__name__}: {e}"})
        for block in page.blocks:
            category, error = classify(block)
            entry = {"line": block.line, "lang": block.lang, "category": category, "error": error}
            start = time.perf_counter()
            if not error and failed is not None:
                entry["error"] = f"not run: the block at line {failed} failed"
            elif not error:
                try:
                    run_block(block, folder, namespace)
                except BaseException as e:  # noqa: BLE001 - reported, with the traceback of the page's code
                    if isinstance(e, KeyboardInterrupt):
                        raise
                    entry["error"] = f"{block.where}: {type(e).__name__}: {e}\n" + "".join(
                        traceback.format_exception(e)[-12:])
                    failed = block.line
            entry["seconds"] = round(time.perf_counter() - start, 2)
            results.append(entry)
    finally:
        os.chdir(cwd)
        sys.path[:] = path
    return {"blocks": results, "tables": tables, "errors": page.errors}


def main(argv: list[str]) -> int:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    # An example that stops iterating a loader with workers leaves a DataLoader iterator behind; when
    # it is collected, torch joins each worker for up to this poll interval (5 s) before the worker
    # notices it is done. A command-line run exits instead; the harness polls faster.
    import torch.utils.data._utils

    torch.utils.data._utils.MP_STATUS_CHECK_INTERVAL = 0.2
    out, workdir, *names = argv
    start = time.perf_counter()
    base = build_tree(Path(workdir) / "base")
    results: dict = {"(build)": {"seconds": round(time.perf_counter() - start, 2)}}
    for name in names:
        page = parse_page(REPO / name)
        folder = Path(workdir) / name.replace("/", "_").removesuffix(".md")
        shutil.copytree(base, folder, symlinks=True)
        results[page.path] = run_page(page, folder)
    Path(out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
