"""energon-nemotron: raw multimodal SFT data to packed Megatron batches for Nemotron models."""

from energon_nemotron.types import IGNORE_INDEX, PackedBatch

__version__ = "0.1.0"
__all__ = ["IGNORE_INDEX", "PackedBatch", "__version__"]
