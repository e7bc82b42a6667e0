"""A Megatron-Bridge recipe's ``cfg.dataset`` that trains on this library's task encoder.

Bridge's declarative ``EnergonDatasetConfig`` accepts only Bridge's own task-encoder configs, so a
recipe names :class:`NemotronEnergonProvider` instead::

    cfg.dataset = NemotronEnergonProvider(loader_config="encoder.yaml", seq_length=cfg.model.seq_length,
                                          packing_buffer_size=64, num_workers=4)

Bridge's training setup takes any ``cfg.dataset`` that is a ``megatron.bridge.data.base.DatasetProvider``
(``data.utils.get_dataset_provider``): the class registers itself as a virtual subclass of that
ABC when it is made (Bridge is imported then, never when this module is), so nothing here imports
Bridge or megatron-core at import time. What Bridge then calls:

- ``finalize()``, from ``ConfigContainer.validate()`` at the start of ``pretrain``/``finetune``,
  before the process groups and the model: the checks that need only the recipe's values and the
  YAML (:meth:`NemotronEnergonProvider.validate`; a ``ConfigError`` naming the option and the fix);
- ``build_datasets(context)``, from setup's data stage (``DatasetBuildContext``: sample counts,
  Bridge's tokenizer, the run's ``pg_collection``): the checks against the run (the micro-batch
  size in megatron-core's micro-batch calculator, the CP/PP sizes of ``pg_collection``), then the
  task encoder from the YAML (``loading.build_task_encoder``) inside Bridge's own
  ``EnergonMultiModalDataModule`` with ``pg_collection``, which reads with the pure data-parallel
  rank, so the TP/CP ranks of one replica get the same batches. It returns the data module's
  ``EnergonDataloader`` itself (its ``save_state``/``restore_state`` are how Bridge checkpoints
  the data position), with ``dataloader_type: external`` so Bridge passes it through unchanged.

Each batch is one step dict (``task_encoder.options.output``: ``nemotron_omni_step``,
``nemotron_omni_expanded`` or ``gpt_step``) of one packed row; see ``docs/megatron_bridge.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from energon_nemotron.errors import ConfigError

__all__ = ["NemotronEnergonProvider", "STEP_OUTPUTS", "register_with_bridge"]

#: the encoder outputs a Bridge training step reads (``task_encoder.options.output``)
STEP_OUTPUTS = ("nemotron_omni_step", "nemotron_omni_expanded", "gpt_step")
#: the ``dataloader_type`` under which Bridge hands the provider's loader to the step unchanged
EXTERNAL = "external"
_NAME = "NemotronEnergonProvider"


def register_with_bridge() -> bool:
    """Register :class:`NemotronEnergonProvider` as a virtual subclass of Bridge's
    ``DatasetProvider`` ABC, the type ``get_dataset_provider`` accepts for custom providers.
    True when registered; False when Bridge cannot be imported (nothing to register with)."""
    try:
        from megatron.bridge.data.base import DatasetProvider
    except ImportError:
        return False
    if not issubclass(NemotronEnergonProvider, DatasetProvider):
        DatasetProvider.register(NemotronEnergonProvider)
    return True


@dataclass(kw_only=True)
class NemotronEnergonProvider:
    """``cfg.dataset`` of a Bridge recipe: this library's task encoder in Bridge's Energon data module.

    Args:
        loader_config: the project's loader config (a YAML path, or its dict): ``tokenizer``,
            ``task_encoder`` (``output`` one of :data:`STEP_OUTPUTS`), ``packing``; its
            ``data.train`` gives the dataset when ``path`` is None; ``loader`` is not read (Bridge's
            data module makes the workers).
        path: the Energon dataset (prepared folder or metadataset YAML); None: ``data.train.path``.
        seq_length: the recipe's sequence length (``cfg.model.seq_length``); must equal
            ``task_encoder.options.seq_length``.
        micro_batch_size: must be 1 (one packed row per micro-batch), as ``cfg.train.micro_batch_size``.
        packing_buffer_size: must equal ``packing.buffer_size`` (Energon packs only when given one).
        shuffle_buffer_size, max_samples_per_sequence, num_val_workers: passed to Bridge's data module.
        do_validation: build the dataset's ``val`` split as the validation loader (when the run
            asks for validation samples).

    The remaining fields are those of Bridge's ``DataloaderConfig``, which its loaders read from
    ``cfg.dataset``; ``dataloader_type`` must stay ``external``.
    """

    loader_config: Union[str, dict]
    path: Optional[str] = None
    seq_length: int
    micro_batch_size: int = 1
    packing_buffer_size: Optional[int] = None
    shuffle_buffer_size: int = 100
    max_samples_per_sequence: Optional[int] = None
    num_val_workers: Optional[int] = None
    do_validation: bool = True
    # Bridge's DataloaderConfig
    dataloader_type: Optional[str] = EXTERNAL
    num_workers: int = 2
    data_sharding: bool = True
    pin_memory: bool = True
    drop_last: bool = True
    persistent_workers: bool = True
    trust_remote_code: Optional[bool] = None
    dataloader_save: Optional[str] = None
    dataloader_load: Optional[str] = None

    def __post_init__(self) -> None:
        register_with_bridge()

    # -- at start: ConfigContainer.validate() -----------------------------------------------------
    def finalize(self) -> None:
        """Bridge's ``DataloaderConfig.finalize`` (no persistent workers without workers), then
        :meth:`validate`."""
        register_with_bridge()
        if self.num_workers == 0 and self.persistent_workers:
            self.persistent_workers = False
        self.validate()

    def validate(self) -> Any:
        """Refuse what would train silently wrong, from the recipe's values and the YAML alone;
        returns the validated task-encoder options. ``ConfigError`` naming the option and the fix."""
        where = f"{_NAME}"
        if self.dataloader_type != EXTERNAL:
            raise ConfigError(f"{where}.dataloader_type {self.dataloader_type!r}: the provider yields an Energon "
                              f"loader of step dicts, which Bridge must pass through; set dataloader_type={EXTERNAL!r}")
        if self.micro_batch_size != 1:
            raise ConfigError(f"{where}.micro_batch_size {self.micro_batch_size}: every micro-batch is one packed "
                              "row (the packer fills it from its buffer); set micro_batch_size=1 and "
                              "train.micro_batch_size=1 (scale the global batch instead)")
        if self.num_workers < 0 or (self.num_val_workers or 0) < 0:
            raise ConfigError(f"{where}.num_workers / num_val_workers must be >= 0")
        cfg = self._config()
        options = _options(cfg)
        if options.output not in STEP_OUTPUTS:
            raise ConfigError(
                f"task_encoder.options.output {options.output!r} in {self._origin()}: Bridge's training steps read "
                f"one step dict per micro-batch; set output to one of {', '.join(STEP_OUTPUTS)} "
                "(nemotron_omni_step: Bridge 0.6.2's Nemotron Omni; nemotron_omni_expanded: Bridge main's; "
                "gpt_step: text-only Nemotron-H)")
        if self.seq_length != options.seq_length:
            raise ConfigError(f"{where}.seq_length {self.seq_length} (the recipe's) but task_encoder.options."
                              f"seq_length is {options.seq_length} in {self._origin()}: rows would not be what "
                              "the model expects; make both the model's seq_length")
        self._check_packing(cfg)
        self._dataset_path(cfg)
        return options

    def _check_packing(self, cfg: Any) -> None:
        """The encoder's own check (``encoders.nemotron_multimodal.check_packing_buffer``), named
        after this field."""
        from energon_nemotron.encoders.nemotron_multimodal import check_packing_buffer

        try:
            check_packing_buffer(cfg.packing, self.packing_buffer_size)
        except ConfigError as e:
            raise ConfigError(f"{_NAME}.packing_buffer_size {self.packing_buffer_size} ({self._origin()}): {e}; "
                              f"here: {_NAME}(..., packing_buffer_size="
                              f"{cfg.packing.buffer_size if cfg.packing else None})") from None

    # -- in setup: build_datasets(context) ---------------------------------------------------------
    def build_datasets(self, context: Any) -> tuple[Any, Any, None]:
        """Bridge's ``DatasetProvider.build_datasets``: ``(train, validation, None)``.

        ``train``/``validation``: Bridge's ``EnergonDataloader`` (an endless iterator of step dicts,
        one packed row each; tensors as ``docs/megatron_bridge.md`` lists them) or None when the
        run asks for no samples of that split (``context.train_samples`` / ``valid_samples``)."""
        from megatron.bridge.data.energon.base_energon_datamodule import EnergonMultiModalDataModule

        from energon_nemotron.loading import build_task_encoder

        options = self.validate()
        self._check_run(context, options)
        cfg = self._config()
        build_train = context.train_samples > 0
        build_val = self.do_validation and context.valid_samples > 0
        module = EnergonMultiModalDataModule(
            self._dataset_path(cfg), tokenizer=context.tokenizer, seq_length=self.seq_length, micro_batch_size=1,
            num_workers=self.num_workers, num_val_workers=self.num_val_workers, pin_memory=self.pin_memory,
            shuffle_buffer_size=self.shuffle_buffer_size, max_samples_per_sequence=self.max_samples_per_sequence,
            # one encoder per split: an encoder keeps per-pipeline state (its buffer tokenizer, counters)
            task_encoder=build_task_encoder(cfg) if build_train else None,
            validation_task_encoder=build_task_encoder(cfg) if build_val else None,
            packing_buffer_size=self.packing_buffer_size, pg_collection=context.pg_collection)
        train = module.train_dataloader() if build_train else None
        valid = module.val_dataloader() if build_val else None
        return train, valid, None

    def _check_run(self, context: Any, options: Any) -> None:
        """What only the running job knows: the micro-batch size Bridge trains with (megatron-core's
        micro-batch calculator, set by Bridge's ``initialize_megatron`` from ``train.micro_batch_size``)
        and the parallel layout of ``context.pg_collection``."""
        import torch.distributed as dist

        mbs = _running_micro_batch_size()
        if mbs is not None and mbs != self.micro_batch_size:
            raise ConfigError(f"train.micro_batch_size is {mbs} but {_NAME}.micro_batch_size is "
                              f"{self.micro_batch_size}: every micro-batch is one packed row; set "
                              "train.micro_batch_size=1 (scale the global batch instead)")
        pgs = context.pg_collection
        if pgs is None or getattr(pgs, "dp", None) is None:
            if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                raise ConfigError(f"{_NAME}.build_datasets got no pg_collection with a data-parallel group: Bridge's "
                                  "data module would give every process its own data rank and the TP/CP ranks of "
                                  "one replica would read different batches; call it through Bridge's setup "
                                  "(which passes pg_collection) or pass DatasetBuildContext(pg_collection=...)")
            return
        cp = _size(getattr(pgs, "cp", None))
        if cp != options.context_parallel_size:
            raise ConfigError(f"the run's context-parallel size is {cp} but task_encoder.options.context_parallel_size "
                              f"is {options.context_parallel_size} in {self._origin()}: segments must be padded to "
                              f"2*CP for the model's CP split; set context_parallel_size: {cp}")
        tp = _size(getattr(pgs, "tp", None))
        if options.sequence_parallel and options.tensor_parallel_size != tp:
            raise ConfigError(f"the run's tensor-parallel size is {tp} but task_encoder.options.tensor_parallel_size is "
                              f"{options.tensor_parallel_size} with sequence_parallel in {self._origin()}; set "
                              f"tensor_parallel_size: {tp}")
        pp = _size(getattr(pgs, "pp", None))
        if pp > 2:
            raise ConfigError(
                f"pipeline_model_parallel_size {pp}: Bridge's steps hand the middle pipeline stages packed "
                "boundaries only under dataset.enable_in_batch_packing, which Bridge's ConfigContainer refuses "
                "with micro_batch_size 1, so those stages would attend across packed samples; use at most 2 "
                "pipeline stages with this provider")

    # -- the YAML ------------------------------------------------------------------------------------
    def _origin(self) -> str:
        return str(self.loader_config) if not isinstance(self.loader_config, dict) else "loader_config"

    def _config(self) -> Any:
        from energon_nemotron.loading.loader import as_config

        if not isinstance(self.loader_config, (str, Path, dict)):
            raise ConfigError(f"{_NAME}.loader_config must be a YAML path or a dict, not "
                              f"{type(self.loader_config).__name__}")
        return as_config(self.loader_config)

    def _dataset_path(self, cfg: Any) -> str:
        if self.path is not None:
            return str(self.path)
        train = cfg.data.train
        if getattr(train, "format", None) != "energon":
            raise ConfigError(f"{_NAME}.path is not set and data.train in {self._origin()} is not an Energon "
                              f"dataset ({getattr(train, 'format', '?')}); set {_NAME}(path=DATASET)")
        if train.split != "train":
            raise ConfigError(f"data.train.split {train.split!r} in {self._origin()}: Bridge's data module reads "
                              f"the 'train' split (and 'val' for validation); set {_NAME}(path=...) to a dataset "
                              "whose train split is the training data")
        return str(train.path)


def _options(cfg: Any) -> Any:
    """The task encoder's validated options (as ``loading.build_task_encoder`` validates them)."""
    from pydantic import ValidationError

    from energon_nemotron.config import format_validation_error
    from energon_nemotron.registry import TASK_ENCODERS

    try:
        cls = TASK_ENCODERS.get(cfg.task_encoder.name)
    except KeyError as e:
        raise ConfigError(f"task_encoder.name: {e.args[0]}") from None
    try:
        return cls.Options(**cfg.task_encoder.options)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, "task_encoder.options")) from None


def _running_micro_batch_size() -> Optional[int]:
    """megatron-core's micro-batch size (None before Bridge's ``initialize_megatron`` set it up)."""
    try:
        from megatron.core.num_microbatches_calculator import get_micro_batch_size

        return int(get_micro_batch_size())
    except (ImportError, AttributeError):      # no megatron-core, or no calculator yet
        return None


def _size(group: Any) -> int:
    """The size of a process group (1 for None)."""
    return int(group.size()) if group is not None else 1
