"""``GET /tokenizer_info``: what a client needs to tokenize as the server does (vLLM's route)."""

from __future__ import annotations


def tokenizer_info_of(tokenizer, max_model_len: int) -> dict:
    """The tokenizer's class, special tokens, chat template and size (400-free: a model without a tokenizer
    reports nulls)."""
    if tokenizer is None:
        return {"tokenizer_class": None, "vocab_size": None, "model_max_length": max_model_len, "chat_template": None}
    special = {name: getattr(tokenizer, name, None) for name in ("bos_token", "eos_token", "pad_token", "unk_token")}
    return {"tokenizer_class": type(tokenizer).__name__, "vocab_size": len(tokenizer),
            "model_max_length": max_model_len, "chat_template": getattr(tokenizer, "chat_template", None),
            "added_tokens": {str(i): t.content for i, t in sorted(tokenizer.added_tokens_decoder.items())},
            **{k: (str(v) if v is not None else None) for k, v in special.items()}}
