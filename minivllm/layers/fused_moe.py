"""The experts of a mixture-of-experts layer, stacked into two tensors and run by one fused call."""

from __future__ import annotations

import torch
from torch import nn

from minivllm.distributed.group import TPGroup, divide, rank_and_size
from minivllm.kernels.moe_torch import (
    EXPERT_ACTIVATIONS,
    fused_moe,
    select_experts,
    select_experts_topk_softmax,
)

#: the parts of one expert that ``FusedMoE.weight_loader`` takes: gate and up fill ``w13_weight``, down ``w2_weight``
EXPERT_SHARDS = ("gate", "up", "down")
#: "softmax_topk": a softmax over all experts, then the top k (renormalised or not); "topk_softmax": the top k
#: logits, then a softmax over them (gpt-oss)
ROUTINGS = ("softmax_topk", "topk_softmax")


class FusedMoE(nn.Module):
    """``num_experts`` gated SiLU MLPs of which each token runs ``top_k``, weighted by its router's softmax.

    ``w13_weight [E, 2 * I_rank, H]`` stacks each expert's gate (rows ``[0, I_rank)``) and up projection,
    ``w2_weight [E, H, I_rank]`` its down projection. With a ``tp_group`` each rank holds the slice
    ``[rank * I_rank, (rank + 1) * I_rank)`` of every expert's intermediate dimension (``I_rank =
    intermediate_size / tp_size``) and returns its partial sum, which the next norm sums over the ranks, as the
    dense MLP's ``down_proj(reduce_results=False)`` does. ``backend="triton"``: the Triton kernels of
    ``kernels/fused_moe.py``; otherwise plain torch (``kernels/moe_torch.py``).

    FP8 experts (``quant_method``, set by ``quantization.apply_quantization``): ``w13_weight`` and ``w2_weight`` in
    float8_e4m3fn with ``w13_weight_scale`` / ``w2_weight_scale`` per output channel, or per ``block_shape``
    block (``layers/quantization/fp8_moe.py``). MXFP4 experts (gpt-oss's checkpoints): ``w13_weight`` uint8
    ``[E, 2 * I_rank, H / 2]`` and ``w2_weight`` uint8 ``[E, H, I_rank / 2]`` with uint8 e8m0 scales, one a row
    and 32 columns (``layers/quantization/mxfp4_moe.py``).

    gpt-oss's experts (``has_bias``, ``activation="swigluoai"``, ``routing="topk_softmax"``): ``w13_bias [E, 2 *
    I_rank]`` (this rank's gate then up slices) and ``w2_bias [E, H]`` (whole on rank 0, zeros on the others:
    the partial sums add it once), the clamped SwiGLU of ``kernels/moe_torch.expert_activation``, and routing
    weights from a softmax over each token's top-k logits (``select_experts_topk_softmax``).
    """

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int,
                 renormalize: bool, backend: str = "torch", tp_group: TPGroup | None = None, *,
                 has_bias: bool = False, activation: str = "silu", swiglu_alpha: float = 1.702,
                 swiglu_limit: float = 7.0, routing: str = "softmax_topk"):
        super().__init__()
        if activation not in EXPERT_ACTIVATIONS:
            raise ValueError(f"activation must be one of {EXPERT_ACTIVATIONS}, got {activation!r}")
        if routing not in ROUTINGS:
            raise ValueError(f"routing must be one of {ROUTINGS}, got {routing!r}")
        self.activation, self.swiglu_alpha, self.swiglu_limit = activation, swiglu_alpha, swiglu_limit
        self.routing = routing
        self.tp_group = tp_group
        self.tp_rank, self.tp_size = rank_and_size(tp_group)
        self.num_experts, self.top_k, self.renormalize, self.backend = num_experts, top_k, renormalize, backend
        self.intermediate_size_per_rank = divide(intermediate_size, self.tp_size)
        inter = self.intermediate_size_per_rank
        self.w13_weight = nn.Parameter(torch.empty(num_experts, 2 * inter, hidden_size), requires_grad=False)
        self.w2_weight = nn.Parameter(torch.empty(num_experts, hidden_size, inter), requires_grad=False)
        self.w13_weight.weight_loader = self.w2_weight.weight_loader = self.weight_loader
        self.w13_bias = self.w2_bias = None
        if has_bias:
            self.w13_bias = nn.Parameter(torch.empty(num_experts, 2 * inter), requires_grad=False)
            self.w2_bias = nn.Parameter(torch.empty(num_experts, hidden_size), requires_grad=False)
        self.quant_method = None  # set once, before loading, by ``quantization.apply_quantization``
        self.w13_weight_scale: torch.Tensor | None = None  # FP8 experts: [E, 2 * I_rank] or [E, row blocks, K blocks]
        self.w2_weight_scale: torch.Tensor | None = None  # FP8 experts: [E, H] or [E, row blocks, K blocks]
        self.block_shape: tuple[int, int] | None = None  # FP8 experts: rows x columns a scale, None per channel

    def check_expert_shard(self, expert_id: int, shard: str) -> None:
        """ValueError unless ``shard`` names an expert's projection and ``expert_id`` one of the experts."""
        if shard not in EXPERT_SHARDS:
            raise ValueError(f"shard must be one of {EXPERT_SHARDS}, got {shard!r}")
        if not 0 <= expert_id < self.num_experts:
            raise ValueError(f"expert_id must be in [0, {self.num_experts}), got {expert_id}")

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, expert_id: int, shard: str) -> None:
        """Copy this rank's slice of one expert's checkpoint projection (``shard``: ``"gate"`` or ``"up"``, a
        full ``[intermediate, hidden]`` tensor, or ``"down"``, a full ``[hidden, intermediate]`` one)."""
        self.check_expert_shard(expert_id, shard)
        inter = self.intermediate_size_per_rank
        start = self.tp_rank * inter
        if shard == "down":
            param.data[expert_id].copy_(loaded.narrow(1, start, inter))
            return
        offset = 0 if shard == "gate" else inter
        param.data[expert_id].narrow(0, offset, inter).copy_(loaded.narrow(0, start, inter))

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        """``x [n, H]``, ``router_logits [n, E]`` -> ``[n, H]`` (this rank's partial sum at TP > 1)."""
        if self.backend == "triton":
            from minivllm.kernels.fused_moe import fused_moe_triton, select_experts_triton  # GPU only

            # NOTE: "topk_softmax" routing equals a softmax over all experts renormalised over the top k
            renormalize = self.renormalize or self.routing == "topk_softmax"
            topk_weights, topk_ids = select_experts_triton(router_logits, self.top_k, renormalize)
            return fused_moe_triton(x, self.w13_weight, self.w2_weight, topk_weights, topk_ids, **self._fp8_args(),
                                    **self._gpt_oss_args())
        if self.routing == "topk_softmax":
            topk_weights, topk_ids = select_experts_topk_softmax(router_logits, self.top_k)  # [n, k], [n, k]
        else:
            topk_weights, topk_ids = select_experts(router_logits, self.top_k, self.renormalize)  # [n, k], [n, k]
        return fused_moe(x, self.w13_weight, self.w2_weight, topk_weights, topk_ids, **self._fp8_args(),
                         **self._gpt_oss_args())

    def _gpt_oss_args(self) -> dict:
        """The expert biases and activation for the fused call (none for the plain gated SiLU experts)."""
        if self.w13_bias is None and self.activation == "silu":
            return {}
        return dict(w13_bias=self.w13_bias, w2_bias=self.w2_bias, activation=self.activation,
                    swiglu_alpha=self.swiglu_alpha, swiglu_limit=self.swiglu_limit)

    def _fp8_args(self) -> dict:
        """The FP8 experts' scales and block for the fused call (none for experts in the model's dtype)."""
        if self.w13_weight_scale is None:
            return {}
        return dict(w13_scale=self.w13_weight_scale, w2_scale=self.w2_weight_scale, block_shape=self.block_shape)
