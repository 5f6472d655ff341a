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


def bad_words_token_ids(tokenizer, words: list[str]) -> list[list[int]]:
    """Each bad word's token ids as it would appear in text: alone, and after a space when that makes other
    tokens of the same count (as vLLM does: "word" and " word" are usually different tokens)."""
    out: list[list[int]] = []
    for word in words:
        plain = tokenizer.encode(word.lstrip(), add_special_tokens=False)
        spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
        for ids in (plain, spaced):
            if ids and ids not in out and (ids is plain or (len(ids) == len(plain) and ids[0] != plain[0])):
                out.append(ids)
    return out
