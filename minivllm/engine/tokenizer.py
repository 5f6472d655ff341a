"""The checkpoint's Hugging Face tokenizer (None for a folder without one: prompts are then token ids)."""

from __future__ import annotations

import os
from typing import Any

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def load_tokenizer(path: str):
    """A fast tokenizer from ``path``, or None if the folder has no tokenizer files."""
    if not any(os.path.exists(os.path.join(path, f)) for f in _TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, use_fast=True)
    # NOTE: the engine checks a prompt's length against max_model_len itself, with an error naming it; the
    # tokenizer's own warning about its model_max_length ("Token indices sequence length is longer ...") would only
    # repeat that in the log. transformers skips it once it is marked as given, so mark it (that warning alone).
    warned = getattr(tokenizer, "deprecation_warnings", None)
    if isinstance(warned, dict):
        warned["sequence-length-is-longer-than-the-specified-maximum"] = True
    return tokenizer


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


def chat_template_args(add_generation_prompt: bool, continue_final_message: bool, chat_template: str | None,
                       kwargs: dict[str, Any] | None, last_role: str | None) -> dict[str, Any]:
    """``apply_chat_template``'s keyword arguments, with vLLM's rules (ValueError naming the parameter): a final
    message is continued only if it is the assistant's, and then no generation prompt is added; the template's
    own arguments cannot be set through ``chat_template_kwargs``. ``last_role``: the last message's role."""
    if continue_final_message and add_generation_prompt:
        raise ValueError("continue_final_message cannot be combined with add_generation_prompt: true")
    if continue_final_message and last_role != "assistant":
        raise ValueError("continue_final_message needs the last message to be the assistant's")
    reserved = {"conversation", "messages", "tokenize", "chat_template", "add_generation_prompt",
                "continue_final_message", "tools", "documents"} & set(kwargs or ())
    if reserved:
        raise ValueError(f"chat_template_kwargs may not set {sorted(reserved)}")
    args = {**(kwargs or {}), "add_generation_prompt": add_generation_prompt,
            "continue_final_message": continue_final_message}
    if chat_template is not None:
        args["chat_template"] = chat_template
    return args


def refuse_media_parts(messages: list[dict]) -> None:
    """ValueError naming ``messages`` where a message's content holds a part other than text (an image, audio):
    minivllm runs text models only, and a chat template would render an image as a bare placeholder."""
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(content, list):
            continue
        kinds = sorted({str(p.get("type")) for p in content if isinstance(p, dict) and p.get("type") != "text"})
        if kinds:
            raise ValueError(f"messages: content parts of type {', '.join(map(repr, kinds))} are not supported; "
                             "minivllm serves text models only (content parts {'type': 'text', 'text': ...})")
