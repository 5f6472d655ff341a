"""The checkpoint's Hugging Face tokenizer (None for a folder without one: prompts are then token ids)."""

from __future__ import annotations

import os

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def load_tokenizer(path: str):
    """A fast tokenizer from ``path``, or None if the folder has no tokenizer files."""
    if not any(os.path.exists(os.path.join(path, f)) for f in _TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, use_fast=True)
