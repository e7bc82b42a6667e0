"""Tokenization: loading Hugging Face tokenizers, prompt formats and loss masks."""

from energon_nemotron.tokenization.conversation import ConversationTokenizer, NoTrainableTokensError
from energon_nemotron.tokenization.formats import PromptFormat, get_prompt_format
from energon_nemotron.tokenization.loading import TextEncoder, load_tokenizer

__all__ = ["TextEncoder", "load_tokenizer", "ConversationTokenizer", "NoTrainableTokensError", "PromptFormat",
           "get_prompt_format"]
