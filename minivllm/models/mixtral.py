"""Mixtral: Llama's attention (no q/k norm), a mixture of experts in every layer under
``block_sparse_moe``, routing weights always renormalised over the top k."""

from __future__ import annotations

from minivllm.models.moe import MoeForCausalLM


class MixtralForCausalLM(MoeForCausalLM):
    """Mixtral: ``block_sparse_moe.gate`` routes, ``block_sparse_moe.experts.{i}.w1 / w3 / w2`` are each expert's
    gate / up / down projections."""

    qk_norm = None
    renormalize = True
    expert_params_mapping = {"w1": "gate", "w3": "up", "w2": "down"}
    checkpoint_substr_mapping = {".block_sparse_moe.": ".mlp."}
