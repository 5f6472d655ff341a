"""Mixture of experts in plain torch: top-k routing and the experts' gated MLPs.

What the engine runs on the CPU, and the reference of the Triton kernels (``kernels/fused_moe.py``): same
signatures, same layout. Expert weights are stacked per layer: ``w13 [E, 2 * I, H]`` (rows ``[0, I)`` the gate
projection, ``[I, 2 * I)`` the up projection) and ``w2 [E, H, I]`` (the down projection), ``I`` being this
tensor-parallel rank's slice of each expert's intermediate size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minivllm.kernels.mxfp4 import dequantize_mxfp4
from minivllm.kernels.torch_backend import dequantize_weight_fp8_ref


def select_experts(router_logits: torch.Tensor, top_k: int,
                   renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's ``top_k`` experts and their weights: ``([n, k] float32, [n, k] int32)``.

    A softmax in float32 over all experts, the ``top_k`` largest probabilities, divided by their sum when
    ``renormalize`` (Mixtral always; Qwen3-MoE and OLMoE with ``norm_topk_prob``): transformers' order of
    operations, so that float32 routing is bitwise theirs.
    """
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)  # [n, E]
    topk_weights, topk_ids = torch.topk(probs, top_k, dim=-1)  # [n, k], [n, k]
    if renormalize:
        topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    return topk_weights, topk_ids.to(torch.int32)


def select_experts_topk_softmax(router_logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """gpt-oss's routing: each token's ``top_k`` largest logits, then a softmax over those only (in the logits'
    dtype, as transformers does): ``([n, k] float32, [n, k] int32)``."""
    top_logits, topk_ids = torch.topk(router_logits, top_k, dim=-1)  # [n, k], [n, k]
    return torch.softmax(top_logits, dim=-1).float(), topk_ids.to(torch.int32)


#: the experts' activations: "silu" ``silu(gate) * up``; "swigluoai" gpt-oss's clamped SwiGLU
#: ``(clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g)``, ``g = min(gate, limit)``
EXPERT_ACTIVATIONS = ("silu", "swigluoai")


def expert_activation(gate: torch.Tensor, up: torch.Tensor, activation: str = "silu", alpha: float = 1.702,
                      limit: float = 7.0) -> torch.Tensor:
    """An expert's activation of its gate and up projections (``[rows, I]`` each) -> ``[rows, I]``."""
    if activation == "silu":
        return F.silu(gate) * up
    if activation != "swigluoai":
        raise ValueError(f"activation must be one of {EXPERT_ACTIVATIONS}, got {activation!r}")
    gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, *, w13_scale: torch.Tensor | None = None, w2_scale: torch.Tensor | None = None,
              block_shape: tuple[int, int] | None = None, w13_bias: torch.Tensor | None = None,
              w2_bias: torch.Tensor | None = None, activation: str = "silu", swiglu_alpha: float = 1.702,
              swiglu_limit: float = 7.0) -> torch.Tensor:
    """``sum_j topk_weights[t, j] * down_e(silu(gate_e(x_t)) * up_e(x_t))`` over each token's experts
    ``e = topk_ids[t, j]``: ``[n, H]`` in ``x``'s dtype.

    gpt-oss: ``w13_bias [E, 2 * I]`` (gate then up, as ``w13``'s rows) and ``w2_bias [E, H]`` added after each
    projection's matmul (as transformers adds them), and ``activation="swigluoai"`` (``expert_activation``).

    The projections run in ``x``'s dtype; the weighted sum over the k picks accumulates in float32, expert by
    expert in increasing order (transformers' order). The loop visits only the experts that have tokens, each
    with its rows gathered into one matmul.

    FP8 experts (``fused_moe_triton``'s arguments: float8_e4m3fn ``w13``/``w2``, their scales per output channel
    or per ``block_shape`` block): each picked expert's weights are dequantized to ``x``'s dtype, and the
    activations stay unquantized, as the Triton decode path runs them. MXFP4 experts (uint8 ``w13`` [E, 2I, H/2]
    and ``w2`` [E, H, I/2], two e2m1 values a byte, with uint8 e8m0 scales [E, 2I, H/32] and [E, H, I/32]) are
    dequantized the same way (``kernels/mxfp4.py``).
    """
    n, _ = x.shape  # x: [n, H]
    num_experts, top_k, inter = w13.shape[0], topk_ids.shape[1], w13.shape[1] // 2
    out = torch.zeros(n, x.shape[1], dtype=torch.float32, device=x.device)  # [n, H]
    flat_ids = topk_ids.reshape(-1).long()  # [n * k]
    order = torch.argsort(flat_ids, stable=True)  # picks grouped by expert, tokens in order within one
    counts = torch.bincount(flat_ids, minlength=num_experts).tolist()
    tokens = order // top_k  # [n * k]: the token of each sorted pick
    weights = topk_weights.reshape(-1)[order].float()  # [n * k]
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        rows = tokens[start:start + count]  # [count]
        gate_up = w13[expert] if w13_scale is None else dequantize_expert(w13, w13_scale, block_shape, expert,
                                                                          x.dtype, gated=True)  # [2I, H]
        down = w2[expert] if w2_scale is None else dequantize_expert(w2, w2_scale, block_shape, expert, x.dtype)
        h = F.linear(x.index_select(0, rows), gate_up)  # [count, 2 * I]
        if w13_bias is not None:
            h = h + w13_bias[expert]
        act = expert_activation(h[:, :inter], h[:, inter:], activation, swiglu_alpha, swiglu_limit)  # [count, I]
        y = F.linear(act, down)  # [count, H]
        if w2_bias is not None:
            y = y + w2_bias[expert]
        out.index_add_(0, rows, y.float() * weights[start:start + count, None])
        start += count
    return out.to(x.dtype)


def dequantize_expert(w8: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None, expert: int,
                      dtype: torch.dtype, gated: bool = False) -> torch.Tensor:
    """Expert ``expert``'s weight (``[N, K]`` in ``dtype``) from stacked FP8 ones ``w8`` [E, N, K] and their
    scales (``[E, N]`` per channel, ``[E, N blocks, K blocks]`` per block). ``gated``: ``w13``, whose gate and
    up halves have their own blocks, the gate's stacked first. MXFP4 (uint8 ``w8`` [E, N, K/2], ``scale``
    [E, N, K/32]): ``dequantize_mxfp4``."""
    if w8.dtype == torch.uint8:
        return dequantize_mxfp4(w8[expert], scale[expert], dtype)
    if not gated or block is None:
        return dequantize_weight_fp8_ref(w8[expert], scale[expert], block, dtype)
    inter, half = w8.shape[1] // 2, scale.shape[1] // 2
    return torch.cat([dequantize_weight_fp8_ref(w8[expert, :inter], scale[expert, :half], block, dtype),
                      dequantize_weight_fp8_ref(w8[expert, inter:], scale[expert, half:], block, dtype)])
