"""A walk over a NeMo-RL master config that gives every key a status: nothing is dropped unseen.

Each key the adapter reads is marked ``honoured`` (with where it went in the library's config),
``trainer`` (a key of NeMo-RL's trainer or model that a data loader does not read, said so) or
refused (a ``ConfigError`` naming the key and why). :meth:`Walk.finish` gives the keys no rule
visited their section's status: under ``data`` they are refused (an unknown key there is a typo or
a setting this library cannot honour), under ``policy`` and ``sft`` they are the trainer's.
"""

from __future__ import annotations

from typing import Any

from energon_nemotron.errors import ConfigError

__all__ = ["Walk", "MISSING", "leaves"]

MISSING = object()


def leaves(node: Any, prefix: str = "") -> list[str]:
    """Every leaf key of a nested mapping, dotted (a mapping value that is empty is a leaf)."""
    if isinstance(node, dict) and node:
        return [k for key, v in node.items() for k in leaves(v, f"{prefix}.{key}" if prefix else str(key))]
    return [prefix] if prefix else []


class Walk:
    """The statuses of a config's keys (see the module docstring); ``report`` maps each dotted key
    to what happened to it."""

    def __init__(self, config: dict, origin: str) -> None:
        self.config, self.origin = config, origin
        self.report: dict[str, str] = {}

    def get(self, dotted: str, default: Any = MISSING) -> Any:
        node: Any = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def has(self, dotted: str) -> bool:
        return self.get(dotted) is not MISSING

    def _mark(self, dotted: str, status: str) -> None:
        value = self.get(dotted)
        keys = leaves(value, dotted) if isinstance(value, dict) and value else [dotted]
        for k in keys:
            self.report.setdefault(k, status)

    def use(self, dotted: str, target: str, default: Any = MISSING) -> Any:
        """The value of ``dotted`` (``default`` when absent: NeMo-RL's default), marked as going to
        ``target``; absent without a default is a ``ConfigError``."""
        value = self.get(dotted, default)
        if value is MISSING:
            self.refuse(dotted, "required; missing")
        if self.has(dotted):
            self._mark(dotted, f"honoured: {target}")
        return value

    def typed(self, dotted: str, kinds: tuple, target: str, default: Any = MISSING) -> Any:
        """:meth:`use`, with the value checked against ``kinds`` (bool is not an int here)."""
        value = self.use(dotted, target, default)
        ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
        if not ok:
            names = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
            self.refuse(dotted, f"expected {names}, got {value!r}")
        return value

    def trainer(self, dotted: str, why: str = "NeMo-RL's trainer reads it; a data loader does not") -> None:
        if self.has(dotted):
            self._mark(dotted, f"trainer: {why}")

    def refuse(self, dotted: str, why: str) -> None:
        raise ConfigError(f"{self.origin}: {dotted}: {why}")

    def entry_keys(self, at: str, entry: dict, allowed: tuple, what: str, loaded: str) -> None:
        """Refuse a component entry's file-backed keys (``python_file``, ``object_name``, ``object``:
        nothing is imported from a path in YAML; ``loaded``: what to use instead) and any key not in
        ``allowed`` (``what``: the entry's kind)."""
        for k in entry:
            if k in ("python_file", "object_name", "object"):
                self.refuse(f"{at}.{k}", f"file-backed {what}s are not loaded: nothing is imported from a path in "
                                         f"YAML; {loaded}")
            if k not in allowed:
                self.refuse(f"{at}.{k}", f"not a key of a {what} entry ({', '.join(allowed)})")

    def finish(self) -> dict[str, str]:
        """Statuses for the keys no rule visited: under ``data`` a ``ConfigError`` (naming all of
        them), under ``policy``/``sft`` the trainer's; other top-level blocks are not read."""
        unknown = []
        for block in ("data", "policy", "sft"):
            for key in leaves(self.config.get(block) or {}, block):
                if key in self.report:
                    continue
                if block == "data":
                    unknown.append(key)
                else:
                    self.report[key] = "trainer: NeMo-RL's trainer reads it; a data loader does not"
        if unknown:
            raise ConfigError(f"{self.origin}: key(s) of NeMo-RL's Energon data block this adapter does not know: "
                              f"{', '.join(unknown)}; remove them or check their spelling (docs: Coming from NeMo-RL)")
        for block in self.config:
            if block not in ("data", "policy", "sft"):
                self.report.setdefault(block, "not read: outside the data, policy and sft blocks")
        return dict(sorted(self.report.items()))
