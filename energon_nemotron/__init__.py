"""energon-nemotron: raw multimodal SFT data to packed Megatron batches for Nemotron models."""

from energon_nemotron.batch import IGNORE_INDEX, PackedBatch
from energon_nemotron.version import __version__

__all__ = ["IGNORE_INDEX", "PackedBatch", "__version__"]
