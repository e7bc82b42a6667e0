"""The Megatron-LM prepacked path (``megatron_sft_packed``): offline-packed JSONL rows → PackedBatch."""

from energon_nemotron.megatron_packed.collate import collate_rows
from energon_nemotron.megatron_packed.dataset import MegatronSFTPackedDataset
from energon_nemotron.megatron_packed.encoder import ENCODER_SETTINGS, MegatronSFTPackedEncoder, encoder_from
from energon_nemotron.megatron_packed.offline_pack import LocalEngine, PackOptions, PackSummary, pack, pack_file

__all__ = ["MegatronSFTPackedEncoder", "MegatronSFTPackedDataset", "collate_rows", "encoder_from", "ENCODER_SETTINGS",
           "pack", "pack_file", "PackOptions", "PackSummary", "LocalEngine"]
