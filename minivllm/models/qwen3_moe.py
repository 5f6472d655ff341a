"""Qwen3-MoE: Qwen3's attention (per-head q/k RMSNorm), a mixture of experts in the layers that
``mlp_only_layers`` and ``decoder_sparse_step`` make sparse, routing weights renormalised with ``norm_topk_prob``."""

from __future__ import annotations

from minivllm.models.moe import MoeForCausalLM


class Qwen3MoeForCausalLM(MoeForCausalLM):
    """Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): ``mlp.gate`` routes, ``mlp.experts.{i}.{gate,up,down}_proj``."""

    qk_norm = "head"
