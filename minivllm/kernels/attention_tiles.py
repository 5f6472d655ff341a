"""Shared pieces of the Triton attention kernels: the inner key-tile loop and host-side checks."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
# NOTE: finite "-inf" for the running max, so fully masked rows give 0 instead of NaN.
NEG_BIG = tl.constexpr(-1.0e30)
LOG2E_C = tl.constexpr(LOG2E)


@triton.jit
def softmax_init(sinks_ptr, head, m_valid, BLOCK_M: tl.constexpr, HAS_SINKS: tl.constexpr):
    """The online softmax's starting (l_i, m_i) for the query heads ``head`` ([BLOCK_M]): empty (0, NEG_BIG), or
    with each head's sink logit already counted (HAS_SINKS: a key of value zero whose score is the sink)."""
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + head, mask=m_valid, other=0.0).to(tl.float32)  # [BLOCK_M]
        m_i = tl.where(m_valid, sink * LOG2E_C, NEG_BIG)  # log2 domain, as the scores
        l_i = tl.where(m_valid, 1.0, 0.0)
    else:
        m_i = tl.full([BLOCK_M], NEG_BIG, dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    return l_i, m_i


@triton.jit
def attend_range(
    acc,  # [BLOCK_M, HEAD_DIM_PAD] float32, unnormalized output
    l_i,  # [BLOCK_M] float32, running softmax denominator
    m_i,  # [BLOCK_M] float32, running max (log2 domain)
    q,  # [BLOCK_M, HEAD_DIM_PAD] query tile, already in DOT_DTYPE
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
    DOT_DTYPE: tl.constexpr,  # the dtype of the tiles given to tl.dot (see ``dot_dtype``)
    WINDOW: tl.constexpr = 0,  # > 0: a query at p sees keys (p - WINDOW, p] only (masked tiles)
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
        k = k.to(DOT_DTYPE)  # a no-op for a cache in the model's dtype; e4m3 values are exact in fp16
        v = v.to(DOT_DTYPE)
        s = tl.dot(q, tl.trans(k)) * qk_scale  # [BLOCK_M, BLOCK_N] float32
        if MASKED:
            visible = (k_pos[None, :] <= q_pos[:, None]) & k_valid[None, :]  # [BLOCK_M, BLOCK_N]
            if WINDOW > 0:
                visible = visible & (k_pos[None, :] > q_pos[:, None] - WINDOW)
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # [BLOCK_M], finite (m_i starts at NEG_BIG)
        alpha = tl.exp2(m_i - m_new)  # [BLOCK_M]
        p = tl.exp2(s - m_new[:, None])  # [BLOCK_M, BLOCK_N]
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v)  # [BLOCK_M, HEAD_DIM_PAD]
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def attend_keys(
    acc, l_i, m_i, q, q_pos,
    k_lo,  # first key position (multiple of BLOCK_N)
    full_lo,  # WINDOW > 0: keys [k_lo, full_lo) are masked (the window's trailing edge); else unused
    full_end,  # keys [k_lo or full_lo, full_end) are visible to every query: no masks
    k_hi,  # keys [max(full_lo, full_end), k_hi) are masked per query (the diagonal tiles)
    bt_ptr, k_base, v_base, stride_kb, stride_ks, stride_vb, stride_vs, qk_scale,
    BLOCK_N: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    WINDOW: tl.constexpr = 0,  # > 0: sliding-window attention (see ``attend_range``)
):
    # attend_range over the window's edge (masked), the unmasked tiles, then the diagonal (masked)
    full_start = k_lo
    diag_start = full_end
    if WINDOW > 0:
        acc, l_i, m_i = attend_range(
            acc, l_i, m_i, q, q_pos, k_lo, full_lo, bt_ptr, k_base, v_base,
            stride_kb, stride_ks, stride_vb, stride_vs, qk_scale,
            BLOCK_N, BLOCK_SIZE, HEAD_DIM, HEAD_DIM_PAD, True, DOT_DTYPE, WINDOW,
        )  # fmt: skip
        full_start = full_lo
        diag_start = tl.maximum(full_lo, full_end)
    acc, l_i, m_i = attend_range(
        acc, l_i, m_i, q, q_pos, full_start, full_end, bt_ptr, k_base, v_base,
        stride_kb, stride_ks, stride_vb, stride_vs, qk_scale,
        BLOCK_N, BLOCK_SIZE, HEAD_DIM, HEAD_DIM_PAD, False, DOT_DTYPE,
    )  # fmt: skip
    return attend_range(
        acc, l_i, m_i, q, q_pos, diag_start, k_hi, bt_ptr, k_base, v_base,
        stride_kb, stride_ks, stride_vb, stride_vs, qk_scale,
        BLOCK_N, BLOCK_SIZE, HEAD_DIM, HEAD_DIM_PAD, True, DOT_DTYPE, WINDOW,
    )  # fmt: skip


@triton.jit
def window_bounds(first_q, last_q, k_hi, BLOCK_N: tl.constexpr, WINDOW: tl.constexpr):
    """(k_lo, full_lo) for queries at positions [first_q, last_q] over a sliding window of WINDOW keys: tiles
    before k_lo are outside every query's window (skipped); keys [full_lo, ...) are inside every one's."""
    k_lo = (tl.maximum(first_q - WINDOW + 1, 0) // BLOCK_N) * BLOCK_N
    full_lo = tl.cdiv(tl.maximum(last_q - WINDOW + 1, 0), BLOCK_N) * BLOCK_N
    return k_lo, tl.minimum(tl.maximum(full_lo, k_lo), k_hi)


_TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def dot_dtype(query: torch.Tensor, cache: torch.Tensor) -> tl.dtype:
    """The dtype of the q, K, V and probability tiles given to ``tl.dot``.

    float32 on the CPU: the interpreter computes ``tl.dot`` on bf16/fp16 wrongly. A cache in the model's
    dtype: that dtype (no conversion). An FP8 cache: float16, since e4m3 -> f16 is one hardware conversion
    per two values (e4m3 -> bf16 is not, on Hopper) and every e4m3 value and softmax probability is as exact
    or more in fp16 than in bf16. The query is rounded to fp16 then: finite below 65,504, which a
    normed or RoPE'd query is far from.
    """
    if query.device.type == "cpu":
        return tl.float32
    if cache.dtype == query.dtype:
        return _TL_DTYPES[query.dtype]
    return tl.float16


def check_sinks(sinks: torch.Tensor | None, num_heads: int) -> None:
    """Sinks, where given, are one contiguous logit per query head."""
    if sinks is not None and (sinks.shape != (num_heads,) or sinks.stride(0) != 1):
        raise ValueError(f"sinks must be a contiguous [num_heads={num_heads}] tensor, got shape {tuple(sinks.shape)}")


def window_arg(sliding_window: int | None) -> int:
    """The kernels' ``WINDOW`` constexpr for a layer's ``sliding_window`` (None: 0, full attention)."""
    if sliding_window is None:
        return 0
    if sliding_window < 1:
        raise ValueError(f"sliding_window must be >= 1 or None, got {sliding_window}")
    return int(sliding_window)


def check_inputs(query, k_cache, v_cache, block_tables) -> tuple[int, int, int]:
    num_heads, head_dim = query.shape[1], query.shape[2]
    num_kv_heads = k_cache.shape[2]
    assert k_cache.shape == v_cache.shape and k_cache.shape[3] == head_dim
    assert num_heads % num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads"
    assert query.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    assert block_tables.stride(-1) == 1
    assert head_dim <= 256, "head_dim > 256 is not supported"
    return num_heads, num_kv_heads, head_dim
