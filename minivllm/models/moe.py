"""Mixture-of-experts decoders: the dense decoder of ``qwen3.py`` with a sparse MoE block as the MLP of its
sparse layers (Qwen3-MoE, Mixtral, OLMoE).

Checkpoints store each expert's projections apart (``mlp.experts.{i}.gate_proj.weight`` ...); the loader
stacks them into the layer's two tensors through ``expert_params_mapping``.
"""

from __future__ import annotations

import torch
from torch import nn

from minivllm.config.model import ArchConfig
from minivllm.distributed.group import TPGroup
from minivllm.layers.fused_moe import FusedMoE
from minivllm.layers.linear import ReplicatedLinear
from minivllm.layers.quantization.mxfp4_moe import pack_experts_at_construction
from minivllm.models.qwen3 import Qwen3ForCausalLM


class SparseMoeBlock(nn.Module):
    """The router (``gate``: one logit per expert, replicated on every rank, never quantized) and the experts
    (FP8 under ``quantization="fp8"`` or an FP8 checkpoint).

    With a ``tp_group`` it returns this rank's partial sum (the next norm sums it), as the dense MLP does.
    """

    def __init__(self, cfg: ArchConfig, renormalize: bool, backend: str, tp_group: TPGroup | None = None):
        super().__init__()
        self.gate = ReplicatedLinear(cfg.hidden_size, cfg.num_experts, bias=False, quantizable=False)
        self.experts = FusedMoE(cfg.num_experts, cfg.num_experts_per_tok, cfg.hidden_size,
                                cfg.moe_intermediate_size, renormalize, backend, tp_group)
        pack_experts_at_construction(self.experts, cfg.quantization_config)

    def input_quant(self, x: torch.Tensor) -> None:
        """The norm before this block hands over its rows unquantized: the router is not FP8, and FP8 experts
        quantize their own inputs (``fused_moe_triton``)."""
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [n, hidden] -> [n, hidden]
        return self.experts(x, self.gate(x))  # router logits: [n, experts]


class MoeForCausalLM(Qwen3ForCausalLM):
    """A causal LM whose sparse layers (``ArchConfig.is_moe_layer``) route each token to ``num_experts_per_tok``
    experts; the others keep the dense MLP of ``intermediate_size``.

    ``renormalize``: whether the top-k routing weights are divided by their sum (None: the config's
    ``norm_topk_prob``). ``expert_params_mapping``: checkpoint name of an expert's projection -> the part of the
    stacked weights it fills (``FusedMoE.weight_loader``'s ``shard``). ``checkpoint_substr_mapping``: parts of
    checkpoint names renamed to ours before anything else.
    """

    renormalize: bool | None = None
    expert_params_mapping = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down"}
    checkpoint_substr_mapping: dict[str, str] = {}

    def make_mlp(self, cfg: ArchConfig, layer: int, backend: str, tp_group: TPGroup | None) -> nn.Module:
        if not cfg.is_moe_layer(layer):
            return super().make_mlp(cfg, layer, backend, tp_group)
        renormalize = cfg.norm_topk_prob if self.renormalize is None else self.renormalize
        return SparseMoeBlock(cfg, renormalize, backend, tp_group)
