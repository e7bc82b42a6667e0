"""Tokenization once per packing buffer, as a stage of its own.

With packing, the task encoder maps each sample through ``prepare_sample`` (cooked, media planned,
text rendered and checked; nothing tokenized) and the pre-packer hands the whole buffer to a
:class:`BufferTokenizer`, which tokenizes every prepared sample's text in one tokenizer call and
finishes each (loss flags, sources, over-length policy, packing cost). The result is the same as
tokenizing sample by sample (``ConversationTokenizer.tokenize`` encodes each piece on its own);
the speed is not: a tokenizer called once per sample between the other per-sample work runs at
about half its speed (docs/performance.md). A sample failing here goes to the loader's error
policy through an Energon error context of its own, named as the stage it replaces
(``preencode_sample``), with that stage's failure tolerance: ``on_error: skip`` drops and counts
it, the others keep their order.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from energon_nemotron._energon import stage_error_context
from energon_nemotron.types import EncodedSample

__all__ = ["BufferTokenizer"]


class BufferTokenizer:
    """``tokenize(prepared list) -> encodings per sample`` (one call) and ``finish(sample,
    encodings) -> EncodedSample``, with errors handled as in the stage named ``stage``."""

    def __init__(self, tokenize: Callable[[list], list], finish: Callable[[EncodedSample, Any], EncodedSample],
                 stage: str, handler: Callable, tolerance: int) -> None:
        self.tokenize, self.finish = tokenize, finish
        self.stage, self.handler, self.tolerance = stage, handler, tolerance
        self._errors: Optional[Any] = None          # the error context, made in the worker at first use

    def __call__(self, samples: Sequence[EncodedSample], holes: bool = False) -> list[Optional[EncodedSample]]:
        """``samples`` with every prepared one (``pending`` set) tokenized and finished; a sample
        failing is handed to the error policy and left out (``holes``: None in its place)."""
        pending = [s for s in samples if s.pending is not None]
        if not pending:
            return list(samples)
        encodings = iter(self.tokenize([s.pending.prepared for s in pending]))
        if self._errors is None:
            self._errors = stage_error_context(self.stage, self.handler, self.tolerance)
        out = []
        for s in samples:
            if s.pending is None:
                out.append(s)
                continue
            done = None
            with self._errors.handle_errors(s.pending.origin):
                done = self.finish(s, next(encodings))
            if done is not None or holes:
                out.append(done)
        return out
