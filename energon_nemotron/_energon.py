"""Megatron-Energon's private surface: every use this library makes of a name Energon does not export,
an underscore attribute, a replaced method or global, a saved-state key or a message string.

Energon's public API (``megatron.energon.__all__``) does not cover everything the library needs:
a hook per loaded dataset, the error context of a stage, the per-sample consumption state that
elastic resume reads. Each such use is one named function (or class) here, so that an Energon
upgrade that changes one breaks one place, and ``tests/test_energon_surface.py`` exercises each on a
real prepared dataset. ``docs/energon_surface.md`` lists them. The supported Energon versions are
checked when this module is imported (:data:`SUPPORTED`).
"""

from __future__ import annotations

from typing import Any, Callable

import megatron.energon
from megatron.energon.errors import ErrorContext
from megatron.energon.task_encoder.base import get_failure_tolerance

from energon_nemotron.errors import ConfigError

#: the Energon releases this surface was written against and is tested with (``major.minor.patch``
#: lower bound inclusive, upper bound exclusive)
SUPPORTED = ((7, 4, 1), (7, 5, 0))

__all__ = ["SUPPORTED", "check_version", "stage_failure_tolerance", "set_default_failure_tolerance",
           "stage_error_context", "DatasetHook", "is_weighted_blend_error", "is_no_cooker_error"]


def _release(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts + [0] * (3 - len(parts)))


def check_version(version: str) -> None:
    """``ConfigError`` unless ``version`` (``megatron.energon.__version__``) is in :data:`SUPPORTED`."""
    low, high = SUPPORTED
    if version == "unknown" or not low <= _release(version) < high:
        shown = ".".join(map(str, low)), ".".join(map(str, high))
        raise ConfigError(f"megatron-energon {version} is installed; energon-nemotron relies on Energon internals "
                          f"tested with >={shown[0]},<{shown[1]} (docs/energon_surface.md): install "
                          f"'megatron-energon[av-decode]>={shown[0]},<{shown[1]}'")


check_version(megatron.energon.__version__)


# -- failure tolerance and error contexts of the task encoder's stages ------------------------------
def stage_failure_tolerance(stage: Callable, default: Any) -> int:
    """The failure tolerance Energon gives a stage function (its ``@failure_tolerance`` marker, else
    the task encoder's ``__default_failure_tolerance__``; 0: never fatal)."""
    return get_failure_tolerance(stage, default)


def set_default_failure_tolerance(encoder: Any, tolerance: int) -> None:
    """Set the tolerance of consecutive failures Energon allows a task encoder's stages (class
    attribute ``__default_failure_tolerance__``, read when the stages are built); 0 makes a run of
    failures never fatal (``on_error: skip`` decides, through its skip limits)."""
    encoder.__default_failure_tolerance__ = tolerance


def stage_error_context(name: str, handler: Callable, tolerance: int) -> ErrorContext:
    """Energon's ``ErrorContext`` for work done inside a stage on the stage's behalf: an error in
    its ``handle_errors(sample)`` block goes to ``handler`` (the loader's error policy) as it would
    in a stage Energon built, and ``tolerance`` consecutive failures are fatal."""
    return ErrorContext(name, handler, tolerance)


# -- the one hook per loaded dataset ------------------------------------------------------------------
class DatasetHook:
    """Mixin for a ``TaskEncoder``: :meth:`dataset_loaded` sees every dataset Energon loads for it,
    with the dataset it built. Energon has no public hook per dataset; its private
    ``TaskEncoder._load_dataset`` (one call per ``LoadedDataset`` of a blend or concatenation) is
    the only place that sees each, so this mixin overrides it (and nothing else does):
    :meth:`dataset_loading` before Energon builds the dataset, :meth:`dataset_loaded` after."""

    def dataset_loading(self, loaded: Any) -> None:
        """Called with each ``LoadedDataset`` before Energon builds it (checks raise here)."""

    def dataset_loaded(self, loaded: Any, built: Any, worker_config: Any) -> Any:
        """``built`` (the dataset Energon built for ``loaded``) or a wrapper of it."""
        return built

    def _load_dataset(self, dataset: Any, worker_rotation_offset: int, worker_config: Any) -> Any:
        self.dataset_loading(dataset)
        built = super()._load_dataset(dataset, worker_rotation_offset, worker_config)
        return self.dataset_loaded(dataset, built, worker_config)


# -- errors Energon raises at build time, recognised by their message ---------------------------------
def is_weighted_blend_error(exc: BaseException) -> bool:
    """Whether ``exc`` is Energon's ``AssertionError`` for a weighted blend read with ``repeat=False``
    (a weighted blend has no epoch: ``metadataset`` ``blend`` without ``blend_epochized``)."""
    return isinstance(exc, AssertionError) and "Cannot blend with dataset weights" in str(exc)


def is_no_cooker_error(exc: BaseException) -> bool:
    """Whether ``exc`` is Energon's ``ValueError`` for a crude dataset whose subflavors match no cooker."""
    return isinstance(exc, ValueError) and "No cooker found" in str(exc)
