"""Split-KV decode attention for batches too small to fill the GPU, and the decode dispatcher.

Each (row, kv head) context is split into ``num_splits`` key ranges processed by separate
programs (partial max / sum / output in float32), then one reduce kernel merges them. The split
factor depends only on host ints, so a captured CUDA graph always replays the same kernels.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from minivllm.kernels.attention_tiles import (
    LOG2E,
    attend_keys,
    check_inputs,
    check_sinks,
    dot_dtype,
    softmax_init,
    window_arg,
)
from minivllm.kernels.paged_attention import paged_attention
from minivllm.kernels.pdl import pdl_options, pdl_wait


# NOTE: the block table's width changes from step to step; specialising on it (divisible by 16 or not)
# compiled a second kernel in users' first requests
@triton.jit(do_not_specialize=["stride_bt"])
def _split_kv_decode_kernel(
    m_part_ptr,  # [num_rows, num_heads, NUM_SPLITS] float32
    l_part_ptr,  # [num_rows, num_heads, NUM_SPLITS] float32
    acc_part_ptr,  # [num_rows, num_heads, NUM_SPLITS, HEAD_DIM_PAD] float32
    q_ptr,  # [num_rows, num_heads, head_dim]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    context_lens_ptr,  # [num_rows] int32
    block_tables_ptr,  # [num_rows, max_blocks] int32
    sinks_ptr,  # [num_heads] (read only if HAS_SINKS)
    qk_scale,
    stride_qt,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_bt,
    NUM_HEADS: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,  # max(16, next power of two >= GROUP)
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    USE_PDL: tl.constexpr,
    WINDOW: tl.constexpr = 0,  # > 0: the splits share the last WINDOW keys only; 0: the whole context
    HAS_SINKS: tl.constexpr = False,  # each head's sink logit joins its softmax denominator (in split 0 only)
):
    pdl_wait(USE_PDL)
    row = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(context_lens_ptr + row)
    # NOTE: split boundaries are multiples of BLOCK_N; trailing splits may be empty (they still
    # write m=NEG_BIG, l=0, acc=0 so the reduction never reads garbage).
    if WINDOW > 0:  # the splits cover the window's key tiles only
        lo = (tl.maximum(ctx - WINDOW, 0) // BLOCK_N) * BLOCK_N
        chunk = tl.cdiv(tl.cdiv(ctx - lo, NUM_SPLITS), BLOCK_N) * BLOCK_N
        k_lo = tl.minimum(lo + split * chunk, ctx)
    else:
        chunk = tl.cdiv(tl.cdiv(ctx, NUM_SPLITS), BLOCK_N) * BLOCK_N
        k_lo = tl.minimum(split * chunk, ctx)
    k_hi = tl.minimum(k_lo + chunk, ctx)
    full_end = k_lo + ((k_hi - k_lo) // BLOCK_N) * BLOCK_N
    full_lo = k_lo
    if WINDOW > 0:  # keys from ctx - WINDOW on are in the window: [k_lo, full_lo) needs the mask
        full_lo = tl.cdiv(tl.maximum(ctx - WINDOW, 0), BLOCK_N) * BLOCK_N
        full_lo = tl.minimum(tl.maximum(full_lo, k_lo), k_hi)

    offs_m = tl.arange(0, BLOCK_M)  # [BLOCK_M] query head within the group
    offs_d = tl.arange(0, HEAD_DIM_PAD)  # [HEAD_DIM_PAD]
    m_valid = offs_m < GROUP  # [BLOCK_M]
    head = kvh * GROUP + offs_m  # [BLOCK_M]
    d_mask = (offs_d < HEAD_DIM)[None, :]
    q_ptrs = q_ptr + row.to(tl.int64) * stride_qt + (head * stride_qh)[:, None] + offs_d[None, :]
    q = tl.load(q_ptrs, mask=m_valid[:, None] & d_mask, other=0.0)  # [BLOCK_M, HEAD_DIM_PAD]
    q = q.to(DOT_DTYPE)
    q_pos = tl.zeros([BLOCK_M], dtype=tl.int32) + ctx - 1  # [BLOCK_M]

    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    l_i, m_i = softmax_init(sinks_ptr, head, m_valid & (offs_m * 0 + split == 0), BLOCK_M, HAS_SINKS)
    bt_ptr = block_tables_ptr + row.to(tl.int64) * stride_bt
    k_base = k_cache_ptr + kvh * stride_kh
    v_base = v_cache_ptr + kvh * stride_vh
    acc, l_i, m_i = attend_keys(
        acc, l_i, m_i, q, q_pos, k_lo, full_lo, full_end, k_hi, bt_ptr, k_base, v_base,
        stride_kb, stride_ks, stride_vb, stride_vs, qk_scale,
        BLOCK_N, BLOCK_SIZE, HEAD_DIM, HEAD_DIM_PAD, DOT_DTYPE, WINDOW,
    )  # fmt: skip

    part = (row.to(tl.int64) * NUM_HEADS + head) * NUM_SPLITS + split  # [BLOCK_M]
    tl.store(m_part_ptr + part, m_i, mask=m_valid)
    tl.store(l_part_ptr + part, l_i, mask=m_valid)
    tl.store(acc_part_ptr + part[:, None] * HEAD_DIM_PAD + offs_d[None, :], acc, mask=m_valid[:, None])


@triton.jit
def _split_kv_reduce_kernel(
    out_ptr,  # [num_rows, num_heads, head_dim]
    m_part_ptr,  # [num_rows, num_heads, NUM_SPLITS] float32
    l_part_ptr,  # [num_rows, num_heads, NUM_SPLITS] float32
    acc_part_ptr,  # [num_rows, num_heads, NUM_SPLITS, HEAD_DIM_PAD] float32
    v_scale,
    stride_ot,
    stride_oh,
    NUM_HEADS: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_wait(USE_PDL)
    row = tl.program_id(0)
    head = tl.program_id(1)
    offs_s = tl.arange(0, SPLITS_PAD)  # [SPLITS_PAD]
    offs_d = tl.arange(0, HEAD_DIM_PAD)  # [HEAD_DIM_PAD]
    s_valid = offs_s < NUM_SPLITS
    base = (row.to(tl.int64) * NUM_HEADS + head) * NUM_SPLITS
    m = tl.load(m_part_ptr + base + offs_s, mask=s_valid, other=float("-inf"))  # [SPLITS_PAD]
    lse = tl.load(l_part_ptr + base + offs_s, mask=s_valid, other=0.0)  # [SPLITS_PAD] softmax sums
    acc_ptrs = acc_part_ptr + (base + offs_s)[:, None] * HEAD_DIM_PAD + offs_d[None, :]
    acc = tl.load(acc_ptrs, mask=s_valid[:, None], other=0.0)  # [SPLITS_PAD, HEAD_DIM_PAD]
    w = tl.exp2(m - tl.max(m, 0))  # [SPLITS_PAD], padded splits -> 0
    denom = tl.sum(w * lse, 0)
    denom = tl.where(denom > 0.0, denom, 1.0)  # rows with context 0 (graph padding) -> output 0
    o = tl.sum(w[:, None] * acc, 0) / denom * v_scale  # [HEAD_DIM_PAD]
    o_ptrs = out_ptr + row.to(tl.int64) * stride_ot + head * stride_oh + offs_d
    tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=offs_d < HEAD_DIM)


# ----------------------------------------------------------------------------- host side


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (a nominal 132 on CPU, so heuristics are testable)."""
    if device.type != "cuda":
        return 132
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


_MIN_KEYS_PER_SPLIT = 64  # one BLOCK_N tile
_MAX_SPLITS = 32
_PROGRAMS_PER_SM = 4  # tuned on H200 (benchmarks/kernels/decode_attention.py --cuda-graph --sweep-splits)


def choose_num_splits(num_rows: int, num_kv_heads: int, max_context_len: int, sm_count: int) -> int:
    """Split-KV factor for a decode batch, from host ints only (CUDA-graph safe).

    One (row, kv head) program streams a whole context, so small batches leave most SMs idle.
    Split each context so that about ``_PROGRAMS_PER_SM * sm_count`` programs run, with at
    least ``_MIN_KEYS_PER_SPLIT`` keys per split; 1 means "use the unified kernel".
    """
    programs = max(1, num_rows * num_kv_heads)
    by_occupancy = _PROGRAMS_PER_SM * sm_count // programs
    by_length = max_context_len // _MIN_KEYS_PER_SPLIT
    return max(1, min(by_occupancy, by_length, _MAX_SPLITS))


def paged_decode_split_kv(
    query: torch.Tensor,  # [num_rows, num_heads, head_dim], one query token per row
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    context_lens: torch.Tensor,  # [num_rows] int32
    block_tables: torch.Tensor,  # [num_rows, max_blocks] int32
    scale: float,
    max_context_len: int,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,  # [num_rows, num_heads, head_dim]
    v_scale: float = 1.0,
    sliding_window: int | None = None,
    sinks: torch.Tensor | None = None,  # [num_heads]
    *,
    block_n: int | None = None,
) -> torch.Tensor:
    """Flash-decoding: each row's keys are split over ``num_splits`` programs, then reduced.

    Partial (max, sum, acc) go to float32 scratch of shape fixed by (num_rows, num_splits), so
    the two launches are CUDA-graph safe. ``num_splits=None`` picks it with
    :func:`choose_num_splits`. Rows with context 0 (graph padding) produce zeros. With a
    ``sliding_window`` the splits share the key tiles of the last ``sliding_window`` positions. ``sinks``: one
    logit per query head in its softmax denominator (the first split counts it, the reduction carries it).
    """
    num_heads, num_kv_heads, head_dim = check_inputs(query, k_cache, v_cache, block_tables)
    check_sinks(sinks, num_heads)
    num_rows = context_lens.shape[0]
    assert query.shape[0] >= num_rows
    group = num_heads // num_kv_heads
    window = window_arg(sliding_window)
    if num_splits is None:
        num_splits = choose_num_splits(num_rows, num_kv_heads, _keys_read(max_context_len, window),
                                       num_sms(query.device))
    if out is None:
        out = torch.empty_like(query)
    assert out.stride(-1) == 1 and out.shape == query.shape
    if num_rows == 0:
        return out
    d_pad = max(16, triton.next_power_of_2(head_dim))
    m_part = torch.empty(num_rows, num_heads, num_splits, dtype=torch.float32, device=query.device)
    l_part = torch.empty_like(m_part)
    acc_part = torch.empty(num_rows, num_heads, num_splits, d_pad, dtype=torch.float32, device=query.device)
    bn = block_n or (64 if head_dim <= 128 else 32)
    _split_kv_decode_kernel[(num_rows, num_kv_heads, num_splits)](
        m_part, l_part, acc_part, query, k_cache, v_cache, context_lens, block_tables,
        query if sinks is None else sinks, scale * LOG2E,
        query.stride(0), query.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        NUM_HEADS=num_heads, NUM_SPLITS=num_splits, GROUP=group,
        BLOCK_M=max(16, triton.next_power_of_2(group)), BLOCK_N=bn, BLOCK_SIZE=k_cache.shape[1],
        HEAD_DIM=head_dim, HEAD_DIM_PAD=d_pad, DOT_DTYPE=dot_dtype(query, k_cache), WINDOW=window,
        HAS_SINKS=sinks is not None, num_warps=4, num_stages=2, **pdl_options(query),
    )  # fmt: skip
    _split_kv_reduce_kernel[(num_rows, num_heads)](
        out, m_part, l_part, acc_part, v_scale, out.stride(0), out.stride(1),
        NUM_HEADS=num_heads, NUM_SPLITS=num_splits, SPLITS_PAD=triton.next_power_of_2(num_splits),
        HEAD_DIM=head_dim, HEAD_DIM_PAD=d_pad,
        num_warps=1 if d_pad * num_splits <= 1024 else 4, **pdl_options(query),
    )  # fmt: skip
    return out


def paged_decode(
    query: torch.Tensor,  # [num_rows, num_heads, head_dim], one query token per row
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    context_lens: torch.Tensor,  # [num_rows] int32
    block_tables: torch.Tensor,  # [num_rows, max_blocks] int32
    scale: float,
    max_context_len: int,
    out: torch.Tensor | None = None,
    v_scale: float = 1.0,
    sliding_window: int | None = None,
    sinks: torch.Tensor | None = None,  # [num_heads]
) -> torch.Tensor:
    """Decode attention: split-KV when the batch cannot fill the GPU, else the unified kernel.

    The choice depends only on (num_rows, num_kv_heads, max_context_len, sliding_window, SM count),
    so a captured CUDA graph always replays the same kernels. When capturing, pass the largest
    context the graph will serve as ``max_context_len`` (correctness does not depend on it).
    """
    num_splits = choose_num_splits(
        context_lens.shape[0], k_cache.shape[2], _keys_read(max_context_len, window_arg(sliding_window)),
        num_sms(query.device),
    )
    if num_splits > 1:
        return paged_decode_split_kv(
            query, k_cache, v_cache, context_lens, block_tables, scale, max_context_len, num_splits, out, v_scale,
            sliding_window, sinks,
        )
    return paged_attention(
        query, k_cache, v_cache, None, context_lens, block_tables, scale, 1, max_context_len, out, v_scale,
        sliding_window, sinks,
    )


def _keys_read(max_context_len: int, window: int) -> int:
    """The most keys one decode row reads: its context, or its window (``window`` > 0) when shorter."""
    return min(max_context_len, window) if window else max_context_len
