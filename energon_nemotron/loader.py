"""Loader config → iterables of ``PackedBatch``: Energon loaders or Megatron-LM prepacked rows.

``build_train_loader(config)`` / ``build_val_loader(config)`` accept a ``LoaderConfig``, a YAML path
or a dict. Energon sources go through ``get_train_dataset``/``get_val_dataset`` with the named task
encoder and ``get_savable_loader``; ``megatron_sft_packed`` sources bypass online packing and go
through a PyTorch ``DataLoader`` over ``MegatronSFTPackedDataset`` with ``collate_rows``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Union

import torch

from energon_nemotron.config import EnergonSource, LoaderConfig, MegatronSource, load_config
from energon_nemotron.errors import ConfigError
from energon_nemotron.registry import TASK_ENCODERS

ConfigLike = Union[LoaderConfig, str, Path, dict]


def _config(config: ConfigLike) -> LoaderConfig:
    return config if isinstance(config, LoaderConfig) else load_config(config)


def build_task_encoder(config: ConfigLike):
    """The configured task encoder; its ``options`` are validated by the encoder's own model."""
    cfg = _config(config)
    try:
        cls = TASK_ENCODERS.get(cfg.task_encoder.name)
    except KeyError as e:
        raise ConfigError(f"task_encoder.name: {e.args[0]}") from None
    from pydantic import ValidationError

    from energon_nemotron.config import format_validation_error

    try:
        options = cls.Options(**cfg.task_encoder.options)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, "task_encoder.options")) from None
    return cls(cfg.tokenizer, options, packing=cfg.packing, default_cooker=cfg.data.default_cooker,
               seed=cfg.loader.seed)


def _worker_config(cfg: LoaderConfig):
    from megatron.energon import WorkerConfig
    from megatron.energon.errors import reraise_exception

    return WorkerConfig(rank=0, world_size=1, num_workers=cfg.loader.num_workers, seed_offset=cfg.loader.seed,
                        global_error_handler=reraise_exception)


def _megatron_loader(cfg: LoaderConfig, src: MegatronSource, validation: bool) -> Iterable:
    from energon_nemotron.megatron_packed import MegatronSFTPackedDataset, MegatronSFTPackedEncoder, collate_rows

    encoder = MegatronSFTPackedEncoder(cfg.tokenizer, src.seq_length, prompt_format=src.prompt_format,
                                       context_parallel_size=src.context_parallel_size, pad_token=src.pad_token,
                                       chat_key=src.chat_key, identity_masks_prompt=src.identity_masks_prompt,
                                       allow_eos_pad=src.allow_eos_pad)
    dataset = MegatronSFTPackedDataset(src.path, encoder, validation=validation)
    return torch.utils.data.DataLoader(dataset, batch_size=cfg.loader.batch_size, collate_fn=collate_rows,
                                       num_workers=cfg.loader.num_workers)


def _energon_loader(cfg: LoaderConfig, src: EnergonSource, validation: bool, repeat: bool) -> Iterable:
    from megatron.energon import get_savable_loader, get_train_dataset, get_val_dataset

    encoder = build_task_encoder(cfg)
    common = dict(worker_config=_worker_config(cfg), batch_size=cfg.loader.batch_size, task_encoder=encoder,
                  packing_buffer_size=cfg.packing.buffer_size if cfg.packing else None)
    try:
        if validation:
            dataset = get_val_dataset(str(src.path), split_part=src.split, **common)
        else:
            dataset = get_train_dataset(str(src.path), split_part=src.split, repeat=repeat,
                                        shuffle_buffer_size=cfg.loader.shuffle_buffer_size,
                                        max_samples_per_sequence=None, **common)
    except AssertionError as e:
        if "Cannot blend with dataset weights" in str(e):
            raise ConfigError(f"{src.path}: a weighted blend has no epoch, so it cannot be read once; use "
                              "blend_epochized in the metadataset, or read a number of batches") from None
        raise
    except ValueError as e:
        if "No cooker found" in str(e):
            raise ConfigError(f"{src.path}: the dataset's subflavors name no registered cooker ({e}); set "
                              "subflavors: {cooker: NAME} in its .nv-meta/dataset.yaml or metadataset, or "
                              "data.default_cooker in the loader config") from None
        raise
    return get_savable_loader(dataset, gc_collect_every_n_steps=0, watchdog_timeout_seconds=None)


def _build(config: ConfigLike, validation: bool, repeat: bool) -> Iterable:
    cfg = _config(config)
    src = cfg.data.validation if validation else cfg.data.train
    if src is None:
        raise ConfigError("data.validation is not set")
    if isinstance(src, MegatronSource):
        return _megatron_loader(cfg, src, validation)
    return _energon_loader(cfg, src, validation, repeat)


def build_train_loader(config: ConfigLike, repeat: bool = True) -> Iterable:
    """Batches of the training split (``repeat=False``: one epoch, each sample once)."""
    return _build(config, validation=False, repeat=repeat)


def build_val_loader(config: ConfigLike) -> Iterable:
    """Batches of the validation split (one pass)."""
    return _build(config, validation=True, repeat=False)


def describe(config: ConfigLike) -> dict[str, Any]:
    """A short summary of a config (for logs and previews)."""
    cfg = _config(config)
    return {"train": str(cfg.data.train.path), "format": cfg.data.train.format,
            "packing": cfg.packing.algorithm if cfg.packing else None}
