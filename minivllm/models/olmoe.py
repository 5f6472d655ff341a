"""OLMoE: RMSNorm over the whole q and k projections (not per head), ``clip_qkv`` when set, a mixture of experts
in every layer, routing weights renormalised only with ``norm_topk_prob`` (off by default)."""

from __future__ import annotations

from minivllm.models.moe import MoeForCausalLM


class OlmoeForCausalLM(MoeForCausalLM):
    """OLMoE (OLMoE-1B-7B): ``mlp.gate`` routes, ``mlp.experts.{i}.{gate,up,down}_proj``."""

    qk_norm = "full"
