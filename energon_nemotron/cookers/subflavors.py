"""The subflavors that reach a dataset's cooker, checked against what the cooker declares.

Each leaf of a data source (``guards.source_tree.Leaf``: its merged subflavors and the file that set
each) must be matched by the loader's cooker rules (``cookers.selection``: ``subflavors.cooker``,
else ``data.default_cooker``; or the ``data.cookers`` list) and hold only keys that cooker reads
(``cookers.base.COOKER_SUBFLAVORS``), each of its declared type (the value-type vocabulary of
``config.type_check``). Energon's own keys (``__subflavor__``), the keys the rules select by and a
blend's bookkeeping keys (:data:`BLEND_METADATA`) pass; other keys follow ``data.other_subflavors``.
"""

from __future__ import annotations

import difflib
from typing import Any, Optional

from energon_nemotron.config import type_check
from energon_nemotron.cookers.base import COOKER_SUBFLAVORS, REFUSED_SUBFLAVOR_VALUES, subflavor_keys
from energon_nemotron.cookers.selection import CookerSelection
from energon_nemotron.guards.energon_files import META
from energon_nemotron.registry import COOKERS

__all__ = ["subflavor_problems", "BLEND_METADATA"]

#: subflavor keys a blend may carry as its own bookkeeping (NeMo-RL's production blends write them
#: beside the cooker selector): no cooker reads them, every dataset may carry them
BLEND_METADATA = ("name", "length", "orig_length", "category")


def _cooker_of(leaf: Any, selection: CookerSelection) -> tuple[Optional[str], list[str]]:
    """The cooker that cooks ``leaf`` under ``selection``, or the problem that none does."""
    sub = leaf.subflavors
    named = leaf.origin.get("cooker", leaf.path)
    if not selection.explicit and "cooker" in sub:
        cooker = sub["cooker"]
        if not isinstance(cooker, str) or cooker not in COOKERS:
            close = difflib.get_close_matches(str(cooker), COOKERS.names(), n=1)
            return None, [f"{named}: subflavor cooker: {cooker!r} (dataset {leaf.path}): the subflavors name no "
                          f"registered cooker; known: {', '.join(COOKERS.names())}"
                          + (f"; did you mean {close[0]!r}?" if close else "")]
    cooker = selection.cooker_for(sub)
    if cooker is not None:
        return cooker, []
    if selection.explicit:
        filters = "; ".join(f"{r.name}: {r.describe()['has_subflavors']}" for r in selection.rules)
        return None, [f"{leaf.path}: no entry of {selection.where} matches the dataset's subflavors "
                      f"{dict(sorted(sub.items()))} (filters: {filters}); add an entry whose has_subflavors "
                      "match them, or a last entry without has_subflavors (the fallback)"]
    return None, [f"{leaf.path}: the dataset's subflavors name no registered cooker; set subflavors: "
                  f"{{cooker: NAME}} in its {META}/dataset.yaml or metadataset, or data.default_cooker in "
                  f"the loader config (cookers: {', '.join(COOKERS.names())})"]


def subflavor_problems(leaf: Any, selection: CookerSelection, other: str = "error") -> list[str]:
    """What is wrong with the subflavors that reach a leaf's cooker (empty: nothing).

    ``selection``: the loader's cooker rules. Keys the cooker reads are type-checked; the keys the
    rules select by and :data:`BLEND_METADATA` pass; any other key is an error (``other="error"``)
    or passes (``"allow"``: a blend's free-form subflavors) unless it is one letter-slip from a key
    the cooker reads (a typo would silently turn a setting off)."""
    cooker, problems = _cooker_of(leaf, selection)
    if cooker is None:
        return problems
    sub, out = leaf.subflavors, []
    keys = subflavor_keys(cooker)
    every = sorted({k for c in COOKERS.names() for k in subflavor_keys(c)} | set(COOKER_SUBFLAVORS.get(cooker, {})))
    free = selection.filter_keys | set(BLEND_METADATA)
    for key, value in sub.items():
        file = leaf.origin.get(key, leaf.path)
        if isinstance(key, str) and key.startswith("__") and key.endswith("__"):
            continue                                             # Energon's own (e.g. __subflavor__)
        if key in keys:
            ok, expected = type_check(keys[key], classes=True)
            if not ok(value):
                out.append(f"{file}: subflavor {key!r} (dataset {leaf.path}) must be {expected}, got {value!r} "
                           f"({type(value).__name__})" + ("; write it unquoted" if keys[key] is bool else ""))
            elif key in REFUSED_SUBFLAVOR_VALUES and value == REFUSED_SUBFLAVOR_VALUES[key][0]:
                out.append(f"{file}: subflavor {key}: {value!r} (dataset {leaf.path}): "
                           f"{REFUSED_SUBFLAVOR_VALUES[key][1]}")
            continue
        if key in free:
            continue
        slip = difflib.get_close_matches(str(key), sorted(keys), n=1, cutoff=0.85)
        if other == "allow":
            if slip:
                out.append(f"{file}: subflavor {key!r} (dataset {leaf.path}) is not read by cooker {cooker!r}, "
                           f"which reads {slip[0]!r}: a misspelling? (free-form subflavors are allowed, but "
                           "not one this close to a setting)")
            continue
        readers = [c for c in COOKERS.names() if key in subflavor_keys(c)]
        if readers:
            out.append(f"{file}: subflavor {key!r} (dataset {leaf.path}) is read only by the cooker(s) "
                       f"{', '.join(readers)}, not by this dataset's cooker {cooker!r}; remove it")
            continue
        close = difflib.get_close_matches(str(key), sorted(keys), n=1) or \
            difflib.get_close_matches(str(key), every, n=1)
        out.append(f"{file}: unknown subflavor {key!r} (dataset {leaf.path}, cooker {cooker!r}); valid keys: "
                   f"{', '.join(sorted(keys))}" + (f"; did you mean {close[0]!r}?" if close else "")
                   + "; or set data.other_subflavors: allow for a blend's free-form keys")
    return out
