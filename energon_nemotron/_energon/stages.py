"""The task encoder's stages: their failure tolerance and error contexts, the one hook per loaded
dataset, the errors Energon raises at build time (recognised by their message), the wrapper base
class of this library's own stage, and Energon's plain loader."""

from __future__ import annotations

from typing import Any, Callable

from megatron.energon.errors import ErrorContext
from megatron.energon.savable_loader import BasicDataLoader
from megatron.energon.task_encoder.base import get_failure_tolerance
from megatron.energon.wrappers.base import BaseWrapperDataset

#: a dataset wrapper of Energon's (inner datasets, its own savable state): the base of this
#: library's own stage (``encoders.one_pass``)
WrapperDataset = BaseWrapperDataset


def stage_failure_tolerance(encoder: Any, stage: Callable) -> int:
    """The failure tolerance Energon gives a stage function of ``encoder`` (its
    ``@failure_tolerance`` marker, else the task encoder's ``__default_failure_tolerance__``; 0:
    never fatal)."""
    return get_failure_tolerance(stage, encoder.__default_failure_tolerance__)


def set_default_failure_tolerance(encoder: Any, tolerance: int) -> None:
    """Set the tolerance of consecutive failures Energon allows a task encoder's stages (its
    ``__default_failure_tolerance__``, set on the instance, read when the stages are built; the
    sample-loading map Energon's dataset factory builds below them keeps Energon's own); 0 makes a run of
    failures never fatal (``on_error: skip`` decides, through its skip limits)."""
    encoder.__default_failure_tolerance__ = tolerance


def stage_error_context(name: str, handler: Callable, tolerance: int) -> ErrorContext:
    """Energon's ``ErrorContext`` for work done inside a stage on the stage's behalf: an error in
    its ``handle_errors(sample)`` block goes to ``handler`` (the loader's error policy) as it would
    in a stage Energon built, and ``tolerance`` consecutive failures are fatal."""
    return ErrorContext(name, handler, tolerance)


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


def is_weighted_blend_error(exc: BaseException) -> bool:
    """Whether ``exc`` is Energon's ``AssertionError`` for a weighted blend read with ``repeat=False``
    (a weighted blend has no epoch: ``metadataset`` ``blend`` without ``blend_epochized``)."""
    return isinstance(exc, AssertionError) and "Cannot blend with dataset weights" in str(exc)


def is_no_cooker_error(exc: BaseException) -> bool:
    """Whether ``exc`` is Energon's ``ValueError`` for a crude dataset whose subflavors match no cooker."""
    return isinstance(exc, ValueError) and "No cooker found" in str(exc)


def basic_loader(dataset: Any) -> Any:
    """Energon's plain (not savable) loader of a built dataset, in this process."""
    return BasicDataLoader(dataset, gc_collect_every_n_steps=0, watchdog_timeout_seconds=None)


def saves(*fields: str) -> Callable[[type], type]:
    """Class decorator for a :data:`WrapperDataset` of this library's: the attributes Energon saves in
    its state and restores (its ``_savable_fields``)."""

    def declare(cls: type) -> type:
        cls._savable_fields = fields
        return cls

    return declare
