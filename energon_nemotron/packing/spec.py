"""The packer protocol: what a function registered in ``registry.PACKERS`` takes and returns.

A packer is ``fn(lengths, capacity, *, max_sequences_per_bin=None, seed=0) -> list[list[int]]``
(:class:`Packer`; the guarantees are in ``packing.algorithms``). A packer that also keeps a second
budget per bin (e.g. vision patches, ``packing.max_media_patches_per_pack``) takes ``secondary``
(one size per item) and ``secondary_capacity`` too (:class:`TwoBudgetPacker`) and says so when it
is registered: ``register_packer(name, second_budget=True)``. A packer that can make bins of even
work takes ``work`` (one figure per item, ``packing.balance.CostModel``'s extra work) and
is registered with ``even=True`` (``packing.balance.even_packs``). Nothing inspects a packer's
signature; a packer registered without this function has one budget. A packer may take further
keyword-only options of its own, given only when configured (``balanced_greedy_knapsack``:
``balanced_knapsack_delta``, from ``packing.balanced_knapsack_delta``).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Protocol, Sequence

import numpy as np

from energon_nemotron.registry import PACKERS

__all__ = ["Packer", "TwoBudgetPacker", "register_packer", "has_second_budget", "second_budget_packers",
           "makes_even_bins"]

#: the attribute ``register_packer`` sets on a packer with a second budget
SECOND_BUDGET = "second_budget"
#: the attribute ``register_packer`` sets on a packer that takes ``work`` (bins of even work)
EVEN = "even_bins"


class Packer(Protocol):
    def __call__(self, lengths: Sequence[int] | np.ndarray, capacity: int, *,
                 max_sequences_per_bin: Optional[int] = None, seed: int = 0) -> list[list[int]]: ...


class TwoBudgetPacker(Protocol):
    def __call__(self, lengths: Sequence[int] | np.ndarray, capacity: int, *,
                 max_sequences_per_bin: Optional[int] = None, seed: int = 0,
                 secondary: Optional[Sequence[int]] = None,
                 secondary_capacity: Optional[int] = None) -> list[list[int]]: ...


def register_packer(name: str, *, second_budget: bool = False, even: bool = False) -> Callable[[Callable], Callable]:
    """Decorator: register a packer in ``registry.PACKERS`` under ``name``; ``second_budget``: it is
    a :class:`TwoBudgetPacker`; ``even``: it takes ``work`` and makes bins of even work."""

    def add(fn: Callable) -> Callable:
        setattr(fn, SECOND_BUDGET, second_budget)
        setattr(fn, EVEN, even)
        return PACKERS.register(name, fn)

    return add


def has_second_budget(packer: Callable) -> bool:
    """Whether a registered packer keeps a second budget (declared by :func:`register_packer`)."""
    return getattr(packer, SECOND_BUDGET, False) is True


def makes_even_bins(packer: Callable) -> bool:
    """Whether a registered packer takes ``work`` (declared by :func:`register_packer`)."""
    return getattr(packer, EVEN, False) is True


def second_budget_packers() -> list[str]:
    """The registered packers with a second budget."""
    return [n for n in PACKERS.names() if has_second_budget(PACKERS.get(n))]


def packer_options(packing: Any, patches: Sequence[int]) -> dict:
    """The keyword arguments a packer gets from the ``packing`` config (a ``PackingConfig``) for
    one buffer whose items hold ``patches`` media patches (int [N]): the count limit, the second
    budget when ``max_media_patches_per_pack`` is set, ``balanced_knapsack_delta`` when set (the
    config allows it for ``balanced_greedy_knapsack`` only). The encoder and ``stats`` pack alike."""
    out: dict = {"max_sequences_per_bin": packing.max_sequences_per_bin}
    if packing.max_media_patches_per_pack:
        out.update(secondary=list(patches), secondary_capacity=packing.max_media_patches_per_pack)
    if packing.balanced_knapsack_delta is not None:
        out["balanced_knapsack_delta"] = packing.balanced_knapsack_delta
    return out
