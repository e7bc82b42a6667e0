"""Tokenization: loading Hugging Face tokenizers, prompt formats and loss masks."""

from energon_nemotron.tokenization.loading import TextEncoder, load_tokenizer

__all__ = ["TextEncoder", "load_tokenizer"]
