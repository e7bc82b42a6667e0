"""One Megatron-LM offline-packed row → training tensors, exactly as Megatron-LM's ``SFTDataset``.

Algorithm (Megatron-LM main d98e8a64dd, ``SFTDataset.__getitem__``), with L = ``seq_length``:

1. split the row at every ``system`` message; tokenize each conversation (``SFTConversationTokenizer``);
2. append its tokens and targets to the pack, positions restarting at 0; under CP>1 pad the pack to
   a multiple of 2·CP with the pad id (tokens and targets; positions continue); record the boundary;
3. once the pack reaches L+1 tokens: keep the first L, append one pad, set the last boundary to L
   and drop the remaining conversations (a truncation, reported);
4. otherwise pad to L+1 (positions continue) and set the last boundary to L;
5. one shift over the whole pack: ``tokens = pack[:-1]``, ``labels = targets[1:]``,
   ``position_ids = positions[:-1]``; ``loss_mask = 0`` where the label is the pad id or -100.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch

from energon_nemotron.errors import ConfigError, DataError
from energon_nemotron.megatron_packed.conversation import row_messages, split_conversations
from energon_nemotron.megatron_packed.sft_tokenizer import SFTConversationTokenizer, TokenizedConversation
from energon_nemotron.tokenization.reserved import ReservedTokens
from energon_nemotron.batch import IGNORE_INDEX


def _usable(tc: TokenizedConversation, where: Optional[str]) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, targets) of a tokenized conversation; its deferred error, or an empty one, raises."""
    tokens, targets = tc.get()
    if tokens.shape[0] == 0:
        raise DataError(where, "the conversation renders to no tokens", "empty_conversation")
    return tokens, targets


def check_reserved(reserved: ReservedTokens, conversation: list[dict], tokens: np.ndarray,
                   where: Optional[str]) -> None:
    """A media placeholder token (``<image>``, ``<so_embedding>``, ... where the tokenizer has it, as
    a Nemotron Omni tokenizer does) in a text-only row is a ``DataError`` (``reserved_tag``): the
    model would look for media embeddings the row does not have. The message texts are checked
    (naming the message), then the conversation's ``tokens`` (int64 [n]): the final word, whatever
    the prompt format or chat template rendered."""
    if not reserved.ids:
        return
    for i, m in enumerate(conversation):
        tag = reserved.find_in_text(m["content"])
        if tag is not None:
            raise DataError(where, f"message {i} ({m['role']}) contains the reserved media tag {tag}: this "
                                   "tokenizer makes it a media placeholder token, which a text-only row cannot "
                                   "fill; remove it from the text", "reserved_tag")
    j = reserved.find_in_ids(tokens)
    if j is not None:
        raise DataError(where, f"token {j} of the rendered conversation is the media placeholder "
                               f"{reserved.ids[int(tokens[j])]} (prompt format or chat template output), which a "
                               "text-only row cannot fill", "reserved_tag")


def _tokenizer_dir(tokenizer: Any) -> Optional[Path]:
    """The local folder a tokenizer was loaded from (a path given, or a loaded tokenizer's
    ``name_or_path`` when that is a folder), else None."""
    source = tokenizer if isinstance(tokenizer, (str, Path)) else getattr(tokenizer, "name_or_path", None)
    if source and Path(source).is_dir():
        return Path(source)
    return None


def cp_granularity(context_parallel_size: int) -> int:
    """Multiple every conversation is padded to: 2·CP when CP > 1, else 1."""
    return 2 * context_parallel_size if context_parallel_size > 1 else 1


class MegatronSFTPackedEncoder:
    """Encodes Megatron-LM offline-packed JSONL rows (``{"messages": [...]}``).

    Args:
        tokenizer: a Hugging Face tokenizer object or a local tokenizer directory.
        seq_length: L, the length of every output row.
        prompt_format: ``identity`` (default) | ``nemotron-h-aligned`` | ``nemotron-nano-v2`` | ``default``.
        context_parallel_size: CP; each conversation is padded to a multiple of 2·CP when > 1.
        pad_token: overrides the format's pad token (``<unk>``, ``<SPECIAL_233>``, pad-or-EOS).
        chat_key: the row key holding the message list.
        identity_masks_prompt: False gives Megatron-LM v0.18–v0.19 ``identity`` (every token trained).
        allow_eos_pad: accept a pad id equal to EOS (masks every EOS label, as Megatron-LM ``default``
            does for tokenizers without a pad token).
    """

    def __init__(self, tokenizer: Any, seq_length: int, prompt_format: str = "identity",
                 context_parallel_size: int = 1, pad_token: Optional[str] = None,
                 chat_key: str = "messages", identity_masks_prompt: bool = True,
                 allow_eos_pad: bool = False) -> None:
        if not isinstance(seq_length, int) or seq_length < 1:
            raise ConfigError(f"seq_length must be a positive integer, got {seq_length!r}")
        if not isinstance(context_parallel_size, int) or context_parallel_size < 1:
            raise ConfigError(f"context_parallel_size must be >= 1, got {context_parallel_size!r}")
        g = cp_granularity(context_parallel_size)
        if seq_length % g:
            raise ConfigError(f"seq_length {seq_length} is not a multiple of 2*context_parallel_size = {g}")
        self.seq_length = seq_length
        self.context_parallel_size = context_parallel_size
        self.chat_key = chat_key
        self.sft = SFTConversationTokenizer(tokenizer, prompt_format, identity_masks_prompt,
                                            pad_token, allow_eos_pad)
        self.tokenizer = self.sft.tokenizer
        self.prompt_format = prompt_format
        self.pad_id = self.sft.pad_id
        self.reserved = ReservedTokens(self.tokenizer)
        self.identity_masks_prompt = identity_masks_prompt
        self.allow_eos_pad = allow_eos_pad
        self.tokenizer_dir = _tokenizer_dir(tokenizer)
        self._options = {"tokenizer": str(self.tokenizer_dir) if self.tokenizer_dir is not None else self.tokenizer,
                         "seq_length": seq_length, "prompt_format": prompt_format,
                         "context_parallel_size": context_parallel_size, "pad_token": pad_token,
                         "chat_key": chat_key, "identity_masks_prompt": identity_masks_prompt,
                         "allow_eos_pad": allow_eos_pad}
        self._signature: Optional[dict] = None

    def _tokens(self, tc: TokenizedConversation, conversation: list[dict], where: Optional[str]
                ) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, targets) of a conversation that is used: ``_usable``, and no media placeholder."""
        tokens, targets = _usable(tc, where)
        check_reserved(self.reserved, conversation, tokens, where)
        return tokens, targets

    def conversations(self, row: Any, where: Optional[str] = None) -> list[list[dict]]:
        """The validated conversations of a row."""
        return split_conversations(row_messages(row, self.chat_key, where))

    def conversation_costs(self, conversations: list[list[dict]], wheres: Sequence[Optional[str]]) -> list[int]:
        """Pack positions each conversation takes: its tokens rounded up to a multiple of 2·CP
        (``DataError`` naming ``wheres[i]`` for a conversation that cannot be encoded)."""
        costs = self.conversation_costs_or_errors(conversations, wheres)
        for c in costs:
            if isinstance(c, DataError):
                raise c
        return costs

    def conversation_costs_or_errors(self, conversations: list[list[dict]], wheres: Sequence[Optional[str]]
                                     ) -> list[int | DataError]:
        """:meth:`conversation_costs`, with the ``DataError`` of a conversation that cannot be
        encoded in its place instead of raised (one tokenizer call for all, errors per item)."""
        g = cp_granularity(self.context_parallel_size)
        costs: list[int | DataError] = []
        for tc, conv, where in zip(self.sft.tokenize(conversations, wheres), conversations, wheres):
            try:
                n = int(self._tokens(tc, conv, where)[0].shape[0])
            except DataError as e:
                costs.append(e)
                continue
            costs.append(n + (-n % g))
        return costs

    def options(self) -> dict[str, Any]:
        """Keyword arguments that build this encoder again (in another process: the tokenizer as its
        folder when it has one, else the tokenizer object)."""
        return dict(self._options)

    def signature(self) -> dict[str, Any]:
        """What the rows depend on, as recorded in a pack manifest and compared when reading:
        ``tokenizer_sha256`` (sha256 over the tokenizer folder's files, as the loader's resume
        fingerprint; None when the encoder was given a tokenizer object without a local folder),
        prompt format, seq_length, CP size, the pad token and id, chat key, identity masking,
        ``allow_eos_pad``."""
        if self._signature is None:
            from energon_nemotron.resume.fingerprint import file_digest

            folder = self.tokenizer_dir
            self._signature = {
                "tokenizer_sha256": file_digest(*folder.glob("*")) if folder is not None else None,
                "prompt_format": self.prompt_format, "seq_length": self.seq_length,
                "context_parallel_size": self.context_parallel_size,
                "pad_token": self.tokenizer.convert_ids_to_tokens(self.pad_id), "pad_id": self.pad_id,
                "chat_key": self.chat_key, "identity_masks_prompt": self.identity_masks_prompt,
                "allow_eos_pad": self.allow_eos_pad,
            }
        return dict(self._signature)

    def conversation_cost(self, conversation: list[dict], where: Optional[str] = None) -> int:
        """:meth:`conversation_costs` of one conversation."""
        return self.conversation_costs([conversation], [where])[0]

    def encode(self, row: Any, where: Optional[str] = None) -> dict[str, Any]:
        """Tensors for one row (``where``, e.g. ``"train.jsonl.packed:12"``, names it in errors).

        Returns:
            ``tokens`` int64 [L], ``labels`` int64 [L] (-100 and the pad id kept as Megatron-LM emits
            them), ``loss_mask`` float32 [L], ``position_ids`` int64 [L], ``cu_seqlens`` int32 [n+1]
            (stripped: what reaches ``PackedSeqParams``), ``max_seqlen`` int, ``padding_mask`` bool [L]
            (True where no conversation's token sits: CP pads and the row's tail); and metadata:
            ``sample_keys`` (one per kept conversation), ``num_conversations``, ``truncated`` (bool),
            ``dropped_conversations`` (int), ``pad_in_content`` (pad ids inside real tokens).
        """
        convs = self.conversations(row, where)
        wheres = [f"{where or 'row'}#{ci}" for ci in range(len(convs))]
        tokenized = self.sft.tokenize(convs, wheres)
        L = self.seq_length
        cap = L + 1
        g = cp_granularity(self.context_parallel_size)
        pad = self.pad_id
        pack_tokens = np.full(cap, pad, dtype=np.int64)
        pack_targets = np.full(cap, pad, dtype=np.int64)
        positions = np.zeros(cap, dtype=np.int64)
        padding = np.ones(cap, dtype=bool)
        cu = [0]
        n = kept = pad_in_content = 0
        truncated = False
        for ci, tc in enumerate(tokenized):
            if n >= L:                  # exactly full: Megatron-LM appends the next conversation and
                truncated = True        # truncates it away entirely, leaving [..., L, L] -> [..., L]
                break
            tokens, targets = self._tokens(tc, convs[ci], wheres[ci])
            m = int(tokens.shape[0])
            end = n + m + (-m % g)      # with its CP pad: the pack stays a multiple of 2*CP
            take = min(end, cap) - n
            real = min(m, take)
            pack_tokens[n:n + real] = tokens[:real]
            pack_targets[n:n + real] = targets[:real]
            padding[n:n + real] = False
            positions[n:n + take] = np.arange(take)
            pad_in_content += int(np.count_nonzero(tokens[:real] == pad))
            kept += 1
            n = end
            cu.append(min(n, L))
            if n >= cap:                # cut at L, one pad appended, later conversations dropped
                pack_tokens[L] = pad
                pack_targets[L] = pad
                truncated = True
                break
        if not truncated:               # pad to L+1, positions continuing the last conversation
            last = int(positions[n - 1])
            positions[n:] = np.arange(last + 1, last + 1 + cap - n)
            cu[-1] = L
        labels = pack_targets[1:]
        loss_mask = ((labels != pad) & (labels != IGNORE_INDEX)).astype(np.float32)
        keys_base = where or "row"
        return {
            "tokens": torch.from_numpy(pack_tokens[:L].copy()),
            "labels": torch.from_numpy(labels.copy()),
            "loss_mask": torch.from_numpy(loss_mask),
            "position_ids": torch.from_numpy(positions[:L].copy()),
            "padding_mask": torch.from_numpy(padding[:L].copy()),
            "cu_seqlens": torch.tensor(cu, dtype=torch.int32),
            "max_seqlen": int(max(b - a for a, b in zip(cu, cu[1:]))),
            "sample_keys": [f"{keys_base}#{i}" for i in range(kept)],
            "num_conversations": len(convs),
            "truncated": truncated,
            "dropped_conversations": len(convs) - kept,
            "pad_in_content": pad_in_content,
        }


#: the encoder settings a ``megatron_sft_packed`` source (``config.MegatronSource``) and the
#: ``pack-megatron`` / ``inspect-megatron`` commands give, by :class:`MegatronSFTPackedEncoder`'s names
ENCODER_SETTINGS = ("seq_length", "prompt_format", "context_parallel_size", "pad_token", "chat_key",
                    "identity_masks_prompt", "allow_eos_pad")


def encoder_from(tokenizer: Any, settings: Any) -> MegatronSFTPackedEncoder:
    """The encoder of ``settings``: any object with the attributes :data:`ENCODER_SETTINGS` (a
    ``MegatronSource``, the CLI's parsed arguments)."""
    return MegatronSFTPackedEncoder(tokenizer, **{k: getattr(settings, k) for k in ENCODER_SETTINGS})
