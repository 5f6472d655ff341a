"""Triton per-head RMSNorm (Qwen3 q_norm / k_norm) + rotary embedding of q and k in one launch.

Numerics follow the torch layers op by op, in the input dtype:

    h   = (x.float() * rsqrt(mean(x.float()^2) + eps)).to(dtype) * weight      # if weights given
    cos, sin = cos_sin_cache[positions].chunk(2) cast to dtype
    out = h * cat(cos, cos) + rotate_half(h) * cat(sin, sin)                    # NeoX / rotate-half

Every torch op rounds to the dtype, so the kernel rounds each product and sum the same way
(bf16 results agree with ``minivllm.layers.rotary.RotaryEmbedding`` up to rare 1-ulp flips).

Grid: ``(num_tokens, cdiv(hq, BLOCK_H) + cdiv(hkv, BLOCK_H))``; program ``(t, j)`` handles
``BLOCK_H`` heads of token ``t``, of q for the first ``cdiv(hq, BLOCK_H)`` values of ``j``,
then of k. q/k may be strided views (e.g. of a fused qkv projection output).

With ``kv_store`` the k programs also write their rotated k heads, and the same heads of v, to the
paged KV cache at the token's slot (what ``store_kvcache`` does, one launch a layer fewer).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.kernels.pdl import pdl_options, pdl_wait
from minivllm.kernels.torch_backend import fp8_max


@triton.jit
def _norm_rope_heads(
    src,  # pointer to head 0 of this token (q or k)
    dst,  # pointer to head 0 of this token in the output
    w_ptr,  # [head_dim] norm weight (unused without HAS_NORM)
    cos,  # [BLOCK_HALF] float32, already rounded to the dtype
    sin,  # [BLOCK_HALF] float32, already rounded to the dtype
    h0,  # first head of this program
    num_heads,
    stride_h,
    stride_oh,
    eps,
    HALF: tl.constexpr,
    HAS_NORM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    dt = dst.dtype.element_ty
    offs_h = h0 + tl.arange(0, BLOCK_H)  # [BLOCK_H]
    offs_d = tl.arange(0, BLOCK_HALF)  # [BLOCK_HALF]
    mask = (offs_h < num_heads)[:, None] & (offs_d < HALF)[None, :]  # [BLOCK_H, BLOCK_HALF]
    p1 = src + offs_h[:, None] * stride_h + offs_d[None, :]  # [BLOCK_H, BLOCK_HALF] first halves
    x1 = tl.load(p1, mask=mask, other=0.0).to(tl.float32)  # [BLOCK_H, BLOCK_HALF]
    x2 = tl.load(p1 + HALF, mask=mask, other=0.0).to(tl.float32)  # [BLOCK_H, BLOCK_HALF]
    if HAS_NORM:
        ss = tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)  # [BLOCK_H]
        rstd = (1.0 / tl.sqrt(ss / (2 * HALF) + eps))[:, None]  # [BLOCK_H, 1]
        dmask = offs_d < HALF  # [BLOCK_HALF]
        w1 = tl.load(w_ptr + offs_d, mask=dmask, other=0.0).to(tl.float32)[None, :]  # [1, BLOCK_HALF]
        w2 = tl.load(w_ptr + HALF + offs_d, mask=dmask, other=0.0).to(tl.float32)[None, :]
        # round to the dtype before and after the weight multiply, as the torch RMSNorm does
        x1 = ((x1 * rstd).to(dt).to(tl.float32) * w1).to(dt).to(tl.float32)
        x2 = ((x2 * rstd).to(dt).to(tl.float32) * w2).to(dt).to(tl.float32)
    c = cos[None, :]  # [1, BLOCK_HALF]
    s = sin[None, :]
    # torch: q * cos + rotate_half(q) * sin, each product and the sum rounded to the dtype
    o1 = (x1 * c).to(dt).to(tl.float32) - (x2 * s).to(dt).to(tl.float32)  # [BLOCK_H, BLOCK_HALF]
    o2 = (x2 * c).to(dt).to(tl.float32) + (x1 * s).to(dt).to(tl.float32)
    po = dst + offs_h[:, None] * stride_oh + offs_d[None, :]  # [BLOCK_H, BLOCK_HALF]
    tl.store(po, o1.to(dt), mask=mask)
    tl.store(po + HALF, o2.to(dt), mask=mask)
    return o1, o2, offs_h, offs_d, mask


@triton.jit
def _store_heads_to_cache(
    o1, o2,  # [BLOCK_H, BLOCK_HALF] float32 rotated k, both halves
    v_src,  # pointer to v head 0 of this token (v has k's dtype)
    kc, vc,  # pointers to this token's slot in the k / v cache (head 0)
    offs_h, offs_d, mask, stride_vh, stride_ch,
    inv_k_scale, inv_v_scale,  # an FP8 cache holds K / k_scale and V / v_scale
    HALF: tl.constexpr,
    SAT: tl.constexpr,  # > 0: clamp to [-SAT, SAT] before the cast (FP8 e4m3 has no infinity)
):
    cdt = kc.dtype.element_ty
    # k is rounded to its own dtype first, as store_kvcache reads it from the qkv buffer
    o1 = o1.to(v_src.dtype.element_ty).to(tl.float32)
    o2 = o2.to(v_src.dtype.element_ty).to(tl.float32)
    pv = v_src + offs_h[:, None] * stride_vh + offs_d[None, :]  # [BLOCK_H, BLOCK_HALF]
    v1 = tl.load(pv, mask=mask, other=0.0).to(tl.float32)
    v2 = tl.load(pv + HALF, mask=mask, other=0.0).to(tl.float32)
    if SAT > 0:
        o1, o2, v1, v2 = o1 * inv_k_scale, o2 * inv_k_scale, v1 * inv_v_scale, v2 * inv_v_scale
        o1, o2 = tl.minimum(tl.maximum(o1, -SAT), SAT), tl.minimum(tl.maximum(o2, -SAT), SAT)
        v1, v2 = tl.minimum(tl.maximum(v1, -SAT), SAT), tl.minimum(tl.maximum(v2, -SAT), SAT)
    off = offs_h[:, None] * stride_ch + offs_d[None, :]  # [BLOCK_H, BLOCK_HALF]
    tl.store(kc + off, o1.to(cdt), mask=mask)
    tl.store(kc + off + HALF, o2.to(cdt), mask=mask)
    tl.store(vc + off, v1.to(cdt), mask=mask)
    tl.store(vc + off + HALF, v2.to(cdt), mask=mask)


@triton.jit
def _qk_norm_rope_kernel(
    q_ptr, k_ptr,  # [n, hq, hd], [n, hkv, hd] inputs (unit stride in hd)
    qo_ptr, ko_ptr,  # outputs of the same shapes (may alias the inputs)
    pos_ptr,  # [n] int positions
    cache_ptr,  # [max_pos, hd] cos (first half) | sin (second half)
    qw_ptr, kw_ptr,  # [hd] q_norm / k_norm weights (unused without HAS_NORM)
    v_ptr,  # [n, hkv, hd] (unused without STORE_KV)
    k_cache_ptr, v_cache_ptr,  # [num_blocks, block_size, hkv, hd] (unused without STORE_KV)
    slot_ptr,  # [n] int cache slots, -1 = do not store (unused without STORE_KV)
    stride_qt, stride_qh, stride_kt, stride_kh,
    stride_qot, stride_qoh, stride_kot, stride_koh,
    stride_vt, stride_vh, stride_cb, stride_cs, stride_ch,
    stride_cache,
    num_q_heads, num_k_heads, eps, inv_k_scale, inv_v_scale,
    HALF: tl.constexpr,
    HAS_NORM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    STORE_KV: tl.constexpr,
    CACHE_BLOCK: tl.constexpr,  # tokens per cache block
    SAT: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_wait(USE_PDL)
    t = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    dt = qo_ptr.dtype.element_ty
    offs_d = tl.arange(0, BLOCK_HALF)  # [BLOCK_HALF]
    pos = tl.load(pos_ptr + t).to(tl.int64)
    row = cache_ptr + pos * stride_cache
    cos = tl.load(row + offs_d, mask=offs_d < HALF, other=0.0).to(dt).to(tl.float32)  # [BLOCK_HALF]
    sin = tl.load(row + HALF + offs_d, mask=offs_d < HALF, other=0.0).to(dt).to(tl.float32)
    q_blocks = tl.cdiv(num_q_heads, BLOCK_H)
    if j < q_blocks:
        _norm_rope_heads(q_ptr + t * stride_qt, qo_ptr + t * stride_qot, qw_ptr, cos, sin, j * BLOCK_H,
                         num_q_heads, stride_qh, stride_qoh, eps, HALF, HAS_NORM, BLOCK_H, BLOCK_HALF)
    else:
        o1, o2, offs_h, offs_d, mask = _norm_rope_heads(
            k_ptr + t * stride_kt, ko_ptr + t * stride_kot, kw_ptr, cos, sin, (j - q_blocks) * BLOCK_H,
            num_k_heads, stride_kh, stride_koh, eps, HALF, HAS_NORM, BLOCK_H, BLOCK_HALF)
        if STORE_KV:
            slot = tl.load(slot_ptr + t).to(tl.int64)
            if slot >= 0:
                base = (slot // CACHE_BLOCK) * stride_cb + (slot % CACHE_BLOCK) * stride_cs
                _store_heads_to_cache(o1, o2, v_ptr + t * stride_vt, k_cache_ptr + base, v_cache_ptr + base,
                                      offs_h, offs_d, mask, stride_vh, stride_ch, inv_k_scale, inv_v_scale, HALF, SAT)


def qk_norm_rope(
    q: torch.Tensor,  # [n, hq, hd], unit stride in hd (e.g. a view of the fused qkv output)
    k: torch.Tensor,  # [n, hkv, hd], unit stride in hd, same dtype as q
    positions: torch.Tensor,  # [n] int32/int64
    cos_sin_cache: torch.Tensor,  # [max_pos, hd]: cos | sin (RotaryEmbedding.cos_sin_cache)
    q_weight: torch.Tensor | None = None,  # [hd] q_norm weight, or None for RoPE only
    k_weight: torch.Tensor | None = None,  # [hd] k_norm weight (given iff q_weight is)
    eps: float = 1e-6,
    inplace: bool = False,
    kv_store: tuple | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # (q_out [n, hq, hd], k_out [n, hkv, hd])
    """Optional per-head RMSNorm of q and k, then rotate-half RoPE at ``positions``; one launch.

    ``inplace=False``: new contiguous outputs. ``inplace=True``: results are written into ``q``
    and ``k`` (e.g. into the qkv buffer) and those same views are returned.
    ``kv_store=(v, k_cache, v_cache, slot_mapping[, k_scale, v_scale])``: also write the rotated k and ``v``
    [n, hkv, hd] to the paged cache, as ``store_kvcache_ref`` does (an FP8 cache: divided by the scales).
    """
    n, hq, hd = q.shape
    hkv = k.shape[1]
    assert k.shape == (n, hkv, hd) and k.dtype == q.dtype and positions.shape == (n,)
    assert hd % 2 == 0 and cos_sin_cache.shape[1] == hd and cos_sin_cache.stride(1) == 1
    assert q.stride(-1) == 1 and k.stride(-1) == 1, "q and k need unit stride in head_dim"
    assert (q_weight is None) == (k_weight is None), "give both q_weight and k_weight, or neither"
    has_norm = q_weight is not None
    if has_norm:
        assert q_weight.shape == (hd,) and k_weight.shape == (hd,)
        assert q_weight.is_contiguous() and k_weight.is_contiguous()
    if inplace:
        q_out, k_out = q, k
    else:
        q_out = torch.empty((n, hq, hd), dtype=q.dtype, device=q.device)  # [n, hq, hd]
        k_out = torch.empty((n, hkv, hd), dtype=k.dtype, device=k.device)  # [n, hkv, hd]
    if n == 0:
        return q_out, k_out
    half = hd // 2
    block_half = triton.next_power_of_2(half)
    block_h = min(triton.next_power_of_2(min(hq, hkv)), max(1, 1024 // block_half))
    grid = (n, triton.cdiv(hq, block_h) + triton.cdiv(hkv, block_h))
    qw = q_weight if has_norm else cos_sin_cache  # dummy pointers, never read without HAS_NORM
    kw = k_weight if has_norm else cos_sin_cache
    if kv_store is not None:
        v, k_cache, v_cache, slots, *kv_scales = kv_store
        assert v.shape == k.shape and v.dtype == k.dtype and v.stride(-1) == 1 and slots.shape == (n,)
        assert k_cache.shape == v_cache.shape and k_cache.shape[2:] == (hkv, hd)
        assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1 and k_cache.dtype == v_cache.dtype
        cache_strides, sat = k_cache.stride()[:3], fp8_max(k_cache.dtype)
    else:
        v, k_cache, v_cache, slots = k, k, k, positions  # dummy pointers, never read without STORE_KV
        cache_strides, sat, kv_scales = (0, 0, 0), 0.0, []
    k_scale, v_scale = kv_scales or (1.0, 1.0)
    _qk_norm_rope_kernel[grid](
        q, k, q_out, k_out, positions, cos_sin_cache, qw, kw, v, k_cache, v_cache, slots,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
        v.stride(0), v.stride(1), *cache_strides,
        cos_sin_cache.stride(0), hq, hkv, eps, 1.0 / k_scale, 1.0 / v_scale,
        HALF=half, HAS_NORM=has_norm, BLOCK_H=block_h, BLOCK_HALF=block_half,
        STORE_KV=kv_store is not None, CACHE_BLOCK=k_cache.shape[1] if kv_store is not None else 1, SAT=sat,
        num_warps=max(1, min(8, block_h * block_half // 128)), **pdl_options(q),
    )
    return q_out, k_out
