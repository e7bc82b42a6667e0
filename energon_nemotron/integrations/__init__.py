"""Adapters to the training stacks that consume ``PackedBatch`` (Megatron-Bridge) and model presets."""
