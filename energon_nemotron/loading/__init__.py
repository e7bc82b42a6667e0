"""Loading: a loader config to iterables of ``PackedBatch``.

:func:`build_train_loader` / :func:`build_val_loader` build a :class:`Loader` (Energon sources
through the configured task encoder and Energon's savable loader; Megatron-LM prepacked rows
through a PyTorch ``DataLoader``), after the start-up checks of ``preflight``; the validation
loader evens out the ranks (``evened_validation``); ``stats`` keeps the running telemetry;
``prepare`` makes tar shards or a ``.jsonl`` file an Energon dataset with its cooker named.
"""

from energon_nemotron.loading.evened_validation import EvenedValidation, build_val_loader, padding_batch
from energon_nemotron.loading.loader import (ConfigLike, Loader, as_config, build_loader, build_task_encoder,
                                             build_train_loader, with_dp)
from energon_nemotron.loading.preflight import check_media_roots, check_source, check_source_path
from energon_nemotron.loading.prepare import Prepared, PrepareOptions, prepare_dataset
from energon_nemotron.loading.stats import LoaderStats

__all__ = ["build_train_loader", "build_val_loader", "Loader", "build_task_encoder", "build_loader", "with_dp",
           "as_config", "ConfigLike", "EvenedValidation", "padding_batch", "LoaderStats", "check_source",
           "check_source_path", "check_media_roots", "prepare_dataset", "PrepareOptions", "Prepared"]
