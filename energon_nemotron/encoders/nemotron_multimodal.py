"""The ``nemotron_multimodal`` task encoder: an Energon ``DefaultTaskEncoder`` that wires the stages.

cookers (by name) → ``preencode_sample`` (tokenize, packing cost; nothing decoded) →
``select_samples_to_pack`` (a registered packer over the buffer; every sample placed exactly once)
→ ``pack_selected_samples`` (one ``PackedRow``) → ``batch`` (``PackedBatch``). Without packing,
each batch row holds one sample. Everything up to the packing buffer is ``@stateless``.
"""

from __future__ import annotations

import zlib
from collections import Counter
from typing import Any, Literal, Optional, Union

from megatron.energon import DefaultTaskEncoder, SkipSample, stateless
from pydantic import Field, model_validator

from energon_nemotron.config import PackingConfig, StrictModel
from energon_nemotron.cookers import build_cookers
from energon_nemotron.errors import ConfigError, DataError
from energon_nemotron.packing.assemble import PackedRow, assemble_row, batch_rows, round_up
from energon_nemotron.registry import PACKERS, TASK_ENCODERS
from energon_nemotron.tokenization.conversation import ConversationTokenizer, NoTrainableTokensError
from energon_nemotron.types import Conversation, EncodedSample, EncodedSource, PackedBatch


class NemotronMultimodalOptions(StrictModel):
    """``task_encoder.options`` of ``nemotron_multimodal``."""

    prompt_format: str = "tokenizer"
    seq_length: int = Field(ge=2)
    train_only_on_last_assistant_turn: bool = False
    over_length: Literal["error", "skip", "truncate"] = "error"

    @model_validator(mode="after")
    def _known_format(self) -> "NemotronMultimodalOptions":
        from energon_nemotron.registry import PROMPT_FORMATS

        if self.prompt_format not in PROMPT_FORMATS:
            raise ValueError(f"unknown prompt_format {self.prompt_format!r}; known: {', '.join(PROMPT_FORMATS.names())}")
        return self


@TASK_ENCODERS.register("nemotron_multimodal")
class NemotronMultimodalTaskEncoder(DefaultTaskEncoder):
    """Task encoder of the Energon path (text; media plans are empty until media support).

    Args:
        tokenizer: a Hugging Face fast tokenizer or a local directory.
        options: :class:`NemotronMultimodalOptions` (or a dict of them).
        packing: a ``PackingConfig`` or None (one sample per row).
        default_cooker: cooker for datasets whose subflavors name none.
    """

    Options = NemotronMultimodalOptions
    decoder = None          # crude members stay raw bytes: media are decoded only when packed

    def __init__(self, tokenizer: Any, options: Union[NemotronMultimodalOptions, dict],
                 packing: Optional[PackingConfig] = None, default_cooker: Optional[str] = None,
                 seed: int = 0) -> None:
        super().__init__()
        self.options = options if isinstance(options, NemotronMultimodalOptions) else NemotronMultimodalOptions(**options)
        self.packing = packing
        self.pad_multiple = packing.pad_multiple if packing else 1
        if self.options.seq_length % self.pad_multiple:
            raise ConfigError(f"seq_length {self.options.seq_length} is not a multiple of "
                              f"packing.pad_multiple {self.pad_multiple}")
        self.packer = PACKERS.get(packing.algorithm) if packing else None
        self.seed = seed
        self.cookers = build_cookers(default_cooker)
        self.text = ConversationTokenizer(tokenizer, self.options.prompt_format)
        tok = self.text.tokenizer
        self.pad_id = next(i for i in (tok.pad_token_id, tok.eos_token_id, 0) if i is not None)
        self._skipped: Counter = Counter()

    # -- per sample ------------------------------------------------------------------------------
    @stateless
    def preencode_sample(self, sample: Conversation) -> EncodedSample:
        key = sample.__key__
        segments = sample.segment_messages()
        encoded = self.text.encode(segments, key, preformatted=sample.preformatted,
                                   last_only=self.options.train_only_on_last_assistant_turn)
        names = [key] if len(segments) == 1 else [f"{key}#{i}" for i in range(len(segments))]
        sources = [EncodedSource(n, t, m) for n, (t, m) in zip(names, encoded)]
        sources = self._fit(sources, key)
        cost = sum(round_up(int(s.tokens.shape[0]), self.pad_multiple) for s in sources)
        return EncodedSample.derive_from(sample, sources=sources, cost=cost, media_plans=[])

    def _fit(self, sources: list[EncodedSource], key: str) -> list[EncodedSource]:
        """Apply the over-length policy to a sample longer than ``seq_length``."""
        L = self.options.seq_length
        cost = sum(round_up(int(s.tokens.shape[0]), self.pad_multiple) for s in sources)
        if cost <= L:
            return sources
        policy = self.options.over_length
        if policy == "error":
            raise DataError(key, f"sample takes {cost} positions, more than seq_length={L} "
                                 "(task_encoder.options.over_length: error | skip | truncate)")
        if policy == "skip":
            self._skipped["over_length"] += 1
            raise SkipSample()
        kept, room = [], L
        for s in sources:
            if room <= 0:
                break
            n = min(int(s.tokens.shape[0]), room)
            kept.append(EncodedSource(s.key, s.tokens[:n], s.trained[:n]))
            room -= round_up(n, self.pad_multiple)
        if not any(s.trained[1:].any() for s in kept):
            raise NoTrainableTokensError(key, f"no trainable tokens remain after truncating to seq_length={L}")
        return kept

    # -- packing ---------------------------------------------------------------------------------
    def select_samples_to_pack(self, samples: list[EncodedSample]) -> list[list[EncodedSample]]:
        """Bins of the buffer by the registered packer; every sample exactly once."""
        # a seed derived from the buffer's keys: deterministic, and the same after a restore
        seed = zlib.crc32("\0".join(s.__key__ for s in samples).encode()) ^ self.seed
        bins = self.packer([s.cost for s in samples], self.options.seq_length,
                           max_sequences_per_bin=self.packing.max_sequences_per_bin, seed=seed)
        placed = sorted(i for b in bins for i in b)
        if placed != list(range(len(samples))):
            raise RuntimeError(f"packer {self.packing.algorithm!r} did not place every sample exactly once")
        return [[samples[i] for i in b] for b in bins]

    @stateless
    def pack_selected_samples(self, samples: list[EncodedSample]) -> PackedRow:
        sources = [src for s in samples for src in s.sources]
        fields = assemble_row(sources, self.options.seq_length, self.pad_multiple, self.pad_id)
        return PackedRow.derive_from(samples[0], __key__=",".join(s.__key__ for s in samples), **fields)

    # -- batching --------------------------------------------------------------------------------
    @stateless
    def batch(self, samples: list[Union[PackedRow, EncodedSample]]) -> PackedBatch:
        rows = [s if isinstance(s, PackedRow) else self.pack_selected_samples([s]) for s in samples]
        skipped, self._skipped = dict(self._skipped), Counter()
        return batch_rows(rows, skipped)
