"""Naive mixture-of-experts references for the kernel tests: one token at a time, in float64, and routings
with uneven expert loads (the torch path of ``minivllm/kernels/moe_torch.py`` and the Triton kernels are both
checked against these)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: relative error (``kernel_checks.rel_err``) allowed against the float64 reference, by the inputs' dtype
MOE_TOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 2e-2}


def naive_select_experts(router_logits: torch.Tensor, top_k: int,
                         renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Token by token: float32 softmax, the ``top_k`` most probable experts by a stable descending sort,
    optionally divided by their sum -> ``([n, k] float32, [n, k] int64)``."""
    weights, ids = [], []
    for row in router_logits.float():
        probs = torch.softmax(row, dim=-1)  # [E]
        order = torch.sort(probs, descending=True, stable=True).indices[:top_k]  # [k]
        w = probs[order]
        weights.append(w / w.sum() if renormalize else w)
        ids.append(order)
    return torch.stack(weights), torch.stack(ids)


def naive_fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                    topk_ids: torch.Tensor) -> torch.Tensor:
    """``sum_j w[t, j] * down_e(silu(gate_e(x_t)) * up_e(x_t))`` token by token and pick by pick, every input
    upcast to float64 -> ``[n, H]`` float64."""
    inter = w2.shape[2]
    x, w13, w2, topk_weights = x.double(), w13.double(), w2.double(), topk_weights.double()
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[t, j])
            gate, up = w13[e, :inter] @ x[t], w13[e, inter:] @ x[t]  # [I], [I]
            out[t] += topk_weights[t, j] * (w2[e] @ (F.silu(gate) * up))
    return out


def uneven_routing(num_tokens: int, num_experts: int, top_k: int, seed: int = 0,
                   used_experts: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ``(topk_weights [n, k] float32, topk_ids [n, k] int32)`` whose picks fall only on the first
    ``used_experts`` experts (default: half of them, at least ``top_k``; the rest get no tokens), skewed
    towards low expert ids; each token's k ids are distinct and its weights positive."""
    gen = torch.Generator().manual_seed(seed)
    used = max(top_k, used_experts if used_experts is not None else num_experts // 2)
    popularity = torch.linspace(2.0, 0.2, used)  # expert 0 draws about ten times the tokens of the last one used
    ids = torch.stack([torch.multinomial(popularity, top_k, replacement=False, generator=gen)
                       for _ in range(num_tokens)]) if num_tokens else torch.empty(0, top_k, dtype=torch.long)
    weights = torch.rand(num_tokens, top_k, generator=gen) + 0.05
    return weights.float(), ids.to(torch.int32)
