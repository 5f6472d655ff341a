"""Tiny Mistral checkpoints for the tests: seeded random ``MistralForCausalLM`` models (float32) with a
``head_dim`` other than hidden / heads and a sliding window shorter than most test prompts, and the tiny
tokenizer of ``checkpoints.py``."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.checkpoints import MODEL_VOCAB, save_random_checkpoint

#: window of the tiny Mistral: under one 16-token block, so prompts and generations cross it
TINY_WINDOW = 12
MISTRAL_SHAPE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=24, vocab_size=MODEL_VOCAB, rms_norm_eps=1e-6,
                     tie_word_embeddings=False)


def build_mistral_checkpoint(out_dir: Path, seed: int = 0, sliding_window: int | None = TINY_WINDOW,
                             **overrides) -> Path:
    """A seeded random tiny Mistral in ``out_dir`` (``sliding_window`` None: full attention)."""
    fields = {**MISTRAL_SHAPE, "sliding_window": sliding_window, **overrides}
    return save_random_checkpoint(out_dir, "MistralConfig", "MistralForCausalLM", fields, seed)
