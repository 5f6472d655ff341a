"""Plain references for the MoE layer's torch path and kernels (tests/test_moe_torch.py and tests/test_fused_moe.py on
the CPU, tests/gpu on the GPU): the routing, the layer as a loop over experts in float64, the alignment as a Python
loop, and routings with uneven loads."""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: relative error (``kernel_checks.rel_err``) allowed against the float64 reference, by the inputs' dtype
MOE_TOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 2e-2}


def select_experts_naive(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights [n, k] float32, ids [n, k] int32)``: float32 softmax, top-k largest first, renormalized."""
    probs = torch.softmax(logits.float(), dim=-1)  # [n, E]
    weights, ids = probs.topk(top_k, dim=-1)  # [n, k]
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights, ids.to(torch.int32)


def fused_moe_naive(x, w13, w2, topk_weights, topk_ids, acc_dtype=torch.float64) -> torch.Tensor:
    """``[n, H]`` in ``acc_dtype``: for each expert, its tokens' ``weight * w2 @ (silu(gate) * up)``, summed."""
    n, hidden = x.shape
    inter = w13.shape[1] // 2
    xs, w13, w2 = x.to(acc_dtype), w13.to(acc_dtype), w2.to(acc_dtype)
    out = torch.zeros(n, hidden, dtype=acc_dtype, device=x.device)  # [n, H]
    for e in topk_ids.unique().tolist():
        token, pick = (topk_ids == e).nonzero(as_tuple=True)  # [rows] each
        gate_up = xs[token] @ w13[e].T  # [rows, 2I]
        act = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]  # [rows, I]
        y = act @ w2[e].T * topk_weights[token, pick].to(acc_dtype)[:, None]  # [rows, H]
        out.index_add_(0, token, y)
    return out


def align_naive(topk_ids: torch.Tensor, block_m: int, num_experts: int):
    """``(sorted_token_ids, expert_ids, num_tokens_post_padded)`` built one pair at a time (vLLM's layout, runs
    in pair order, padded with ``numel``, tiles past the end of expert -1), as lists of the kernel's lengths."""
    flat = topk_ids.flatten().tolist()
    numel = len(flat)
    max_padded = numel + min(numel, num_experts) * (block_m - 1)
    sorted_ids, expert_ids = [], []
    for e in range(num_experts):
        run = [i for i, v in enumerate(flat) if v == e]
        if not run:
            continue
        padded = -(-len(run) // block_m) * block_m
        sorted_ids += run + [numel] * (padded - len(run))
        expert_ids += [e] * (padded // block_m)
    used = len(sorted_ids)
    sorted_ids += [numel] * (max_padded - used)
    expert_ids += [-1] * (-(-max_padded // block_m) - len(expert_ids))
    return sorted_ids, expert_ids, used


def uneven_routing(n: int, num_experts: int, top_k: int, seed: int = 0, skew: float = 4.0,
                   device: str = "cpu", used_experts: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights [n, k] float32, ids [n, k] int32)``: each token's ``top_k`` distinct experts drawn with
    probability falling off as ``exp(-e / skew)``, so low ids are crowded and high ones mostly empty; the
    weights positive and summing to 1 per token. ``used_experts``: draw from the first ones only (at least
    ``top_k``), so that the others surely get no token."""
    g = torch.Generator().manual_seed(seed)
    probs = torch.exp(-torch.arange(num_experts, dtype=torch.float64) / skew)  # [E]
    if used_experts is not None:
        probs[max(top_k, used_experts):] = 0.0
    probs = probs.expand(n, num_experts)
    ids = torch.multinomial(probs, top_k, replacement=False, generator=g).to(torch.int32)  # [n, k]
    weights = torch.rand(n, top_k, generator=g) + 0.1
    weights = weights / weights.sum(-1, keepdim=True)
    return weights.to(device), ids.to(device)


def moe_weights(num_experts: int, hidden: int, inter: int, dtype: torch.dtype, seed: int = 0,
                device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """``(w13 [E, 2I, H], w2 [E, H, I])`` scaled so that activations stay near unit size."""
    g = torch.Generator().manual_seed(seed)
    w13 = torch.randn(num_experts, 2 * inter, hidden, generator=g) / hidden**0.5
    w2 = torch.randn(num_experts, hidden, inter, generator=g) / inter**0.5
    return w13.to(device=device, dtype=dtype), w2.to(device=device, dtype=dtype)


def fused_moe_fp8_naive(x, w13_8, w13_scale, w2_8, w2_scale, block, topk_weights, topk_ids,
                        quantize_acts: bool) -> torch.Tensor:
    """``[n, H]`` float64 with the dequantized FP8 experts. ``quantize_acts`` (the grouped W8A8 path): ``x`` and
    the SiLU-and-mul activations (rounded to ``x``'s dtype first, as the kernel stores them) pass through the
    per-token (per-token-group with blocks) e4m3 quantizer, as the kernels' inputs do."""
    from minivllm.kernels.torch_backend import dequantize_weight_fp8_ref, quantize_fp8_ref

    group = None if block is None else block[1]

    def through_fp8(a):
        if not quantize_acts:
            return a.double()
        q, s = quantize_fp8_ref(a.float(), group)
        k = a.shape[1]
        g = k if group is None else group
        return q.double() * s.double().repeat_interleave(g, 1)[:, :k]

    n, hidden = x.shape
    inter = w13_8.shape[1] // 2
    xs = through_fp8(x)
    out = torch.zeros(n, hidden, dtype=torch.float64, device=x.device)
    for e in topk_ids.unique().tolist():
        token, pick = (topk_ids == e).nonzero(as_tuple=True)
        half = w13_scale.shape[1] // 2  # the gate's scales, then the up's
        w13 = torch.cat([dequantize_weight_fp8_ref(w13_8[e, :inter], w13_scale[e, :half], block, torch.float64),
                         dequantize_weight_fp8_ref(w13_8[e, inter:], w13_scale[e, half:], block, torch.float64)])
        w2 = dequantize_weight_fp8_ref(w2_8[e], w2_scale[e], block, torch.float64)
        gate_up = xs[token] @ w13.T  # [rows, 2I]
        act = (F.silu(gate_up[:, :inter]) * gate_up[:, inter:]).to(x.dtype)  # [rows, I]
        y = through_fp8(act) @ w2.T * topk_weights[token, pick].double()[:, None]  # [rows, H]
        out.index_add_(0, token, y)
    return out

