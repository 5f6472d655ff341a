"""``x @ w.T (+ bias)`` for a few rows of ``x`` (decoding one to a few sequences), in Triton.

At M = 1 a linear layer is a stream over its weight matrix, and its speed is the fraction of
HBM bandwidth it reaches. cuBLAS's small-M kernels reach 50-75% on the 17-100 MB matrices of a
tensor-parallel 8B decode step (profile of 2026-11-22, H200) and some add a split-K reduce
kernel. This kernel gives each program ``BLOCK_N`` output columns, streams their weight rows
through a ``NUM_STAGES``-deep pipeline of ``[BLOCK_N, BLOCK_K]`` tiles into ``tl.dot`` (the rows
of ``x`` padded to 16) and writes the result directly: one kernel per linear layer.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from minivllm.kernels.pdl import pdl_options, pdl_wait

MAX_ROWS = 16  # the dot's M tile; more rows go to cuBLAS
# NOTE: measured faster than cuBLAS (2 x H200, 2026-11-22) from 8M-element weights up (the 8B layers,
# TP=1 and 2); smaller ones (Qwen3-0.6B's) stay on cuBLAS, unmeasured here
MIN_WEIGHT_NUMEL = 1 << 23
ENABLED = os.environ.get("MINIVLLM_GEMV", "1") != "0"  # NOTE: read once, at import
DTYPES = (torch.bfloat16, torch.float16)


@triton.jit
def _gemv_kernel(
    x_ptr,  # [M, K]
    w_ptr,  # [N, K]
    bias_ptr,  # [N] or a dummy
    out_ptr,  # [M, N]
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    HAS_BIAS: tl.constexpr,
    DOT_F32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_wait(USE_PDL)
    pid = tl.program_id(0)
    rm = tl.arange(0, BLOCK_M)  # [BLOCK_M]
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    rk = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    x_rows = x_ptr + rm[:, None] * stride_xm
    w_rows = w_ptr + rn[:, None].to(tl.int64) * stride_wn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        kk = k + rk
        x = tl.load(x_rows + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)  # [BM, BK]
        w = tl.load(w_rows + kk[None, :], mask=(rn[:, None] < N) & (kk[None, :] < K), other=0.0)  # [BN, BK]
        if DOT_F32:  # NOTE: the interpreter's bf16/fp16 dot is wrong; float32 tiles there
            x = x.to(tl.float32)
            w = w.to(tl.float32)
        acc += tl.dot(x, tl.trans(w))
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + rm[:, None] * stride_om + rn[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def gemv_config(n: int, k: int) -> tuple[int, int, int, int]:
    """``(BLOCK_N, BLOCK_K, NUM_STAGES, num_warps)`` for a ``[n, k]`` weight; ``MINIVLLM_GEMV_CFG`` overrides.

    NOTE: 32 columns a program keeps ~100-400 programs in flight for the 2k-12k output columns of
    an 8B layer split over 2 ranks; 4 stages of 256-wide tiles keep ~64 KB of loads in flight
    per program.
    """
    env = os.environ.get("MINIVLLM_GEMV_CFG")
    if env:
        bn, bk, st, w = (int(v) for v in env.split("x"))
        return bn, bk, st, w
    return 32, 256, 4, 4


def use_gemv(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether ``linear(x, w)`` takes this kernel: CUDA, bf16/fp16, at most ``MAX_ROWS`` rows, a weight of at
    least ``MIN_WEIGHT_NUMEL`` elements (``MINIVLLM_GEMV=0``: never)."""
    return (ENABLED and x.is_cuda and x.dim() == 2 and 0 < x.shape[0] <= MAX_ROWS and x.dtype in DTYPES
            and w.dtype == x.dtype and w.numel() >= MIN_WEIGHT_NUMEL)


def gemv(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
         config: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """``x @ w.T + bias`` for ``x`` [M <= 16, K], ``w`` [N, K] (rows contiguous): [M, N] in ``x``'s dtype."""
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"gemv needs x [M, K] and w [N, K], got {tuple(x.shape)} and {tuple(w.shape)}")
    if x.shape[0] > MAX_ROWS:
        raise ValueError(f"gemv takes at most {MAX_ROWS} rows, got {x.shape[0]}")
    if x.stride(1) != 1 or w.stride(1) != 1:
        raise ValueError("gemv needs rows with contiguous columns (stride 1 along K)")
    m, k = x.shape
    n = w.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    bn, bk, stages, warps = config or gemv_config(n, k)
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    _gemv_kernel[(triton.cdiv(n, bn),)](
        x, w, bias if bias is not None else out, out, m, n, k, x.stride(0), w.stride(0), out.stride(0),
        HAS_BIAS=bias is not None, DOT_F32=interpret and x.dtype != torch.float32, BLOCK_M=MAX_ROWS,
        BLOCK_N=bn, BLOCK_K=bk, NUM_STAGES=stages, num_warps=warps, **pdl_options(x))
    return out
