"""``energon-nemotron stats``: the shape of a loader config's datasets, read through the real
Energon machinery up to phase 1 (``run``: the command; ``collect``: one reader's part;
``energon_reader`` / ``megatron_reader``: the sources; ``records``: per-sample records and their
merge; ``aggregate``: the numbers; ``report`` / ``html``: the views; ``ray_engine``: Ray actors)."""

from energon_nemotron.stats.run import ENGINES, collect_stats, run_stats

__all__ = ["collect_stats", "run_stats", "ENGINES"]
