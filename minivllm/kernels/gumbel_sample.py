"""One-pass random sampling from logits: ``argmax(l / T + Gumbel noise)`` per row (Triton).

The Gumbel-max trick draws token ``t`` with probability ``softmax(l / T)[t]``, the same
distribution as the sampler's exponential race (``argmax(p / E)`` with ``E ~ Exp(1)`` is
``argmax(log p + G)`` with ``G = -log E ~ Gumbel(0, 1)``), but it needs no softmax and no noise
tensor: each program streams its row once, draws ``G`` with Philox from the row's seed and the
token index, and keeps the running maximum. Rows with temperature 0 take the plain argmax.

Randomness: row ``b`` uses ``seeds[b]`` (int64) as the Philox key and the token id as the counter,
so a row's draw depends only on its seed, never on its batch or position.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _gumbel_sample_kernel(
    logits_ptr,  # [B, V] any float dtype
    stride_b,
    temperature_ptr,  # [B] float32 (read if HAS_TEMPERATURE)
    seeds_ptr,  # [B] int64
    out_ptr,  # [B] int64
    V,
    HAS_TEMPERATURE: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0)
    inv_t = 1.0
    noisy = True
    if HAS_TEMPERATURE:
        t = tl.load(temperature_ptr + row)
        noisy = t > 0.0
        inv_t = tl.where(noisy, 1.0 / tl.maximum(t, 1e-30), 1.0)
    seed = tl.load(seeds_ptr + row)
    base = logits_ptr + row.to(tl.int64) * stride_b
    best = -float("inf")
    best_idx = 0
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)  # [BLOCK_V]
        mask = offs < V
        x = tl.load(base + offs, mask=mask, other=-float("inf")).to(tl.float32) * inv_t
        if noisy:
            u = tl.rand(seed, offs)  # [BLOCK_V] uniform in [0, 1)
            x = x - tl.log(-tl.log(u))  # u = 0 gives -inf: that token cannot win
        x = tl.where(mask, x, -float("inf"))
        block_best = tl.max(x, 0)
        block_idx = tl.argmax(x, 0)
        if block_best > best:  # NOTE: strict: ties keep the lower token id, as torch.argmax
            best = block_best
            best_idx = start + block_idx
    tl.store(out_ptr + row, best_idx.to(tl.int64))


def gumbel_sample(logits: torch.Tensor, seeds: torch.Tensor, temperature: torch.Tensor | None = None) -> torch.Tensor:
    """Sample one token id per row of ``logits`` ([B, V]); ``seeds`` [B] int64, ``temperature`` [B] or None (1.0)."""
    if logits.dim() != 2 or logits.stride(-1) != 1:
        raise ValueError("logits must be a [B, V] tensor with contiguous rows")
    batch, vocab = logits.shape
    if seeds.shape != (batch,) or seeds.dtype != torch.int64:
        raise ValueError("seeds must be an int64 tensor with one seed per row")
    out = torch.empty(batch, dtype=torch.int64, device=logits.device)
    if batch == 0:
        return out
    has_t = temperature is not None
    temps = temperature.to(torch.float32).contiguous() if has_t else seeds  # (unused pointer when not has_t)
    block_v = min(4096, triton.next_power_of_2(vocab))
    _gumbel_sample_kernel[(batch,)](logits, logits.stride(0), temps, seeds.contiguous(), out, vocab,
                                    HAS_TEMPERATURE=has_t, BLOCK_V=block_v)
    return out
