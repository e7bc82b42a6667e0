"""Inspection: the batches a configuration produces, for people (``energon-nemotron preview``, its
HTML page, and the row views of ``inspect-megatron``)."""

from energon_nemotron.inspection.html import render_html
from energon_nemotron.inspection.preview import run_preview
from energon_nemotron.inspection.rows import batch_json, row_json, row_text

__all__ = ["run_preview", "render_html", "batch_json", "row_json", "row_text"]
