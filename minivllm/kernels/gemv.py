"""``x @ w.T (+ bias)`` for a few rows of ``x`` (decoding up to a few hundred sequences), in Triton.

With few rows a linear layer is a stream over its weight matrix (each weight element meets fewer
rows than the GPU's FLOP-to-byte ratio), and its speed is the fraction of HBM bandwidth it reaches.
cuBLAS's small-M kernels leave part of that bandwidth unused on the weights of a tensor-parallel 8B
decode step, and some add a split-K reduce kernel (docs/performance-notes.md; ``PYTHONPATH=. python
benchmarks/kernels/gemv.py --rows 1 16`` prints both kernels' TB/s). This kernel gives each program
``BLOCK_N`` output columns and all the rows (up to ``BLOCK_M``, the rows rounded up to a power of two),
streams their weight rows through a ``NUM_STAGES``-deep pipeline of ``[BLOCK_N, BLOCK_K]`` tiles into
``tl.dot`` and writes the result directly: one kernel per linear layer. One row takes a variant without
MMA (``_gemv_fma_kernel``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.kernels.gemv_config import VARIANTS, block_m, gemv_config
from minivllm.kernels.pdl import pdl_options, pdl_wait


@triton.jit
def _gemv_kernel(
    x_ptr,  # [M, K]
    w_ptr,  # [N, K] (bf16/fp16, or FP8 with HAS_SCALE)
    scale_ptr,  # [N] float32: the weight's per-row scale (FP8), or a dummy
    bias_ptr,  # [N] or a dummy
    out_ptr,  # [M, N]
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    HAS_BIAS: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    DOT_F32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_wait(USE_PDL)
    # the row blocks of one column block are neighbours in launch order, so a weight tile
    # read by the first is still in L2 for the others
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M]
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    rk = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    x_rows = x_ptr + rm[:, None].to(tl.int64) * stride_xm
    w_rows = w_ptr + rn[:, None].to(tl.int64) * stride_wn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        kk = k + rk
        x = tl.load(x_rows + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)  # [BM, BK]
        w = tl.load(w_rows + kk[None, :], mask=(rn[:, None] < N) & (kk[None, :] < K), other=0.0)  # [BN, BK]
        if DOT_F32:  # the interpreter's bf16/fp16 dot is wrong; float32 tiles there
            x = x.to(tl.float32)
            w = w.to(tl.float32)
        elif HAS_SCALE:
            w = w.to(x.dtype)  # FP8 weights widened in registers: half the bytes from memory
        acc += tl.dot(x, tl.trans(w))  # [BM, BN]
    if HAS_SCALE:
        acc *= tl.load(scale_ptr + rn, mask=rn < N, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + rm[:, None].to(tl.int64) * stride_om + rn[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def _gemv_fma_kernel(
    x_ptr,  # [M, K]
    w_ptr,  # [N, K]
    scale_ptr,  # [N] float32 (FP8 weights) or a dummy
    bias_ptr,  # [N] or a dummy
    out_ptr,  # [M, N]
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    HAS_BIAS: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """One row of ``x`` a program row (grid axis 0), float32 FMAs instead of an MMA: for one row only."""
    pdl_wait(USE_PDL)
    row = tl.program_id(0)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    rk = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    w_rows = w_ptr + rn[:, None].to(tl.int64) * stride_wn
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        kk = k + rk
        x = tl.load(x_ptr + row * stride_xm + kk, mask=kk < K, other=0.0).to(tl.float32)  # [BK]
        w = tl.load(w_rows + kk[None, :], mask=(rn[:, None] < N) & (kk[None, :] < K), other=0.0)  # [BN, BK]
        acc += w.to(tl.float32) * x[None, :]
    out = tl.sum(acc, axis=1)  # [BLOCK_N]
    if HAS_SCALE:
        out *= tl.load(scale_ptr + rn, mask=rn < N, other=0.0)
    if HAS_BIAS:
        out += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_om + rn, out.to(out_ptr.dtype.element_ty), mask=rn < N)


def gemv(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
         config: tuple | None = None, w_scale: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ w.T + bias`` for ``x`` [M, K], ``w`` [N, K] (rows contiguous): [M, N] in ``x``'s dtype. FP8 weights
    come with ``w_scale`` ([N] float32, one per row): ``x @ (w * w_scale[:, None]).T``, the activations unquantized."""
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"gemv needs x [M, K] and w [N, K], got {tuple(x.shape)} and {tuple(w.shape)}")
    if x.stride(1) != 1 or w.stride(1) != 1:
        raise ValueError("gemv needs rows with contiguous columns (stride 1 along K)")
    m, k = x.shape
    n = w.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    bn, bk, stages, warps, variant = config or gemv_config(n, k, m, fp8=w.dtype == torch.float8_e4m3fn)
    if variant not in VARIANTS:
        raise ValueError(f"a GEMV config's variant is one of {VARIANTS}, got {variant!r}")
    bias_arg = bias if bias is not None else out
    scale_arg = w_scale if w_scale is not None else out
    if variant == "f":
        _gemv_fma_kernel[(m, triton.cdiv(n, bn))](
            x, w, scale_arg, bias_arg, out, n, k, x.stride(0), w.stride(0), out.stride(0), HAS_BIAS=bias is not None,
            HAS_SCALE=w_scale is not None, BLOCK_N=bn, BLOCK_K=bk, NUM_STAGES=stages, num_warps=warps, **pdl_options(x))
        return out
    bm = block_m(m)
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
    # Triton runs on CPU tensors only in its interpreter, whose bf16/fp16 dot is wrong
    _gemv_kernel[grid](
        x, w, scale_arg, bias_arg, out, m, n, k, x.stride(0), w.stride(0), out.stride(0),
        HAS_BIAS=bias is not None, HAS_SCALE=w_scale is not None, DOT_F32=x.device.type == "cpu" and x.dtype != torch.float32, BLOCK_M=bm,
        BLOCK_N=bn, BLOCK_K=bk, NUM_STAGES=stages, num_warps=warps, **pdl_options(x))
    return out
