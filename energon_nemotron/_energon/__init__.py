"""Megatron-Energon's private surface: every use this library makes of a name Energon does not export,
an underscore attribute, a replaced method or global, a saved-state key or a message string.

Energon's public API (``megatron.energon.__all__``) does not cover everything the library needs:
a hook per loaded dataset, the error context of a stage, the per-sample consumption state that
elastic resume reads. Each such use is one named function (or class) in this package, by concern
(``stages``, ``patches``, ``files``, ``tree``, ``states``), so that an Energon upgrade that changes
one breaks one place; ``tests/test_energon_surface.py`` exercises each on a real prepared dataset
and checks that no other module of the library reaches Energon's internals. ``docs/energon_surface.md``
lists them. The supported Energon versions are checked when this package is imported
(:data:`SUPPORTED`).
"""

from __future__ import annotations

from energon_nemotron._energon.compat import SUPPORTED, check_version
from energon_nemotron._energon.files import (add_source_info, entry_size, filesystem_entry, index_file, indexed_sample_key, load_yaml,
                                             remote_entry_range, set_nvdataset_cache_dir, store_entry_names, store_kind, store_local_base,
                                             webdataset_entry)
from energon_nemotron._energon.passes import install as pass_in_restore_keys
from energon_nemotron._energon.passes import sample_pass
from energon_nemotron._energon.packing_stage import BufferContext, CarryingPackingDataset, packing_stage
from energon_nemotron._energon.patches import (guard_jsonl_lines, name_watchdog_timeouts, one_line_shard_failures,
                                               quiet_error_prints, quiet_progress, stop_watchdog_threads)
from energon_nemotron._energon.stages import (DatasetHook, WrapperDataset, basic_loader, is_no_cooker_error,
                                              is_weighted_blend_error, saves, set_default_failure_tolerance,
                                              stage_error_context, stage_failure_tolerance)
from energon_nemotron._energon.states import (empty_worker_checkpoint, initial_worker_checkpoints,
                                              is_loader_state, is_worker_checkpoint, is_wrapper, savable_fields,
                                              saved_class, saved_inner, saved_leaf_epoch, saved_leaf_slices, shutdown_workers,
                                              worker_dataset_state, worker_root, worker_sample_counters)
from energon_nemotron._energon.tree import (LEAF, SELECTORS, batch_worker, empty_leaf_sample,
                                            filter_leaf_samples, inner_datasets, is_leaf, leaf_epoch, leaf_readers,
                                            leaf_shuffle_over_epochs, leaf_size, leaf_worker_slices, names_samples,
                                            raw_sample_key, read_leaf_sample, reader_jsonl, reader_location, reader_position,
                                            sample_index, sample_refs, wrap_leaf_readers)

__all__ = ["SUPPORTED", "check_version",
           # task encoder stages
           "stage_failure_tolerance", "set_default_failure_tolerance", "stage_error_context", "DatasetHook",
           "is_weighted_blend_error", "is_no_cooker_error", "WrapperDataset", "saves", "basic_loader",
           # this library's packing stage
           "BufferContext", "CarryingPackingDataset", "packing_stage",
           # behaviours adjusted from outside
           "quiet_error_prints", "quiet_progress", "guard_jsonl_lines", "name_watchdog_timeouts", "stop_watchdog_threads",
           "one_line_shard_failures",
           # files and aux sources
           "load_yaml", "store_kind", "store_local_base", "webdataset_entry", "entry_size", "index_file", "filesystem_entry", "store_entry_names", "remote_entry_range",
           "add_source_info", "indexed_sample_key", "set_nvdataset_cache_dir",
           # the dataset tree, its leaves and restore keys
           "LEAF", "SELECTORS", "inner_datasets", "is_leaf", "leaf_readers", "wrap_leaf_readers", "leaf_size",
           "leaf_epoch", "leaf_worker_slices", "leaf_shuffle_over_epochs", "reader_location", "reader_jsonl",
           "reader_position",
           "filter_leaf_samples", "read_leaf_sample", "empty_leaf_sample", "sample_refs", "names_samples",
           "batch_worker", "sample_index", "raw_sample_key", "pass_in_restore_keys", "sample_pass",
           # saved states and the savable loader's workers
           "is_loader_state", "is_worker_checkpoint", "worker_dataset_state", "empty_worker_checkpoint",
           "saved_class", "saved_inner", "saved_leaf_epoch", "saved_leaf_slices", "savable_fields", "is_wrapper",
           "worker_root", "worker_sample_counters", "initial_worker_checkpoints", "shutdown_workers"]
