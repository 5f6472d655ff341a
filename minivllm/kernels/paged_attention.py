"""Triton paged attention: one unified kernel for decode rows + prefill chunks, and split-KV decode.

Semantics match ``minivllm.kernels.reference.paged_attention_ref``: row ``b`` has
``q_len = cu_seqlens_q[b+1] - cu_seqlens_q[b]`` new queries; query ``i`` sits at absolute
position ``context_lens[b] - q_len + i`` and attends keys ``0..position`` (causal), read from
the paged cache through ``block_tables[b]``.

Design:
- The query heads of one kv head (a GQA group, padded to a power of two ``G_PAD``) are packed
  into the M dimension of ``tl.dot`` together with ``BLOCK_Q`` query tokens:
  ``m -> (token = m // G_PAD, head = m % G_PAD)``, ``BLOCK_M = BLOCK_Q * G_PAD >= 16``. Each
  K/V tile is loaded once per kv head and reused by all heads of the group (decode too).
- Key tiles of ``BLOCK_N`` tokens are gathered per token: physical block
  ``block_tables[row, pos // block_size]``, offset ``pos % block_size``, so any BLOCK_N works
  with any block size.
- Online softmax in float32 with exp2 and log2(e)-prescaled scores. Keys visible to every
  query of a tile are processed without masks; only the last (diagonal) tiles are masked.
- Grids depend only on host ints and tensor shapes (no ``.item()``), so the decode paths can
  be captured in CUDA graphs; programs past a row's length exit early.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

_LOG2E = 1.4426950408889634
# NOTE: finite "-inf" for the running max, so fully masked rows give 0 instead of NaN.
_NEG_BIG = tl.constexpr(-1.0e30)


@triton.jit
def _attend_range(
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
        s = tl.dot(q, tl.trans(k)) * qk_scale  # [BLOCK_M, BLOCK_N] float32
        if MASKED:
            visible = (k_pos[None, :] <= q_pos[:, None]) & k_valid[None, :]  # [BLOCK_M, BLOCK_N]
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # [BLOCK_M], finite (m_i starts at _NEG_BIG)
        alpha = tl.exp2(m_i - m_new)  # [BLOCK_M]
        p = tl.exp2(s - m_new[:, None])  # [BLOCK_M, BLOCK_N]
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)  # [BLOCK_M, HEAD_DIM_PAD]
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _paged_attention_kernel(
    out_ptr,  # [num_tokens, num_heads, head_dim]
    q_ptr,  # [num_tokens, num_heads, head_dim]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    cu_seqlens_q_ptr,  # [num_rows + 1] int32 (unused if IS_DECODE)
    context_lens_ptr,  # [num_rows] int32
    block_tables_ptr,  # [num_rows, max_blocks] int32
    qk_scale,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_bt,
    GROUP: tl.constexpr,  # query heads per kv head
    G_PAD: tl.constexpr,  # next power of two >= GROUP
    BLOCK_M: tl.constexpr,  # BLOCK_Q * G_PAD
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    IS_DECODE: tl.constexpr,  # one query per row, token index == row (cu_seqlens_q not read)
    DOT_F32: tl.constexpr,
):
    BLOCK_Q: tl.constexpr = BLOCK_M // G_PAD
    row = tl.program_id(0)
    q_tile = tl.program_id(1)
    kvh = tl.program_id(2)
    if IS_DECODE:
        q_start = row
        q_len = 1
    else:
        q_start = tl.load(cu_seqlens_q_ptr + row)
        q_len = tl.load(cu_seqlens_q_ptr + row + 1) - q_start
    ctx = tl.load(context_lens_ptr + row)
    tile_start = q_tile * BLOCK_Q  # first query token (within the row) of this program
    # NOTE: the grid is sized by max_seqlen_q, and CUDA-graph padding rows have q_len 0.
    if (tile_start >= q_len) | (ctx <= 0):
        return

    offs_m = tl.arange(0, BLOCK_M)  # [BLOCK_M]
    offs_d = tl.arange(0, HEAD_DIM_PAD)  # [HEAD_DIM_PAD]
    q_tok = tile_start + offs_m // G_PAD  # [BLOCK_M] token within the row
    head = kvh * GROUP + offs_m % G_PAD  # [BLOCK_M] query head
    m_valid = (q_tok < q_len) & (offs_m % G_PAD < GROUP)  # [BLOCK_M]
    q_pos = ctx - q_len + q_tok  # [BLOCK_M] absolute position
    tok64 = (q_start + q_tok).to(tl.int64)  # [BLOCK_M]
    d_mask = (offs_d < HEAD_DIM)[None, :]  # [1, HEAD_DIM_PAD]
    q_ptrs = q_ptr + (tok64 * stride_qt + head * stride_qh)[:, None] + offs_d[None, :]  # [BLOCK_M, D]
    q = tl.load(q_ptrs, mask=m_valid[:, None] & d_mask, other=0.0)  # [BLOCK_M, HEAD_DIM_PAD]
    if DOT_F32:
        q = q.to(tl.float32)

    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], _NEG_BIG, dtype=tl.float32)
    bt_ptr = block_tables_ptr + row.to(tl.int64) * stride_bt
    k_base = k_cache_ptr + kvh * stride_kh
    v_base = v_cache_ptr + kvh * stride_vh
    # Keys [0, full_end) are visible to every query of the tile: no masks there.
    last_tok = tl.minimum(tile_start + BLOCK_Q, q_len) - 1
    k_hi = ctx - q_len + last_tok + 1  # keys needed by the tile's last query
    full_end = ((ctx - q_len + tile_start + 1) // BLOCK_N) * BLOCK_N
    acc, l_i, m_i = _attend_range(
        acc, l_i, m_i, q, q_pos, 0, full_end, bt_ptr, k_base, v_base,
        stride_kb, stride_ks, stride_vb, stride_vs, qk_scale,
        BLOCK_N, BLOCK_SIZE, HEAD_DIM, HEAD_DIM_PAD, False, DOT_F32,
    )  # fmt: skip
    acc, l_i, m_i = _attend_range(
        acc, l_i, m_i, q, q_pos, full_end, k_hi, bt_ptr, k_base, v_base,
        stride_kb, stride_ks, stride_vb, stride_vs, qk_scale,
        BLOCK_N, BLOCK_SIZE, HEAD_DIM, HEAD_DIM_PAD, True, DOT_F32,
    )  # fmt: skip
    l_i = tl.where(l_i > 0.0, l_i, 1.0)
    o = acc / l_i[:, None]  # [BLOCK_M, HEAD_DIM_PAD]
    o_ptrs = out_ptr + (tok64 * stride_ot + head * stride_oh)[:, None] + offs_d[None, :]
    tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=m_valid[:, None] & d_mask)


@triton.jit
def _split_kv_decode_kernel(
    m_part_ptr,  # [num_rows, num_heads, NUM_SPLITS] float32
    l_part_ptr,  # [num_rows, num_heads, NUM_SPLITS] float32
    acc_part_ptr,  # [num_rows, num_heads, NUM_SPLITS, HEAD_DIM_PAD] float32
    q_ptr,  # [num_rows, num_heads, head_dim]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    context_lens_ptr,  # [num_rows] int32
    block_tables_ptr,  # [num_rows, max_blocks] int32
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
    DOT_F32: tl.constexpr,
):
    row = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(context_lens_ptr + row)
    # NOTE: split boundaries are multiples of BLOCK_N; trailing splits may be empty (they still
    # write m=_NEG_BIG, l=0, acc=0 so the reduction never reads garbage).
    chunk = tl.cdiv(tl.cdiv(ctx, NUM_SPLITS), BLOCK_N) * BLOCK_N
    k_lo = tl.minimum(split * chunk, ctx)
    k_hi = tl.minimum(k_lo + chunk, ctx)
    full_end = k_lo + ((k_hi - k_lo) // BLOCK_N) * BLOCK_N

    offs_m = tl.arange(0, BLOCK_M)  # [BLOCK_M] query head within the group
    offs_d = tl.arange(0, HEAD_DIM_PAD)  # [HEAD_DIM_PAD]
    m_valid = offs_m < GROUP  # [BLOCK_M]
    head = kvh * GROUP + offs_m  # [BLOCK_M]
    d_mask = (offs_d < HEAD_DIM)[None, :]
    q_ptrs = q_ptr + row.to(tl.int64) * stride_qt + (head * stride_qh)[:, None] + offs_d[None, :]
    q = tl.load(q_ptrs, mask=m_valid[:, None] & d_mask, other=0.0)  # [BLOCK_M, HEAD_DIM_PAD]
    if DOT_F32:
        q = q.to(tl.float32)
    q_pos = tl.zeros([BLOCK_M], dtype=tl.int32) + ctx - 1  # [BLOCK_M]

    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], _NEG_BIG, dtype=tl.float32)
    bt_ptr = block_tables_ptr + row.to(tl.int64) * stride_bt
    k_base = k_cache_ptr + kvh * stride_kh
    v_base = v_cache_ptr + kvh * stride_vh
    acc, l_i, m_i = _attend_range(
        acc, l_i, m_i, q, q_pos, k_lo, full_end, bt_ptr, k_base, v_base,
        stride_kb, stride_ks, stride_vb, stride_vs, qk_scale,
        BLOCK_N, BLOCK_SIZE, HEAD_DIM, HEAD_DIM_PAD, False, DOT_F32,
    )  # fmt: skip
    acc, l_i, m_i = _attend_range(
        acc, l_i, m_i, q, q_pos, full_end, k_hi, bt_ptr, k_base, v_base,
        stride_kb, stride_ks, stride_vb, stride_vs, qk_scale,
        BLOCK_N, BLOCK_SIZE, HEAD_DIM, HEAD_DIM_PAD, True, DOT_F32,
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
    stride_ot,
    stride_oh,
    NUM_HEADS: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
):
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
    o = tl.sum(w[:, None] * acc, 0) / denom  # [HEAD_DIM_PAD]
    o_ptrs = out_ptr + row.to(tl.int64) * stride_ot + head * stride_oh + offs_d
    tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=offs_d < HEAD_DIM)


# ----------------------------------------------------------------------------- host side


def _dot_f32(t: torch.Tensor) -> bool:
    """The interpreter computes tl.dot on bf16/fp16 wrongly: upcast tiles to float32 there."""
    return os.environ.get("TRITON_INTERPRET") == "1" or t.device.type == "cpu"


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
_PROGRAMS_PER_SM = 4  # tuned on H200 (bench_kernels.py --cuda-graph --sweep-splits)


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


def _check(query, k_cache, v_cache, block_tables) -> tuple[int, int, int]:
    num_heads, head_dim = query.shape[1], query.shape[2]
    num_kv_heads = k_cache.shape[2]
    assert k_cache.shape == v_cache.shape and k_cache.shape[3] == head_dim
    assert num_heads % num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads"
    assert query.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    assert block_tables.stride(-1) == 1
    assert head_dim <= 256, "head_dim > 256 is not supported"
    return num_heads, num_kv_heads, head_dim


def _tile_config(group: int, head_dim: int, max_seqlen_q: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for the unified kernel (tuned on H200, d=128)."""
    g_pad = triton.next_power_of_2(group)
    block_n = 64 if head_dim <= 128 else 32
    if max_seqlen_q <= 1:  # decode: one token per row, M = the GQA group padded to >= 16
        return max(16, g_pad), block_n, 4, 2
    return max(64, g_pad), block_n, 4, 2


def paged_attention(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    cu_seqlens_q: torch.Tensor | None,  # [num_rows + 1] int32 (None: decode, row b = token b)
    context_lens: torch.Tensor,  # [num_rows] int32
    block_tables: torch.Tensor,  # [num_rows, max_blocks] int32
    scale: float,
    max_seqlen_q: int,
    max_context_len: int,
    out: torch.Tensor | None = None,  # [num_tokens, num_heads, head_dim]
    *,
    block_m: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """Causal paged attention for a ragged batch of decode rows and prefill chunks (one launch).

    The grid is ``(num_rows, cdiv(max_seqlen_q, BLOCK_Q), num_kv_heads)``, computed from host
    ints only. ``max_context_len`` is a tuning hint and is not needed for correctness (loops use
    each row's device ``context_lens``). Rows with ``q_len == 0`` leave ``out`` untouched.
    ``block_m``/``block_n`` override the tile sizes (tests).
    """
    num_heads, num_kv_heads, head_dim = _check(query, k_cache, v_cache, block_tables)
    group = num_heads // num_kv_heads
    g_pad = triton.next_power_of_2(group)
    num_rows = context_lens.shape[0]
    is_decode = cu_seqlens_q is None
    if is_decode:
        max_seqlen_q = 1
    if out is None:
        out = torch.empty_like(query)
    assert out.stride(-1) == 1 and out.shape == query.shape
    if num_rows == 0 or max_seqlen_q <= 0:
        return out
    bm, bn, warps, stages = _tile_config(group, head_dim, max_seqlen_q)
    bm = max(block_m or bm, g_pad, 16)
    bn = max(block_n or bn, 16)
    grid = (num_rows, triton.cdiv(max_seqlen_q, bm // g_pad), num_kv_heads)
    _paged_attention_kernel[grid](
        out, query, k_cache, v_cache,
        context_lens if is_decode else cu_seqlens_q, context_lens, block_tables,
        scale * _LOG2E,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        GROUP=group, G_PAD=g_pad, BLOCK_M=bm, BLOCK_N=bn, BLOCK_SIZE=k_cache.shape[1],
        HEAD_DIM=head_dim, HEAD_DIM_PAD=max(16, triton.next_power_of_2(head_dim)),
        IS_DECODE=is_decode, DOT_F32=_dot_f32(query),
        num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out


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
    *,
    block_n: int | None = None,
) -> torch.Tensor:
    """Flash-decoding: each row's keys are split over ``num_splits`` programs, then reduced.

    Partial (max, sum, acc) go to float32 scratch of shape fixed by (num_rows, num_splits), so
    the two launches are CUDA-graph safe. ``num_splits=None`` picks it with
    :func:`choose_num_splits`. Rows with context 0 (graph padding) produce zeros.
    """
    num_heads, num_kv_heads, head_dim = _check(query, k_cache, v_cache, block_tables)
    num_rows = context_lens.shape[0]
    assert query.shape[0] >= num_rows
    group = num_heads // num_kv_heads
    if num_splits is None:
        num_splits = choose_num_splits(num_rows, num_kv_heads, max_context_len, num_sms(query.device))
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
        scale * _LOG2E,
        query.stride(0), query.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        NUM_HEADS=num_heads, NUM_SPLITS=num_splits, GROUP=group,
        BLOCK_M=max(16, triton.next_power_of_2(group)), BLOCK_N=bn, BLOCK_SIZE=k_cache.shape[1],
        HEAD_DIM=head_dim, HEAD_DIM_PAD=d_pad, DOT_F32=_dot_f32(query),
        num_warps=4, num_stages=2,
    )  # fmt: skip
    _split_kv_reduce_kernel[(num_rows, num_heads)](
        out, m_part, l_part, acc_part, out.stride(0), out.stride(1),
        NUM_HEADS=num_heads, NUM_SPLITS=num_splits, SPLITS_PAD=triton.next_power_of_2(num_splits),
        HEAD_DIM=head_dim, HEAD_DIM_PAD=d_pad,
        num_warps=1 if d_pad * num_splits <= 1024 else 4,
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
) -> torch.Tensor:
    """Decode attention: split-KV when the batch cannot fill the GPU, else the unified kernel.

    The choice depends only on (num_rows, num_kv_heads, max_context_len, SM count), so a
    captured CUDA graph always replays the same kernels. NOTE: when capturing, pass the largest
    context the graph will serve as ``max_context_len`` (correctness does not depend on it).
    """
    num_splits = choose_num_splits(
        context_lens.shape[0], k_cache.shape[2], max_context_len, num_sms(query.device)
    )
    if num_splits > 1:
        return paged_decode_split_kv(
            query, k_cache, v_cache, context_lens, block_tables, scale, max_context_len, num_splits, out
        )
    return paged_attention(
        query, k_cache, v_cache, None, context_lens, block_tables, scale, 1, max_context_len, out
    )


__all__ = [
    "choose_num_splits",
    "num_sms",
    "paged_attention",
    "paged_decode",
    "paged_decode_split_kv",
]
