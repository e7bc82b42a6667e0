"""Cookers: Energon crude samples → ``Conversation``s, registered by name (``registry.COOKERS``).

A dataset selects its cooker with ``subflavors: {cooker: NAME}`` (in ``.nv-meta/dataset.yaml`` or a
metadataset); ``build_cookers`` turns the registry into Energon ``Cooker``s. Importing this package
installs the nesting limit on Energon's JSONL line parsing (``guards.jsonl_guard``).
"""

from energon_nemotron.cookers.base import (CookerInfo, build_cookers, cooker_info, describe_cooker, payload, register,
                                           sample_where, subflavor_keys, text_of)
from energon_nemotron.guards import jsonl_guard

jsonl_guard.install()

__all__ = ["register", "build_cookers", "cooker_info", "describe_cooker", "CookerInfo", "subflavor_keys", "payload",
           "text_of", "sample_where"]
