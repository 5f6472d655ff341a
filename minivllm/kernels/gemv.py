"""``x @ w.T (+ bias)`` for a few rows of ``x`` (decoding one to a few sequences), in Triton.

At M = 1 a linear layer is a stream over its weight matrix, and its speed is the fraction of
HBM bandwidth it reaches. cuBLAS's small-M kernels reach 50-75% on the 17-100 MB matrices of a
tensor-parallel 8B decode step (profile of 2026-11-22, H200) and some add a split-K reduce
kernel. This kernel gives each program ``BLOCK_N`` output columns, streams their weight rows
through a ``NUM_STAGES``-deep pipeline of ``[BLOCK_N, BLOCK_K]`` tiles into ``tl.dot`` (the rows
of ``x`` padded to 16) and writes the result directly: one kernel per linear layer.

Narrow outputs (a few thousand columns) leave too few programs to keep every SM streaming, so a
config may split K over ``SPLIT_K`` programs a column block: each stores a float32 partial sum
and the last to arrive (an arrival counter per column block) adds them up and writes the output,
still one kernel.
"""

from __future__ import annotations

import functools
import json
import os

import torch
import triton
import triton.language as tl

MAX_ROWS = 16  # the dot's M tile; more rows go to cuBLAS
# NOTE: measured faster than cuBLAS (2 x H200, 2026-11-22) from 8M-element weights up (the 8B layers,
# TP=1 and 2); smaller ones (Qwen3-0.6B's) stay on cuBLAS, unmeasured here
MIN_WEIGHT_NUMEL = 1 << 23
ENABLED = os.environ.get("MINIVLLM_GEMV", "1") != "0"  # NOTE: read once, at import
DTYPES = (torch.bfloat16, torch.float16)
MAX_COLUMN_BLOCKS = 1 << 16  # split-K needs a counter per BLOCK_N columns; wider outputs run unsplit
Config = tuple[int, int, int, int, int]  # BLOCK_N, BLOCK_K, NUM_STAGES, num_warps, SPLIT_K
DEFAULT: Config = (32, 256, 4, 4, 1)
# NOTE: (N, K) -> config, or None where cuBLAS was faster; bench_gemv.py --table-out measures it
TABLE: dict[tuple[int, int], Config | None] = {}


@triton.jit
def _gemv_kernel(
    x_ptr,  # [M, K]
    w_ptr,  # [N, K]
    bias_ptr,  # [N] or a dummy
    out_ptr,  # [M, N]
    ws_ptr,  # [SPLIT_K, BLOCK_M, N] float32 partial sums (SPLIT_K > 1)
    count_ptr,  # [>= cdiv(N, BLOCK_N)] int32, zero between calls (SPLIT_K > 1)
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
    SPLIT_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rm = tl.arange(0, BLOCK_M)  # [BLOCK_M]
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    rk = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    x_rows = x_ptr + rm[:, None] * stride_xm
    w_rows = w_ptr + rn[:, None].to(tl.int64) * stride_wn
    k_per_split = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K  # whole tiles: no tile straddles two splits
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(K, k_lo + k_per_split)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in tl.range(k_lo, k_hi, BLOCK_K, num_stages=NUM_STAGES):
        kk = k + rk
        x = tl.load(x_rows + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)  # [BM, BK]
        w = tl.load(w_rows + kk[None, :], mask=(rn[:, None] < N) & (kk[None, :] < K), other=0.0)  # [BN, BK]
        if DOT_F32:  # NOTE: the interpreter's bf16/fp16 dot is wrong; float32 tiles there
            x = x.to(tl.float32)
            w = w.to(tl.float32)
        acc += tl.dot(x, tl.trans(w))
    mask = (rm[:, None] < M) & (rn[None, :] < N)  # [BM, BN]
    if SPLIT_K > 1:
        # Each split stores its partial sum; the last of a column block to arrive adds them up in
        # split order (the same sum whichever program is last) and re-arms the block's counter.
        ws = ws_ptr + rm[:, None] * N + rn[None, :]  # [BM, BN] in split 0
        tl.store(ws + pid_k * BLOCK_M * N, acc, mask=mask)
        tl.debug_barrier()  # NOTE: every thread's stores issued before the release below
        arrived = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            tl.debug_barrier()
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for s in range(SPLIT_K):
                acc += tl.load(ws + s * BLOCK_M * N, mask=mask, other=0.0, cache_modifier=".cg")
            tl.atomic_xchg(count_ptr + pid_n, 0, sem="relaxed", scope="gpu")
            if HAS_BIAS:
                acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
            tl.store(out_ptr + rm[:, None] * stride_om + rn[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + rm[:, None] * stride_om + rn[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)


def parse_config(text: str) -> Config:
    """``"BLOCK_NxBLOCK_KxSTAGESxWARPS[xSPLIT_K]"`` (as ``MINIVLLM_GEMV_CFG`` and the table write them)."""
    try:
        vals = tuple(int(v) for v in text.lower().split("x"))
    except ValueError:
        vals = ()
    if len(vals) not in (4, 5) or min(vals) < 1:
        raise ValueError(f"a GEMV config is BLOCK_NxBLOCK_KxSTAGESxWARPS[xSPLIT_K] of positive integers, got {text!r}")
    return vals if len(vals) == 5 else (*vals, 1)


@functools.lru_cache(maxsize=1)
def _table() -> dict[tuple[int, int], Config | None]:
    table = dict(TABLE)
    path = os.environ.get("MINIVLLM_GEMV_TABLE")
    if path:  # NOTE: read once; {"N,K": "config" or "cublas"}, as bench_gemv.py --table-out writes
        with open(path) as f:
            for key, cfg in json.load(f).items():
                n, k = (int(v) for v in key.split(","))
                table[(n, k)] = None if cfg == "cublas" else parse_config(cfg)
    return table


def gemv_config(n: int, k: int) -> Config | None:
    """The config for a ``[n, k]`` weight, or None where cuBLAS is faster: ``MINIVLLM_GEMV_CFG`` for every
    shape, else the measured table, else ``DEFAULT`` for weights of at least ``MIN_WEIGHT_NUMEL`` elements."""
    env = os.environ.get("MINIVLLM_GEMV_CFG")
    if env:
        return parse_config(env)
    table = _table()
    if (n, k) in table:
        return table[(n, k)]
    return DEFAULT if n * k >= MIN_WEIGHT_NUMEL else None


def use_gemv(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether ``linear(x, w)`` takes this kernel: CUDA, bf16/fp16, at most ``MAX_ROWS`` rows, a weight shape
    ``gemv_config`` gives a config (``MINIVLLM_GEMV=0``: never)."""
    return (ENABLED and x.is_cuda and x.dim() == 2 and 0 < x.shape[0] <= MAX_ROWS and x.dtype in DTYPES
            and w.dtype == x.dtype and w.dim() == 2 and gemv_config(*w.shape) is not None)


@functools.cache
def _counters(device: torch.device) -> torch.Tensor:
    """Per-device arrival counters of split-K column blocks; each call leaves them at zero.
    NOTE: one stream per device uses them (the engine's); two concurrent split-K GEMVs would race."""
    return torch.zeros(MAX_COLUMN_BLOCKS, dtype=torch.int32, device=device)


def gemv(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
         config: Config | tuple[int, int, int, int] | None = None) -> torch.Tensor:
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
    cfg = config or gemv_config(n, k) or DEFAULT
    bn, bk, stages, warps = cfg[:4]
    split = cfg[4] if len(cfg) > 4 else 1
    blocks = triton.cdiv(n, bn)
    if split > 1 and blocks <= MAX_COLUMN_BLOCKS:
        ws = torch.empty(split, MAX_ROWS, n, dtype=torch.float32, device=x.device)  # partial sums
        counters = _counters(x.device)
    else:
        split, ws, counters = 1, out, out  # (unused pointers)
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    _gemv_kernel[(blocks, split)](
        x, w, bias if bias is not None else out, out, ws, counters, m, n, k, x.stride(0), w.stride(0),
        out.stride(0), HAS_BIAS=bias is not None, DOT_F32=interpret and x.dtype != torch.float32,
        BLOCK_M=MAX_ROWS, BLOCK_N=bn, BLOCK_K=bk, NUM_STAGES=stages, SPLIT_K=split, num_warps=warps)
    return out
