"""Tiny mixture-of-experts checkpoints for the tests: seeded random Qwen3-MoE, Mixtral and OLMoE models saved
with ``save_pretrained`` (float32, the Hugging Face layout: one tensor per expert projection), plus the tiny
tokenizer of ``checkpoints.py``."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.checkpoints import MODEL_VOCAB, save_random_checkpoint

_COMMON = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, vocab_size=MODEL_VOCAB,
               rms_norm_eps=1e-6, tie_word_embeddings=False)

#: name -> (transformers config class, model class, config fields). Several expert counts and top-k; Qwen3-MoE
#: with a dense layer (``mlp_only_layers``) of another intermediate size; OLMoE with ``clip_qkv``.
MOE_SHAPES = {
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(num_hidden_layers=3, head_dim=16, intermediate_size=96, moe_intermediate_size=32,
                       num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[1],
                       decoder_sparse_step=1)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(num_hidden_layers=2, head_dim=16, intermediate_size=48, num_local_experts=4,
                     num_experts_per_tok=2)),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM",
              dict(num_hidden_layers=2, intermediate_size=32, num_experts=16, num_experts_per_tok=4,
                   norm_topk_prob=False, clip_qkv=4.0)),
}


def build_moe_checkpoint(out_dir: Path, arch: str, seed: int = 0, initializer_range: float = 0.5,
                         max_position_embeddings: int = 1024, **overrides) -> Path:
    """A seeded random ``arch`` (a key of ``MOE_SHAPES``) checkpoint and the tiny tokenizer in ``out_dir``.

    ``overrides``: config fields over the shape's."""
    config_name, model_name, fields = MOE_SHAPES[arch]
    return save_random_checkpoint(out_dir, config_name, model_name, {**_COMMON, **fields, **overrides}, seed,
                                  initializer_range, max_position_embeddings)
