"""The over-length policy (``task_encoder.options.over_length``): what happens to a sample whose
sources take more positions than ``seq_length``.

A source of n tokens takes ``round_up(n, pad_multiple)`` positions (:meth:`OverLengthPolicy.cost`,
the packing cost). ``error``: a ``DataError`` (``over_length``); ``skip``: :class:`OverLengthSkip`
(an Energon ``SkipSample``: the sample is dropped, the caller counts it); ``truncate``: the sources
are cut, in order, to what fits (a sample with media is never cut: a placeholder would be split;
nothing trained left is a ``NoTrainableTokensError``). :meth:`OverLengthPolicy.fit` returns the
kept sources and what the sample measured before the policy (the ``stats`` reader records it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from megatron.energon import SkipSample

from energon_nemotron.errors import DataError
from energon_nemotron.packing.assemble import round_up
from energon_nemotron.tokenization.conversation import NoTrainableTokensError
from energon_nemotron.types import EncodedSource

#: the values of ``task_encoder.options.over_length``
MODES = ("error", "skip", "truncate")

__all__ = ["OverLengthPolicy", "OverLengthSkip", "Fitted", "MODES"]


@dataclass(frozen=True)
class Fitted:
    """A sample's sources after the policy and the positions they take (``cost``, the packing
    cost), and its ``length`` (positions) and ``tokens`` before the policy."""

    sources: list[EncodedSource]
    cost: int
    length: int
    tokens: int


class OverLengthSkip(SkipSample):
    """``over_length: skip`` dropped a sample of ``length`` positions (``tokens`` tokens)."""

    def __init__(self, key: str, length: int, tokens: int) -> None:
        super().__init__(f"{key}: sample takes {length} positions")
        self.key, self.length, self.tokens = key, length, tokens


class OverLengthPolicy:
    """``mode`` (one of :data:`MODES`) for rows of ``seq_length`` positions, sources padded to
    ``pad_multiple``."""

    def __init__(self, mode: str, seq_length: int, pad_multiple: int) -> None:
        if mode not in MODES:
            raise ValueError(f"over_length must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode, self.seq_length, self.pad_multiple = mode, seq_length, pad_multiple

    def cost(self, sources: Sequence[EncodedSource]) -> int:
        """Positions the sources take in a pack (each rounded up to the pad multiple)."""
        return sum(round_up(int(s.tokens.shape[0]), self.pad_multiple) for s in sources)

    def measure(self, sources: Sequence[EncodedSource]) -> tuple[int, int]:
        """(positions, tokens) the sources take before the policy."""
        return self.cost(sources), sum(int(s.tokens.shape[0]) for s in sources)

    def fit(self, sources: list[EncodedSource], key: str, has_media: bool) -> Fitted:
        """The sources of sample ``key`` under the policy (see the module docstring)."""
        L = self.seq_length
        length, tokens = self.measure(sources)
        if length <= L:
            return Fitted(sources, length, length, tokens)
        if self.mode == "error":
            raise DataError(key, f"sample takes {length} positions, more than seq_length={L} "
                                 "(task_encoder.options.over_length: error | skip | truncate)", "over_length")
        if self.mode == "skip":
            raise OverLengthSkip(key, length, tokens)
        if has_media:
            raise DataError(key, f"sample takes {length} positions, more than seq_length={L}, and has media: "
                                 "it cannot be truncated without cutting a placeholder (use over_length: skip)",
                            "over_length")
        kept, room = [], L
        for s in sources:
            if room <= 0:
                break
            n = min(int(s.tokens.shape[0]), room)
            kept.append(EncodedSource(s.key, s.tokens[:n], s.trained[:n]))
            room -= round_up(n, self.pad_multiple)
        if not any(s.trained[1:].any() for s in kept):
            raise NoTrainableTokensError(key, f"no trainable tokens remain after truncating to seq_length={L}")
        return Fitted(kept, self.cost(kept), length, tokens)
