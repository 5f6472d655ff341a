"""Tiny gpt-oss checkpoints for the tests: a seeded random ``GptOssForCausalLM`` (float32, ``save_pretrained``'s
layout: stacked, interleaved experts) with a 12-token window on its sliding layers, YaRN RoPE, several experts
and top-k, and random (non-zero) expert biases, beside the tiny tokenizer of ``checkpoints.py``."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tests.helpers.checkpoints import MODEL_VOCAB, save_random_checkpoint

#: window of the sliding layers: under one 16-token block, so prompts and generations cross it
TINY_WINDOW = 12
GPT_OSS_SHAPE = dict(hidden_size=64, intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=24, vocab_size=MODEL_VOCAB, rms_norm_eps=1e-6,
                     num_local_experts=8, num_experts_per_tok=3, sliding_window=TINY_WINDOW,
                     tie_word_embeddings=False,
                     rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, beta_fast=32.0,
                                          beta_slow=1.0, truncate=False, original_max_position_embeddings=256))


def build_gpt_oss_checkpoint(out_dir: Path, seed: int = 0, bias_std: float = 0.5, **overrides) -> Path:
    """A seeded random tiny gpt-oss in ``out_dir``: transformers initialises the experts' biases to zero, so they
    are redrawn (``bias_std``) and the weights saved again."""
    save_random_checkpoint(out_dir, "GptOssConfig", "GptOssForCausalLM", {**GPT_OSS_SHAPE, **overrides}, seed)
    path = out_dir / "model.safetensors"
    tensors = load_file(path)
    gen = torch.Generator().manual_seed(seed + 1)
    for name, t in tensors.items():
        if name.endswith(("gate_up_proj_bias", "down_proj_bias")):
            tensors[name] = torch.randn(t.shape, generator=gen) * bias_std
    save_file(tensors, path, metadata={"format": "pt"})
    return out_dir
