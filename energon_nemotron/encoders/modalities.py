"""Which media kinds the task encoder serves: placeholder tokens checked at start, other kinds refused.

The tokenizer needs single tokens for the placeholders of each modality the data holds
(``media.handlers.MODALITY_TOKENS``). What the data holds is known before any sample is read from
two declarations:

- ``task_encoder.options.modalities``: the media kinds the data may hold. Every listed kind's
  tokens must exist when the encoder is built (:func:`check_modalities`); a sample with media of a
  kind not listed is a ``DataError`` of the sample (``unsupported_media``, :func:`check_sample`),
  raised before its media are planned, so ``on_error: skip`` counts it.
- each cooker's ``requires`` (``cookers.base.register``): the kinds every sample of that cooker
  holds (``granary_asr``: audio). When the datasets are built, the cooker of every dataset is found
  as Energon finds it (the first matching ``Cooker``) and its required kinds' tokens must exist
  (:func:`check_datasets`), and be among ``modalities`` when that is set.

Without either, the first item of a modality whose tokens are missing stops the run
(``MediaHandlers.ids``): a tokenizer without the audio tokens serves image-only data.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

from energon_nemotron.errors import ConfigError, DataError


def check_modalities(media: Any, modalities: Optional[Sequence[str]]) -> None:
    """A ``ConfigError`` when the tokenizer of ``media`` (``MediaHandlers``) lacks a placeholder
    token of a kind in ``task_encoder.options.modalities``; None checks nothing."""
    for kind in modalities or ():
        media.require(kind, f", and task_encoder.options.modalities lists {kind}")


def check_sample(key: str, refs: Iterable[Any], modalities: Optional[Sequence[str]]) -> None:
    """A ``DataError`` (``unsupported_media``) when a sample's media (``MediaRef``s) hold a kind
    that ``modalities`` does not list; None allows every kind."""
    if modalities is None:
        return
    other = sorted({ref.modality for ref in refs} - set(modalities))
    if other:
        raise DataError(key, f"has {', '.join(other)}, which task_encoder.options.modalities "
                             f"({', '.join(modalities) or 'none'}) does not list", "unsupported_media")


def dataset_cooker(subflavors: Optional[dict], cookers: Sequence[Any]) -> Optional[str]:
    """The registered name of the cooker Energon picks for a dataset with ``subflavors`` (the first
    of ``cookers`` that matches; None when none does, which Energon reports itself)."""
    from energon_nemotron.registry import COOKERS

    match = next((c for c in cookers if c.is_match(subflavors)), None)
    if match is None:
        return None
    return next((name for name in COOKERS.names() if COOKERS.get(name) is match.cook), None)


def check_datasets(media: Any, modalities: Optional[Sequence[str]], datasets: Sequence[Any],
                   cookers: Sequence[Any]) -> None:
    """At dataset build time: for every crude dataset (Energon ``LoadedDataset``s) the kinds its
    cooker requires must have placeholder tokens, and be among ``modalities`` when that is set;
    a ``ConfigError`` naming the dataset, the cooker and the missing tokens (or kind). A dataset
    with ``data_augment`` needs image mode ``dynamic`` (the tiling augmentation's)."""
    from megatron.energon import CrudeSample

    from energon_nemotron.cookers.base import cooker_info

    for loaded in datasets:
        factory = loaded.dataset
        if getattr(factory, "__sample_type__", None) is not CrudeSample:
            continue
        subflavors = getattr(factory, "subflavors", None) or {}
        if subflavors.get("data_augment") and media.image_options.mode != "dynamic":
            raise ConfigError(f"dataset {getattr(factory, 'path', factory)}: subflavor data_augment asks for NeMo-RL's "
                              f"tiling augmentation, which perturbs the patch grid of image mode dynamic; "
                              f"task_encoder.options.image.mode is {media.image_options.mode!r}")
        name = dataset_cooker(subflavors, cookers)
        if name is None:
            continue
        where = f"dataset {getattr(factory, 'path', factory)} (cooker {name})"
        for kind in cooker_info(name).requires:
            if modalities is not None and kind not in modalities:
                raise ConfigError(f"{where}: every sample holds {kind}, which task_encoder.options.modalities "
                                  f"({', '.join(modalities) or 'none'}) does not list; add {kind} to it")
            media.require(kind, f", and {where} has {kind} in every sample")
