"""Top-k softmax routing of a mixture-of-experts layer in one Triton kernel: per token, the softmax of its
router logits over the ``E`` experts (float32), the ``top_k`` largest probabilities with their expert ids,
and (``renormalize``, Qwen3's ``norm_topk_prob``, Mixtral) those ``top_k`` weights divided by their sum.

One program a token row; the ``top_k`` picks are ``top_k`` rounds of argmax over the row held in registers,
largest first (as ``torch.topk`` orders them). Reference: ``select_experts`` in ``minivllm.kernels.moe_torch``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.kernels.pdl import pdl_options, pdl_wait


@triton.jit
def _topk_softmax_kernel(
    logits_ptr,  # [n, E]
    weights_ptr,  # [n, TOP_K] float32
    ids_ptr,  # [n, TOP_K] int32
    E,
    stride_l,
    TOP_K: tl.constexpr,
    K_PAD: tl.constexpr,  # TOP_K rounded up to a power of two
    E_PAD: tl.constexpr,  # E rounded up to a power of two
    RENORMALIZE: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_wait(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, E_PAD)  # [E_PAD]
    x = tl.load(logits_ptr + row * stride_l + e, mask=e < E, other=-float("inf")).to(tl.float32)  # [E_PAD]
    p = tl.exp(x - tl.max(x, 0))  # [E_PAD], 0 past E
    p = p / tl.sum(p, 0)
    slot = tl.arange(0, K_PAD)  # [K_PAD]
    top_w = tl.zeros([K_PAD], dtype=tl.float32)
    top_id = tl.zeros([K_PAD], dtype=tl.int32)
    for j in tl.static_range(TOP_K):
        best = tl.argmax(p, 0)  # the lowest index among equal maxima
        top_w = tl.where(slot == j, tl.max(p, 0), top_w)
        top_id = tl.where(slot == j, best.to(tl.int32), top_id)
        # NOTE: a picked expert drops below every probability (>= 0), the padding past E included
        p = tl.where(e == best, -1.0, p)
    if RENORMALIZE:
        top_w = top_w / tl.sum(top_w, 0)
    tl.store(weights_ptr + row * TOP_K + slot, top_w, mask=slot < TOP_K)
    tl.store(ids_ptr + row * TOP_K + slot, top_id, mask=slot < TOP_K)


def select_experts_triton(router_logits: torch.Tensor, top_k: int,
                          renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``router_logits`` [n, E] -> ``(topk_weights [n, top_k] float32, topk_ids [n, top_k] int32)``: the softmax
    over the experts in float32, its ``top_k`` largest entries (largest first), divided by their sum when
    ``renormalize``."""
    if router_logits.dim() != 2 or router_logits.stride(1) != 1:
        raise ValueError(f"router_logits must be [n, E] with contiguous rows, got {tuple(router_logits.shape)}")
    n, num_experts = router_logits.shape
    if not 0 < top_k <= num_experts:
        raise ValueError(f"top_k must be in [1, {num_experts}] (the number of experts), got {top_k}")
    weights = torch.empty(n, top_k, dtype=torch.float32, device=router_logits.device)
    ids = torch.empty(n, top_k, dtype=torch.int32, device=router_logits.device)
    if n == 0:
        return weights, ids
    e_pad = triton.next_power_of_2(num_experts)
    _topk_softmax_kernel[(n,)](
        router_logits, weights, ids, num_experts, router_logits.stride(0), TOP_K=top_k,
        K_PAD=triton.next_power_of_2(top_k), E_PAD=e_pad, RENORMALIZE=bool(renormalize),
        num_warps=1 if e_pad <= 128 else 4, **pdl_options(router_logits))
    return weights, ids
