"""Builds the small byte-level BPE tokenizer shipped in ``demo/tokenizer/`` (run once, offline).

    python -m energon_nemotron.demo.build_tokenizer

Trained with ``tokenizers`` on the demo conversations plus docstrings of Python's standard library,
so it is a real BPE (merges across characters, offsets, added special tokens) small enough to ship.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from energon_nemotron.demo.conversations import make_conversations

OUT = Path(__file__).parent / "tokenizer"
VOCAB_SIZE = 4096
SPECIAL_TOKENS = [
    "<unk>", "<s>", "</s>", "<pad>",
    # Nemotron-H / Nano v2 prompt formats
    "<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>", "<SPECIAL_233>",
    # ChatML / Nemotron 3
    "<|im_start|>", "<|im_end|>", "<think>", "</think>",
    # media placeholders
    "<image>", "<video>", "<audio>", "<img>", "</img>", "<so_start>", "<so_embedding>", "<so_end>",
]
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['role'] == 'assistant' -%}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}"
    "{%- else -%}"
    "{{ message['content'] + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)
STDLIB_MODULES = ["json", "random", "pathlib", "collections", "itertools", "functools", "string",
                  "textwrap", "argparse", "dataclasses", "typing", "statistics", "fractions",
                  "decimal", "datetime", "calendar", "csv", "shutil", "tarfile", "zipfile"]


def corpus() -> list[str]:
    """Demo conversations rendered in every prompt format (so role headers such as
    ``Assistant`` become single tokens, as in Nemotron tokenizers), plus stdlib docstrings."""
    from energon_nemotron.megatron_packed.prompt_formats import MEGATRON_PROMPT_FORMATS

    texts = []
    formats = [MEGATRON_PROMPT_FORMATS.get(n) for n in MEGATRON_PROMPT_FORMATS.names()]
    for conv in make_conversations(3000, seed=1234):
        for fmt in formats:
            if fmt.render is not None:
                texts.append("".join(fmt.render_conversation(conv)))
        texts.append("".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in conv))
    for name in STDLIB_MODULES:
        module = importlib.import_module(name)
        for _, obj in inspect.getmembers(module):
            doc = inspect.getdoc(obj)
            if doc:
                texts.append(doc)
    return texts


def main() -> None:
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    OUT.mkdir(exist_ok=True)
    fast.save_pretrained(str(OUT))
    print(f"wrote {OUT} (vocab {len(fast)})")


if __name__ == "__main__":
    main()
