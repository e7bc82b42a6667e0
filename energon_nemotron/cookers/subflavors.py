"""The subflavors that reach a dataset's cooker, checked against what the cooker declares.

Each leaf of a data source (``guards.source_tree.Leaf``: its merged subflavors and the file that set
each) must name a registered cooker (``subflavors.cooker``, else ``data.default_cooker``) and hold
only keys that cooker reads (``cookers.base.COOKER_SUBFLAVORS``), each of its declared type (the
value-type vocabulary of ``config.type_check``). Energon's own keys (``__subflavor__``) pass.
"""

from __future__ import annotations

import difflib
from typing import Any, Optional

from energon_nemotron.config import type_check
from energon_nemotron.cookers.base import COOKER_SUBFLAVORS, subflavor_keys
from energon_nemotron.guards.energon_files import META
from energon_nemotron.registry import COOKERS

__all__ = ["subflavor_problems"]


def subflavor_problems(leaf: Any, default_cooker: Optional[str]) -> list[str]:
    """What is wrong with the subflavors that reach a leaf's cooker (empty: nothing)."""
    sub, out = leaf.subflavors, []
    named = leaf.origin.get("cooker", leaf.path)
    if "cooker" not in sub:
        if default_cooker is None:
            return [f"{leaf.path}: the dataset's subflavors name no registered cooker; set subflavors: "
                    f"{{cooker: NAME}} in its {META}/dataset.yaml or metadataset, or data.default_cooker in "
                    f"the loader config (cookers: {', '.join(COOKERS.names())})"]
        cooker = default_cooker
    else:
        cooker = sub["cooker"]
        if not isinstance(cooker, str) or cooker not in COOKERS:
            close = difflib.get_close_matches(str(cooker), COOKERS.names(), n=1)
            return [f"{named}: subflavor cooker: {cooker!r} (dataset {leaf.path}): the subflavors name no "
                    f"registered cooker; known: {', '.join(COOKERS.names())}"
                    + (f"; did you mean {close[0]!r}?" if close else "")]
    keys = subflavor_keys(cooker)
    every = sorted({k for c in COOKERS.names() for k in subflavor_keys(c)} | set(COOKER_SUBFLAVORS.get(cooker, {})))
    for key, value in sub.items():
        file = leaf.origin.get(key, leaf.path)
        if isinstance(key, str) and key.startswith("__") and key.endswith("__"):
            continue                                             # Energon's own (e.g. __subflavor__)
        if key not in keys:
            readers = [c for c in COOKERS.names() if key in subflavor_keys(c)]
            if readers:
                out.append(f"{file}: subflavor {key!r} (dataset {leaf.path}) is read only by the cooker(s) "
                           f"{', '.join(readers)}, not by this dataset's cooker {cooker!r}; remove it")
                continue
            close = difflib.get_close_matches(str(key), sorted(keys), n=1) or \
                difflib.get_close_matches(str(key), every, n=1)
            out.append(f"{file}: unknown subflavor {key!r} (dataset {leaf.path}, cooker {cooker!r}); valid keys: "
                       f"{', '.join(sorted(keys))}" + (f"; did you mean {close[0]!r}?" if close else ""))
        else:
            ok, expected = type_check(keys[key], classes=True)
            if not ok(value):
                out.append(f"{file}: subflavor {key!r} (dataset {leaf.path}) must be {expected}, got {value!r} "
                           f"({type(value).__name__})" + ("; write it unquoted" if keys[key] is bool else ""))
    return out
