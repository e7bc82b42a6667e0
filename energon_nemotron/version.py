"""The library version (what loader-state fingerprints record)."""

__version__ = "0.1.0"
