"""Shared pieces of the Triton attention kernels: the inner key-tile loop and host-side checks."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
# NOTE: finite "-inf" for the running max, so fully masked rows give 0 instead of NaN.
NEG_BIG = tl.constexpr(-1.0e30)


@triton.jit
def attend_range(
    acc,  # [BLOCK_M, HEAD_DIM_PAD] float32, unnormalized output
    l_i,  # [BLOCK_M] float32, running softmax denominator
    m_i,  # [BLOCK_M] float32, running max (log2 domain)
    q,  # [BLOCK_M, HEAD_DIM_PAD] query tile (float32 if DOT_F32)
    q_pos,  # [BLOCK_M] int32, absolute position of each query (causal limit)
    k_lo,  # first key position (multiple of BLOCK_N)
    k_hi,  # one past the last key position
    bt_ptr,  # block table of this row
    k_base,  # k_cache + kv_head * stride
    v_base,  # v_cache + kv_head * stride
    stride_kb,
    stride_ks,
    stride_vb,
    stride_vs,
    qk_scale,  # softmax scale * log2(e)
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    MASKED: tl.constexpr,  # False: caller guarantees full tiles visible to every query
    DOT_F32: tl.constexpr,
):
    offs_n = tl.arange(0, BLOCK_N)  # [BLOCK_N]
    offs_d = tl.arange(0, HEAD_DIM_PAD)  # [HEAD_DIM_PAD]
    for start in range(k_lo, k_hi, BLOCK_N):
        k_pos = start + offs_n  # [BLOCK_N]
        if MASKED:
            k_valid = k_pos < k_hi  # [BLOCK_N]
            blk = tl.load(bt_ptr + k_pos // BLOCK_SIZE, mask=k_valid, other=0).to(tl.int64)  # [BLOCK_N]
        else:
            blk = tl.load(bt_ptr + k_pos // BLOCK_SIZE).to(tl.int64)  # [BLOCK_N]
        in_blk = k_pos % BLOCK_SIZE  # [BLOCK_N]
        k_ptrs = k_base + (blk * stride_kb + in_blk * stride_ks)[:, None] + offs_d[None, :]  # [BLOCK_N, D]
        v_ptrs = v_base + (blk * stride_vb + in_blk * stride_vs)[:, None] + offs_d[None, :]  # [BLOCK_N, D]
        if MASKED:
            kv_mask = k_valid[:, None] & (offs_d < HEAD_DIM)[None, :]  # [BLOCK_N, D]
            k = tl.load(k_ptrs, mask=kv_mask, other=0.0)
            v = tl.load(v_ptrs, mask=kv_mask, other=0.0)
        elif HEAD_DIM_PAD != HEAD_DIM:
            k = tl.load(k_ptrs, mask=(offs_d < HEAD_DIM)[None, :], other=0.0)
            v = tl.load(v_ptrs, mask=(offs_d < HEAD_DIM)[None, :], other=0.0)
        else:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
        if DOT_F32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        else:  # NOTE: no-op for a cache in the model's dtype; an FP8 cache's e4m3 values are exact in bf16/fp16
            k = k.to(q.dtype)
            v = v.to(q.dtype)
        s = tl.dot(q, tl.trans(k)) * qk_scale  # [BLOCK_M, BLOCK_N] float32
        if MASKED:
            visible = (k_pos[None, :] <= q_pos[:, None]) & k_valid[None, :]  # [BLOCK_M, BLOCK_N]
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # [BLOCK_M], finite (m_i starts at NEG_BIG)
        alpha = tl.exp2(m_i - m_new)  # [BLOCK_M]
        p = tl.exp2(s - m_new[:, None])  # [BLOCK_M, BLOCK_N]
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)  # [BLOCK_M, HEAD_DIM_PAD]
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def attend_keys(
    acc, l_i, m_i, q, q_pos,
    k_lo,  # first key position (multiple of BLOCK_N)
    full_end,  # keys [k_lo, full_end) are visible to every query: no masks
    k_hi,  # keys [full_end, k_hi) are masked per query (the diagonal tiles)
    bt_ptr, k_base, v_base, stride_kb, stride_ks, stride_vb, stride_vs, qk_scale,
    BLOCK_N: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    # attend_range over the unmasked tiles, then over the masked ones
    acc, l_i, m_i = attend_range(
        acc, l_i, m_i, q, q_pos, k_lo, full_end, bt_ptr, k_base, v_base,
        stride_kb, stride_ks, stride_vb, stride_vs, qk_scale,
        BLOCK_N, BLOCK_SIZE, HEAD_DIM, HEAD_DIM_PAD, False, DOT_F32,
    )  # fmt: skip
    return attend_range(
        acc, l_i, m_i, q, q_pos, full_end, k_hi, bt_ptr, k_base, v_base,
        stride_kb, stride_ks, stride_vb, stride_vs, qk_scale,
        BLOCK_N, BLOCK_SIZE, HEAD_DIM, HEAD_DIM_PAD, True, DOT_F32,
    )  # fmt: skip


def dot_f32(t: torch.Tensor) -> bool:
    """The interpreter (Triton on CPU tensors) computes tl.dot on bf16/fp16 wrongly: float32 tiles there."""
    return t.device.type == "cpu"


def check_inputs(query, k_cache, v_cache, block_tables) -> tuple[int, int, int]:
    num_heads, head_dim = query.shape[1], query.shape[2]
    num_kv_heads = k_cache.shape[2]
    assert k_cache.shape == v_cache.shape and k_cache.shape[3] == head_dim
    assert num_heads % num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads"
    assert query.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    assert block_tables.stride(-1) == 1
    assert head_dim <= 256, "head_dim > 256 is not supported"
    return num_heads, num_kv_heads, head_dim
