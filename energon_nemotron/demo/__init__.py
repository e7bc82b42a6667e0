"""The embedded demo: data generator, a small shipped tokenizer, and ``energon-nemotron demo``."""

from energon_nemotron.demo.run import TOKENIZER_DIR, run_demo

__all__ = ["TOKENIZER_DIR", "run_demo"]
