"""Which cooker cooks a dataset: an ordered list of rules, matched as Energon's ``Cooker`` matches.

A rule is ``(name, options, has_subflavors)``: the registered cooker ``name``, keyword ``options``
bound to its cook function, and a filter of subflavor values (every key present with an equal
value; ``None``: matches every dataset). The first matching rule wins. At most one rule has no
filter, and it is the last (a fallback after it could never be reached). This is how NeMo-RL's
SFT v2 loader lists its cookers (``data.energon.cookers``) and how ``data.cookers`` lists them here.

Without a list, the library's own convention applies: one rule per registered cooker selecting it
by ``subflavors.cooker == name``, then ``data.default_cooker`` (if set) as the fallback.
"""

from __future__ import annotations

import functools
import inspect
import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

from megatron.energon import Cooker

from energon_nemotron.errors import ConfigError
from energon_nemotron.registry import COOKERS

__all__ = ["CookerRule", "CookerSelection", "cooker_options"]


@dataclass(frozen=True)
class CookerRule:
    """One entry of the list: the cooker ``name``, its bound ``options`` and the subflavor filter."""

    name: str
    options: tuple = ()                      # sorted (key, value) pairs
    has_subflavors: Optional[tuple] = None   # sorted (key, value) pairs; None: every dataset

    def matches(self, subflavors: Optional[Mapping]) -> bool:
        """Energon's rule: every filter key present in ``subflavors`` with an equal value."""
        if self.has_subflavors is None:
            return True
        sub = subflavors or {}
        return all(k in sub and sub[k] == v for k, v in self.has_subflavors)

    def describe(self) -> dict:
        return {"name": self.name, "options": dict(self.options),
                "has_subflavors": None if self.has_subflavors is None else dict(self.has_subflavors)}


def cooker_options(name: str) -> dict[str, inspect.Parameter]:
    """The keyword-only parameters of cooker ``name``'s cook function: the options a rule may bind
    (every other keyword argument is an aux source Energon passes)."""
    fn = inspect.unwrap(COOKERS.get(name))
    return {p.name: p for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY}


class _BoundCook:
    """A cook function with options bound; keeps the function's markers (``@stateless``, Energon's
    cooker flags), as ``functools.partial`` would not."""

    def __init__(self, fn: Callable, options: dict) -> None:
        self.fn, self.options = fn, options
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs, **self.options)


class _Matching(Cooker):
    """A ``Cooker`` whose filter ``None`` means "every dataset", a standalone JSONL file included
    (Energon gives such a dataset no subflavors)."""

    def is_match(self, subflavors: Optional[dict]) -> bool:
        return self.has_subflavors is None or (subflavors is not None and super().is_match(subflavors))


def _frozen(mapping: Mapping, where: str) -> tuple:
    for k, v in mapping.items():
        try:
            json.dumps(v)
        except TypeError:
            raise ConfigError(f"{where}.{k}: expected a plain YAML value, got {type(v).__name__}") from None
    return tuple(sorted(mapping.items(), key=lambda kv: str(kv[0])))


class CookerSelection:
    """The ordered cooker rules of a loader (see the module docstring).

    ``rules``: mappings ``{name, options, has_subflavors}`` (``data.cookers``), or None for the
    library's convention with ``default_cooker``. ``where`` names the list in messages.
    """

    def __init__(self, rules: Optional[Sequence[Mapping]] = None, default_cooker: Optional[str] = None,
                 where: str = "data.cookers") -> None:
        self.where, self.explicit = where, rules is not None
        if rules is None:
            self.rules = tuple(CookerRule(n, (), (("cooker", n),)) for n in COOKERS.names())
            if default_cooker is not None:
                self._known(default_cooker, "data.default_cooker")
                self.rules += (CookerRule(default_cooker),)
            return
        if default_cooker is not None:
            raise ConfigError(f"data.default_cooker: set either it or {where} (whose last entry without "
                              "has_subflavors is the fallback), not both")
        out: list[CookerRule] = []
        for i, rule in enumerate(rules):
            at = f"{where}[{i}]"
            self._known(rule["name"], f"{at}.name")
            options = dict(rule.get("options") or {})
            self._check_options(rule["name"], options, f"{at}.options")
            filt = rule.get("has_subflavors")
            if filt is not None and not filt:
                raise ConfigError(f"{at}.has_subflavors: an empty filter matches every dataset; write null "
                                  "(the fallback) or name the subflavors to match")
            out.append(CookerRule(rule["name"], _frozen(options, f"{at}.options"),
                                  None if filt is None else _frozen(filt, f"{at}.has_subflavors")))
        if not out:
            raise ConfigError(f"{where}: the list is empty; name at least one cooker")
        fallbacks = [i for i, r in enumerate(out) if r.has_subflavors is None]
        if len(fallbacks) > 1 or (fallbacks and fallbacks[0] != len(out) - 1):
            raise ConfigError(f"{where}: entries {fallbacks} have no has_subflavors; at most one may (the "
                              "fallback), and it must be last: entries after it could never match")
        seen: dict[tuple, int] = {}
        for i, r in enumerate(out):
            if r.has_subflavors in seen:
                raise ConfigError(f"{where}[{i}].has_subflavors: the same filter as entry {seen[r.has_subflavors]}; "
                                  "this entry could never match")
            seen[r.has_subflavors] = i
        self.rules = tuple(out)

    @staticmethod
    def _known(name: Any, where: str) -> None:
        if not isinstance(name, str) or name not in COOKERS:
            raise ConfigError(f"{where}: unknown cooker {name!r}; known: {', '.join(COOKERS.names())}")

    @staticmethod
    def _check_options(name: str, options: dict, where: str) -> None:
        accepted = cooker_options(name)
        unknown = [k for k in options if k not in accepted]
        if unknown:
            takes = f"takes {', '.join(accepted)}" if accepted else "takes no options"
            raise ConfigError(f"{where}: cooker {name!r} {takes}; got {', '.join(map(repr, unknown))}")

    def cooker_for(self, subflavors: Optional[Mapping]) -> Optional[str]:
        """The name of the cooker the first matching rule selects (None: no rule matches)."""
        rule = self.rule_for(subflavors)
        return None if rule is None else rule.name

    def rule_for(self, subflavors: Optional[Mapping]) -> Optional[CookerRule]:
        return next((r for r in self.rules if r.matches(subflavors)), None)

    @property
    def filter_keys(self) -> set[str]:
        """The subflavor keys the rules select by (a dataset may carry them whatever its cooker)."""
        return {k for r in self.rules if r.has_subflavors for k, _ in r.has_subflavors}

    @property
    def has_fallback(self) -> bool:
        return bool(self.rules) and self.rules[-1].has_subflavors is None

    def energon_cookers(self) -> list[Cooker]:
        """The rules as Energon ``Cooker``s, in order (Energon uses the first that matches)."""
        out = []
        for r in self.rules:
            fn = COOKERS.get(r.name)
            cook = _BoundCook(fn, dict(r.options)) if r.options else fn
            out.append(_Matching(cook, has_subflavors=None if r.has_subflavors is None else dict(r.has_subflavors)))
        return out

    def identity(self) -> list[dict]:
        """What the resume fingerprint records: the rules as written (explicit list) or the names."""
        return [r.describe() for r in self.rules] if self.explicit else [r.name for r in self.rules]
