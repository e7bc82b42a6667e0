"""Adapters to the training stacks that consume ``PackedBatch``: the Megatron-Bridge step dicts.

A leaf of the package: it imports the core and nothing in the package imports it.
"""
