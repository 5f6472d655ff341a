"""Mistral: Llama's decoder whose layers attend over a sliding window when the config sets ``sliding_window``."""

from __future__ import annotations

from minivllm.models.qwen3 import LlamaForCausalLM


class MistralForCausalLM(LlamaForCausalLM):
    """``MistralForCausalLM`` checkpoints (Mistral-7B, Mistral-Small): the Llama layout and weights; every layer
    attends to the last ``sliding_window`` positions (``ArchConfig.sliding_window_of``; null: all of them), and
    ``head_dim`` may differ from ``hidden_size / num_attention_heads`` (Mistral-Small: 128 of 5120 / 32)."""
