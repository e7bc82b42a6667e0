"""The train loader for a NeMo-RL SFT v2 master config: NeMo-RL's packed batches and its state envelope.

``build_nemo_rl_loader(master, tokenizer=..., dp_rank=..., dp_size=...)`` maps the config
(``config.from_nemo_rl``), builds the library's Energon loader for that logical DP rank and yields
each batch as NeMo-RL's policy reads it (``batches.to_nemo_rl_packed``; a ``PackedBatch`` per pack
row otherwise would be label-aligned).

``state_dict()`` is shaped like NeMo-RL's ``EnergonSFTDataLoader.state_dict()``: ``backend``
(``"energon"``), ``format_version``, ``fingerprint`` (sha256 of the JSON ``identity``), ``identity``
(JSON values only, so NeMo-RL's ``torch.load(weights_only=True)`` checkpoint keeps loading) and
``loader_state`` (uint8 tensor: the library's own state as JSON). ``load_state_dict`` must come before
iterating; a changed identity is a ``ConfigError`` listing each differing key (``old -> new``).
:meth:`NemoRLLoader.load_elastic` restores from the envelopes of ALL ranks of a run saved with
another DP size (NeMo-RL refuses a DP change: its identity holds the logical world size).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Sequence, Union

import torch

from energon_nemotron.errors import ConfigError
from energon_nemotron.integrations.nemo_rl.batches import to_nemo_rl_packed
from energon_nemotron.integrations.nemo_rl.config import NemoRLConfig, from_nemo_rl
from energon_nemotron.loading import Loader, build_train_loader
from energon_nemotron.resume.codec import decode_json, encode_json
from energon_nemotron.resume.elastic import merge_rank_states

__all__ = ["NemoRLLoader", "build_nemo_rl_loader", "FORMAT_VERSION", "identity_differences"]

#: NeMo-RL's ``_V2_STATE_FORMAT_VERSION`` at #4108 (``sft_dataloader.py@5794ba95``)
FORMAT_VERSION = 3


def _brief(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def identity_differences(saved: Any, current: Any, path: str = "") -> list[str]:
    """Each key whose value changed, as ``key old -> new`` (``added`` / ``removed`` for one side)."""
    if isinstance(saved, Mapping) and isinstance(current, Mapping):
        out: list[str] = []
        for key in sorted(set(saved) | set(current)):
            child = f"{path}.{key}" if path else str(key)
            if key not in saved:
                out.append(f"{child} added {_brief(current[key])}")
            elif key not in current:
                out.append(f"{child} removed {_brief(saved[key])}")
            else:
                out += identity_differences(saved[key], current[key], child)
        return out
    return [] if saved == current else [f"{path} {_brief(saved)} -> {_brief(current)}"]


def _fingerprint(identity: Mapping) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode("utf-8")).hexdigest()


def _payload(state: dict) -> torch.Tensor:
    data = json.dumps(encode_json(state), sort_keys=True).encode("utf-8")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


class NemoRLLoader:
    """NeMo-RL's packed batches of one DP rank, with its checkpoint envelope (module docstring)."""

    def __init__(self, config: NemoRLConfig, loader: Loader) -> None:
        self.config, self.loader = config, loader
        self.identity = json.loads(json.dumps({"nemo_rl": config.identity, "loader": loader.fingerprint},
                                              sort_keys=True, default=str))
        self.fingerprint = _fingerprint(self.identity)
        self._started = False

    def __iter__(self) -> Iterator[dict]:
        self._started = True
        for batch in self.loader:
            yield to_nemo_rl_packed(batch)

    def telemetry(self) -> dict:
        return self.loader.telemetry()

    def close(self) -> None:
        """Stop the worker processes now (``Loader.close``); dropping the loader does it too."""
        self.loader.close()

    def state_dict(self) -> dict:
        return {"backend": "energon", "format_version": FORMAT_VERSION, "fingerprint": self.fingerprint,
                "identity": self.identity, "loader_state": _payload(self.loader.state_dict())}

    def _decode(self, state: Any, origin: str) -> dict:
        if not isinstance(state, Mapping):
            raise ConfigError(f"{origin}: not a loader state envelope (got {type(state).__name__})")
        if state.get("backend") != "energon":
            raise ConfigError(f"{origin}: backend {state.get('backend')!r}: not an Energon loader state")
        if state.get("format_version") != FORMAT_VERSION:
            raise ConfigError(f"{origin}: unsupported state format_version {state.get('format_version')!r} "
                              f"(this loader writes {FORMAT_VERSION})")
        payload = state.get("loader_state")
        if not isinstance(payload, torch.Tensor) or payload.dtype != torch.uint8:
            raise ConfigError(f"{origin}: loader_state must be a uint8 tensor")
        try:
            return decode_json(json.loads(payload.cpu().numpy().tobytes().decode("utf-8")))
        except (UnicodeDecodeError, ValueError, TypeError) as e:
            raise ConfigError(f"{origin}: loader_state is damaged ({type(e).__name__}: {e})") from None

    def _not_started(self, origin: str) -> None:
        if self._started:
            raise ConfigError(f"{origin}: a loader state must be restored before iterating")

    def load_state_dict(self, state: Mapping, origin: str = "the NeMo-RL loader state") -> None:
        """Resume exactly where the saving loader stood (same configuration and DP layout)."""
        self._not_started(origin)
        inner = self._decode(state, origin)
        if state.get("fingerprint") != self.fingerprint:
            saved = state.get("identity")
            diff = identity_differences(saved, self.identity) if isinstance(saved, Mapping) else []
            raise ConfigError(f"{origin}: the loader identity changed: " + ("; ".join(diff) if diff else
                              "the state carries no identity to compare") + " (a DP-size change: load_elastic)")
        self.loader.load_state_dict(inner, origin=origin)

    def load_elastic(self, states: Sequence[Mapping], origin: str = "the NeMo-RL loader states") -> None:
        """Resume from the envelopes of every rank of a run saved on any DP size: this rank yields,
        with the others of the new layout, exactly the samples of the epoch in progress that none had
        yielded (``energon_nemotron.resume.elastic``)."""
        self._not_started(origin)
        inner = [self._decode(s, f"{origin}[{i}]") for i, s in enumerate(states)]
        self.loader.load_state_dict(merge_rank_states(inner), origin=origin, elastic=True)


def build_nemo_rl_loader(master: Union[str, Path, dict], *, tokenizer: Optional[Union[str, Path]] = None,
                         dp_rank: int = 0, dp_size: int = 1) -> NemoRLLoader:
    """The train loader of a NeMo-RL SFT v2 master config for logical DP rank ``dp_rank`` of ``dp_size``."""
    config = from_nemo_rl(master, tokenizer=tokenizer, dp_rank=dp_rank, dp_size=dp_size)
    return NemoRLLoader(config, build_train_loader(config.loader))
