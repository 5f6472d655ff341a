"""One-pass random sampling from logits: ``argmax(l / T + Gumbel noise)`` per row (Triton).

The Gumbel-max trick draws token ``t`` with probability ``softmax(l / T)[t]``, the same
distribution as the sampler's exponential race (``argmax(p / E)`` with ``E ~ Exp(1)`` is
``argmax(log p + G)`` with ``G = -log E ~ Gumbel(0, 1)``), but it needs no softmax and no noise
tensor: the programs of a row each scan ``block_v`` of its tokens, draw ``G`` with Philox from the
row's seed and the token index and keep their maximum; a second small kernel picks the row's best
chunk. (One program a row, scanning the vocabulary alone, took ~0.3 ms at 256 rows on an H200
and left all but one SM idle for one row.) Rows with temperature 0 take the plain argmax.

Randomness: row ``b`` uses ``seeds[b]`` (int64) as the Philox key and the token id as the counter,
so a row's draw depends only on its seed, never on its batch or position.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _gumbel_chunk_kernel(
    logits_ptr,  # [B, V] any float dtype
    stride_b,
    temperature_ptr,  # [B] float32 (read if HAS_TEMPERATURE)
    seeds_ptr,  # [B] int64
    best_ptr,  # [B, C] float32: each chunk's best noisy logit
    idx_ptr,  # [B, C] int32: its token id
    V,
    C,
    HAS_TEMPERATURE: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    inv_t = 1.0
    noisy = True
    if HAS_TEMPERATURE:
        t = tl.load(temperature_ptr + row)
        noisy = t > 0.0
        inv_t = tl.where(noisy, 1.0 / tl.maximum(t, 1e-30), 1.0)
    seed = tl.load(seeds_ptr + row)
    offs = chunk * BLOCK_V + tl.arange(0, BLOCK_V)  # [BLOCK_V]
    mask = offs < V
    x = tl.load(logits_ptr + row.to(tl.int64) * stride_b + offs, mask=mask, other=-float("inf")).to(tl.float32) * inv_t
    if noisy:
        u = tl.rand(seed, offs)  # [BLOCK_V] uniform in [0, 1)
        x = x - tl.log(-tl.log(u))  # u = 0 gives -inf: that token cannot win
    x = tl.where(mask, x, -float("inf"))
    # NOTE: argmax takes the first of equal values: ties keep the lower token id, as torch.argmax
    tl.store(best_ptr + row * C + chunk, tl.max(x, 0))
    tl.store(idx_ptr + row * C + chunk, chunk * BLOCK_V + tl.argmax(x, 0))


@triton.jit
def _gumbel_pick_kernel(best_ptr, idx_ptr, out_ptr, C, BLOCK_C: tl.constexpr):
    row = tl.program_id(0)
    c = tl.arange(0, BLOCK_C)  # [BLOCK_C]
    best = tl.load(best_ptr + row * C + c, mask=c < C, other=-float("inf"))
    win = tl.argmax(best, 0)  # the first chunk of equal bests: the lowest token id
    tl.store(out_ptr + row, tl.load(idx_ptr + row * C + win).to(tl.int64))


def gumbel_sample(logits: torch.Tensor, seeds: torch.Tensor, temperature: torch.Tensor | None = None,
                  block_v: int = 4096) -> torch.Tensor:
    """Sample one token id per row of ``logits`` ([B, V]); ``seeds`` [B] int64, ``temperature`` [B] or None (1.0).

    ``block_v``: tokens a program scans (a power of two); the result does not depend on it.
    """
    if logits.dim() != 2 or logits.stride(-1) != 1:
        raise ValueError("logits must be a [B, V] tensor with contiguous rows")
    if block_v < 1 or block_v & (block_v - 1):
        raise ValueError(f"block_v must be a power of two, got {block_v}")
    batch, vocab = logits.shape
    if seeds.shape != (batch,) or seeds.dtype != torch.int64:
        raise ValueError("seeds must be an int64 tensor with one seed per row")
    out = torch.empty(batch, dtype=torch.int64, device=logits.device)
    if batch == 0:
        return out
    has_t = temperature is not None
    temps = temperature.to(torch.float32).contiguous() if has_t else seeds  # (unused pointer when not has_t)
    block_v = min(block_v, triton.next_power_of_2(vocab))
    chunks = triton.cdiv(vocab, block_v)
    best = torch.empty(batch, chunks, dtype=torch.float32, device=logits.device)
    idx = torch.empty(batch, chunks, dtype=torch.int32, device=logits.device)
    _gumbel_chunk_kernel[(batch, chunks)](logits, logits.stride(0), temps, seeds.contiguous(), best, idx, vocab,
                                          chunks, HAS_TEMPERATURE=has_t, BLOCK_V=block_v)
    _gumbel_pick_kernel[(batch,)](best, idx, out, chunks, BLOCK_C=triton.next_power_of_2(chunks))
    return out
