"""Triton paged attention: one unified kernel for decode rows + prefill chunks (split-KV decode: ``paged_decode``).

Semantics match ``minivllm.kernels.torch_backend.paged_attention_ref``: row ``b`` has
``q_len = cu_seqlens_q[b+1] - cu_seqlens_q[b]`` new queries; query ``i`` sits at absolute
position ``context_lens[b] - q_len + i`` and attends keys ``0..position`` (causal), read from
the paged cache through ``block_tables[b]``; with a sliding window ``W`` only keys
``position - W + 1..position``.

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
- A sliding window (the ``WINDOW`` constexpr; 0 = full attention, whose window branches compile away
  but for an empty masked loop) starts each program's key loop at the tile holding its first query's
  oldest key, and masks the tiles at the window's trailing edge as the diagonal ones are masked.
- Attention sinks (gpt-oss; the ``HAS_SINKS`` constexpr, compiled away without them): each head's sink logit
  starts the online softmax as a key of value zero, so it joins the denominator and nothing else.
- Grids depend only on host ints and tensor shapes (no ``.item()``), so the decode paths can
  be captured in CUDA graphs; programs past a row's length exit early.
"""

from __future__ import annotations

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
    window_bounds,
)
from minivllm.kernels.pdl import pdl_options, pdl_wait


# NOTE: the block table's width changes from step to step; specialising on it (divisible by 16 or not)
# compiled a second kernel in users' first requests
@triton.jit(do_not_specialize=["stride_bt"])
def _paged_attention_kernel(
    out_ptr,  # [num_tokens, num_heads, head_dim]
    q_ptr,  # [num_tokens, num_heads, head_dim]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    cu_seqlens_q_ptr,  # [num_rows + 1] int32 (unused if IS_DECODE)
    context_lens_ptr,  # [num_rows] int32
    block_tables_ptr,  # [num_rows, max_blocks] int32
    sinks_ptr,  # [num_heads] (read only if HAS_SINKS)
    qk_scale,
    v_scale,
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
    DOT_DTYPE: tl.constexpr,
    USE_PDL: tl.constexpr,
    WINDOW: tl.constexpr = 0,  # > 0: sliding window of WINDOW keys (tiles before it skipped); 0: full
    HAS_SINKS: tl.constexpr = False,  # each head's sink logit joins its softmax denominator
):
    pdl_wait(USE_PDL)
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
    # the grid is sized by max_seqlen_q, and CUDA-graph padding rows have q_len 0.
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
    q = q.to(DOT_DTYPE)

    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    l_i, m_i = softmax_init(sinks_ptr, head, m_valid, BLOCK_M, HAS_SINKS)
    bt_ptr = block_tables_ptr + row.to(tl.int64) * stride_bt
    k_base = k_cache_ptr + kvh * stride_kh
    v_base = v_cache_ptr + kvh * stride_vh
    # Keys [0, full_end) are visible to every query of the tile: no masks there.
    last_tok = tl.minimum(tile_start + BLOCK_Q, q_len) - 1
    k_hi = ctx - q_len + last_tok + 1  # keys needed by the tile's last query
    full_end = ((ctx - q_len + tile_start + 1) // BLOCK_N) * BLOCK_N
    k_lo = 0
    full_lo = 0
    if WINDOW > 0:
        k_lo, full_lo = window_bounds(ctx - q_len + tile_start, k_hi - 1, k_hi, BLOCK_N, WINDOW)
    acc, l_i, m_i = attend_keys(
        acc, l_i, m_i, q, q_pos, k_lo, full_lo, full_end, k_hi, bt_ptr, k_base, v_base,
        stride_kb, stride_ks, stride_vb, stride_vs, qk_scale,
        BLOCK_N, BLOCK_SIZE, HEAD_DIM, HEAD_DIM_PAD, DOT_DTYPE, WINDOW,
    )  # fmt: skip
    l_i = tl.where(l_i > 0.0, l_i, 1.0)
    o = acc / l_i[:, None] * v_scale  # [BLOCK_M, HEAD_DIM_PAD]
    o_ptrs = out_ptr + (tok64 * stride_ot + head * stride_oh)[:, None] + offs_d[None, :]
    tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=m_valid[:, None] & d_mask)


# ----------------------------------------------------------------------------- host side


def _tile_config(group: int, head_dim: int, max_seqlen_q: int, kv_bytes: int = 2) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for the unified kernel (tuned on H200, d=128).

    Decoding over an FP8 cache (``kv_bytes`` 1) takes key tiles twice as long: the same bytes per tile, and
    fewer loop steps (``benchmarks/kernels/decode_attention.py --kv-dtype fp8 --configs``)."""
    g_pad = triton.next_power_of_2(group)
    block_n = 64 if head_dim <= 128 else 32
    if max_seqlen_q <= 1:  # decode: one token per row, M = the GQA group padded to >= 16
        return max(16, g_pad), block_n * (2 if kv_bytes == 1 else 1), 4, 2
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
    v_scale: float = 1.0,
    sliding_window: int | None = None,
    sinks: torch.Tensor | None = None,  # [num_heads]
    *,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """Causal paged attention for a ragged batch of decode rows and prefill chunks (one launch).

    The grid is ``(num_rows, cdiv(max_seqlen_q, BLOCK_Q), num_kv_heads)``, computed from host
    ints only. ``max_context_len`` is a tuning hint and is not needed for correctness (loops use
    each row's device ``context_lens``). Rows with ``q_len == 0`` leave ``out`` untouched.
    An FP8 cache holds ``K / k_scale`` and ``V / v_scale``: give ``scale * k_scale`` as ``scale``, and ``v_scale``.
    ``sliding_window``: a query at position p attends to keys (p - sliding_window, p]; key tiles wholly before
    a program's window are not read. ``sinks``: one logit per query head added to its softmax denominator.
    ``block_m``/``block_n``/``num_warps``/``num_stages`` override the tile configuration (tests, benchmarks).
    """
    num_heads, num_kv_heads, head_dim = check_inputs(query, k_cache, v_cache, block_tables)
    check_sinks(sinks, num_heads)
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
    bm, bn, warps, stages = _tile_config(group, head_dim, max_seqlen_q, k_cache.element_size())
    warps, stages = num_warps or warps, num_stages or stages
    bm = max(block_m or bm, g_pad, 16)
    bn = max(block_n or bn, 16)
    grid = (num_rows, triton.cdiv(max_seqlen_q, bm // g_pad), num_kv_heads)
    _paged_attention_kernel[grid](
        out, query, k_cache, v_cache,
        context_lens if is_decode else cu_seqlens_q, context_lens, block_tables, query if sinks is None else sinks,
        scale * LOG2E, v_scale,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        GROUP=group, G_PAD=g_pad, BLOCK_M=bm, BLOCK_N=bn, BLOCK_SIZE=k_cache.shape[1],
        HEAD_DIM=head_dim, HEAD_DIM_PAD=max(16, triton.next_power_of_2(head_dim)),
        IS_DECODE=is_decode, DOT_DTYPE=dot_dtype(query, k_cache), WINDOW=window_arg(sliding_window),
        HAS_SINKS=sinks is not None, num_warps=warps, num_stages=stages, **pdl_options(query),
    )  # fmt: skip
    return out
