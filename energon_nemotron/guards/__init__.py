"""Input guards: whether an input is usable, and what happens when it is not.

The files of a prepared Energon dataset (``energon_files``) and the tree of a data source
(``source_tree``); shards and indexes cross-checked at start and read errors that name the shard
(``shards``); JSON nesting and string checks (``json_safety``, and ``jsonl_guard`` for Energon's
JSONL line parsing); the bad-sample policy (``policy``) and the limits that stop a run that only
skips (``skip_limits``); loader workers that die with their parent (``orphans``); a loader that
makes no progress becomes an error (``stalls``).
"""

from energon_nemotron.guards.json_safety import MAX_JSON_DEPTH, check_json_text, check_strings, parse_json
from energon_nemotron.guards.policy import ErrorPolicy, SampleErrorHandler, failure_text, skip_counter
from energon_nemotron.guards.shards import guard_reads, leaf_problems
from energon_nemotron.guards.skip_limits import SkipTally, apply_limits, record_pass, record_skip
from energon_nemotron.guards.source_tree import Leaf, Tree, stream_digests, walk

__all__ = ["ErrorPolicy", "SampleErrorHandler", "skip_counter", "failure_text", "SkipTally", "apply_limits", "record_pass", "record_skip",
           "MAX_JSON_DEPTH", "check_json_text", "check_strings", "parse_json", "guard_reads", "leaf_problems", "Leaf",
           "Tree", "walk", "stream_digests"]
