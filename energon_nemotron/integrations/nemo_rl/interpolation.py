"""OmegaConf-style ``${...}`` interpolations of a NeMo-RL master config, resolved without OmegaConf.

NeMo-RL's YAML refers to other keys (``max_input_seq_length: ${policy.max_total_sequence_length}``)
and to the resolvers it registers (``${mul:${a},${b}}``). A value that is one interpolation keeps
the referenced value's type; one embedded in a longer string is rendered into it. Supported: absolute
``${dotted.key}`` references (list items by index: ``${a.0}``) and the resolvers of
:data:`RESOLVERS`; anything else is a ``ConfigError`` naming the key. Cycles are errors too.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable

from energon_nemotron.errors import ConfigError

__all__ = ["resolve", "RESOLVERS"]


def _numbers(args: list[Any], name: str, where: str) -> list[float]:
    out = []
    for a in args:
        if isinstance(a, bool) or not isinstance(a, (int, float)):
            raise ConfigError(f"{where}: ${{{name}:...}} takes numbers, got {a!r}")
        out.append(a)
    return out


#: the resolvers NeMo-RL registers that its configs use, by name: ``fn(args, where) -> value``
RESOLVERS: dict[str, Callable[[list[Any], str], Any]] = {
    "mul": lambda a, w: math.prod(_numbers(a, "mul", w)),
    "div": lambda a, w: (lambda x: x[0] / x[1])(_numbers(a, "div", w)),
    "max": lambda a, w: max(_numbers(a, "max", w)),
    "min": lambda a, w: min(_numbers(a, "min", w)),
}

_WHOLE = re.compile(r"^\$\{([^${}]*)\}$")
_INNER = re.compile(r"\$\{([^${}]*)\}")


def _lookup(root: Any, dotted: str, where: str) -> Any:
    node = root
    for part in dotted.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise ConfigError(f"{where}: ${{{dotted}}} refers to a key the config does not have")
    return node


def _scalar(text: str) -> Any:
    """A resolver argument as YAML would read it (numbers stay numbers)."""
    t = text.strip()
    for cast in (int, float):
        try:
            return cast(t)
        except ValueError:
            pass
    return {"true": True, "false": False, "null": None}.get(t.lower(), t)


class _Resolver:
    def __init__(self, root: dict) -> None:
        self.root, self.active, self.done = root, [], {}

    def value(self, node: Any, where: str) -> Any:
        if isinstance(node, dict):
            return {k: self.value(v, f"{where}.{k}" if where else str(k)) for k, v in node.items()}
        if isinstance(node, list):
            return [self.value(v, f"{where}[{i}]") for i, v in enumerate(node)]
        if isinstance(node, str) and "${" in node:
            return self.text(node, where)
        return node

    def key(self, dotted: str, where: str) -> Any:
        if dotted in self.done:
            return self.done[dotted]
        if dotted in self.active:
            raise ConfigError(f"{where}: the interpolation ${{{dotted}}} refers to itself "
                              f"({' -> '.join(self.active + [dotted])})")
        self.active.append(dotted)
        try:
            out = self.value(_lookup(self.root, dotted, where), dotted)
        finally:
            self.active.pop()
        self.done[dotted] = out
        return out

    def one(self, body: str, where: str) -> Any:
        if ":" in body:
            name, _, rest = body.partition(":")
            fn = RESOLVERS.get(name.strip())
            if fn is None:
                raise ConfigError(f"{where}: unknown resolver ${{{name}:...}}; known: {', '.join(RESOLVERS)} "
                                  "(resolve the config with NeMo-RL's OmegaConf first, or write the value)")
            return fn([_scalar(a) if isinstance(a, str) else a for a in self.args(rest, where)], where)
        if not body or body.startswith("."):
            raise ConfigError(f"{where}: ${{{body}}}: only absolute references are resolved here")
        return self.key(body.strip(), where)

    def args(self, text: str, where: str) -> list[Any]:
        out, depth, start = [], 0, 0
        for i, ch in enumerate(text + ","):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                part = text[start:i].strip()
                out.append(self.text(part, where) if "${" in part else part)
                start = i + 1
        return out

    def text(self, text: str, where: str) -> Any:
        # innermost first, so that ${mul:${a},${b}} sees its arguments' values
        whole = _WHOLE.match(text)
        if whole:
            return self.one(whole.group(1), where)
        while True:
            m = _INNER.search(text)
            if m is None:
                return text
            value = self.one(m.group(1), where)
            if m.span() == (0, len(text)):
                return value
            text = text[:m.start()] + (str(value) if not isinstance(value, str) else value) + text[m.end():]
            if text.startswith("${") and _WHOLE.match(text):
                return self.one(_WHOLE.match(text).group(1), where)


def resolve(config: dict) -> dict:
    """``config`` with every ``${...}`` interpolation resolved (a new dict; see the module docstring)."""
    return _Resolver(config).value(config, "")
