"""Merging split-KV decode partials: the softmax-weighted sum of each head's ``NUM_SPLITS`` (max, sum, acc).

Two ways, same result up to float32 summation order: ``_merge_partials``, called by the decode kernel's last
program of a (row, kv head) (an atomic counter per pair, from :func:`split_counts`, says which one is
last), or ``_split_kv_reduce_kernel``, a second launch. ``MINIVLLM_SPLIT_KV_LAST_REDUCES=0`` picks the latter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.kernels.attention_tiles import NEG_BIG
from minivllm.kernels.pdl import pdl_wait
from minivllm.utils.env import env_switch

_COUNTS: dict[torch.device, torch.Tensor] = {}
_MIN_COUNTS = 1 << 14


def split_counts(device: torch.device, n: int) -> torch.Tensor | None:
    """The zeroed int32 counters of at least ``n`` (row, kv head) pairs on ``device`` for the in-kernel merge,
    or None: ``MINIVLLM_SPLIT_KV_LAST_REDUCES=0``, or more are needed during a CUDA graph capture.

    NOTE: one buffer per device, shared by every layer and graph: each merge sets its counter back to 0,
    and kernels on one stream never overlap. It is allocated (zeroed) outside captures only: the engine
    runs every graph's batch eagerly before capturing it, so the capture finds it allocated.
    """
    if not env_switch("MINIVLLM_SPLIT_KV_LAST_REDUCES", True):
        return None
    buf = _COUNTS.get(device)
    if buf is None or buf.numel() < n:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        buf = _COUNTS[device] = torch.zeros(max(n, _MIN_COUNTS), dtype=torch.int32, device=device)
    return buf


@triton.jit
def _merge_partials(out_row, head, m_valid, first, m_part_ptr, l_part_ptr, acc_part_ptr, stride_oh,
                    NUM_SPLITS: tl.constexpr, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr,
                    HEAD_DIM_PAD: tl.constexpr):
    """Softmax-merge the NUM_SPLITS partials of the heads ``head`` [BLOCK_M] (``first``: their split 0) into
    the output. Loads skip L1 (``.cg``): other programs wrote the partials."""
    offs_d = tl.arange(0, HEAD_DIM_PAD)  # [HEAD_DIM_PAD]
    m_max = tl.full([BLOCK_M], NEG_BIG, dtype=tl.float32)
    for s in tl.static_range(NUM_SPLITS):
        m_max = tl.maximum(m_max, tl.load(m_part_ptr + first + s, mask=m_valid, other=NEG_BIG, cache_modifier=".cg"))
    denom = tl.zeros([BLOCK_M], dtype=tl.float32)
    o = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    for s in tl.static_range(NUM_SPLITS):
        w = tl.exp2(tl.load(m_part_ptr + first + s, mask=m_valid, other=NEG_BIG, cache_modifier=".cg") - m_max)
        denom += w * tl.load(l_part_ptr + first + s, mask=m_valid, other=0.0, cache_modifier=".cg")
        acc_ptrs = acc_part_ptr + (first + s)[:, None] * HEAD_DIM_PAD + offs_d[None, :]
        o += w[:, None] * tl.load(acc_ptrs, mask=m_valid[:, None], other=0.0, cache_modifier=".cg")
    denom = tl.where(denom > 0.0, denom, 1.0)  # rows with context 0 (graph padding) -> output 0
    o = o / denom[:, None]  # [BLOCK_M, HEAD_DIM_PAD]
    o_ptrs = out_row + (head * stride_oh)[:, None] + offs_d[None, :]
    tl.store(o_ptrs, o.to(out_row.dtype.element_ty), mask=m_valid[:, None] & (offs_d < HEAD_DIM)[None, :])


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
    o = tl.sum(w[:, None] * acc, 0) / denom  # [HEAD_DIM_PAD]
    o_ptrs = out_ptr + row.to(tl.int64) * stride_ot + head * stride_oh + offs_d
    tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=offs_d < HEAD_DIM)
