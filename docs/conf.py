"""Sphinx configuration of the energon-nemotron documentation (Markdown pages through MyST).

Built by ``make docs`` (``sphinx-build -W --keep-going -b html docs build/docs``) and by
``tests/test_docs.py``, warnings as errors.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from docutils import nodes

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from energon_nemotron.version import __version__  # noqa: E402

project = "energon-nemotron"
author = "energon-nemotron contributors"
copyright = "energon-nemotron contributors"
release = version = __version__

extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# Markdown: headings up to level 3 get anchors (links such as packing.md#telemetry), and
# ::: fences and definition lists are available
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

html_theme = "alabaster"
html_title = f"energon-nemotron {release}"
html_static_path: list[str] = []


# A block the doc tests do not run carries `<!-- docs: skip: REASON -->` (tests/doc_blocks.py); the
# rendered page shows the reason above the block instead of an invisible comment.
_SKIP = re.compile(r"<!--\s*docs:\s*skip:\s*(.*?)\s*-->", re.S)


def _show_skip_reasons(app, doctree) -> None:
    for raw in list(doctree.findall(nodes.raw)):
        m = _SKIP.search(raw.astext())
        if m and "html" in raw.get("format", ""):
            note = nodes.paragraph(classes=["docs-skip"])
            note += nodes.emphasis(text=f"Not run by the doc tests: {m[1]}")
            raw.replace_self(note)


def setup(app):
    app.connect("doctree-read", _show_skip_reasons)
    return {"parallel_read_safe": True}
