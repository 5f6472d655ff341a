"""Which rows and weights take the Triton GEMV (``minivllm.kernels.gemv``), and its tile configuration.

``use_gemv`` decides per linear call (CUDA, bf16/fp16, few rows); ``gemv_config`` picks
``(BLOCK_N, BLOCK_K, NUM_STAGES, num_warps, variant)`` by shape: the fastest of 20 configurations on an
H200 at Qwen3-8B's and 32B's shapes at TP=1 and 2. To re-tune, time candidates with
``PYTHONPATH=. python benchmarks/kernels/gemv.py --rows 1 16 --configs 8x256x6x2f 32x256x4x4 ...``.
"""

from __future__ import annotations

import torch
import triton

MAX_BLOCK_M = 128  # more rows than this take several row blocks (each re-reads the weights, from L2)
# several rows: faster than cuBLAS from 8M-element weights up (the 8B layers, TP=1 and 2); smaller ones stay
# on cuBLAS. One row (the FMA variant) takes every weight, the 0.6B model's small ones included, as it beat
# cuBLAS on all of them (docs/performance-notes.md, "Triton GEMV")
MIN_WEIGHT_NUMEL = 1 << 23
#: the most rows a linear layer sends to this kernel; cuBLAS above (64 lost throughput at TP=1:
#: docs/performance-notes.md)
MAX_ROWS = 16
DTYPES = (torch.bfloat16, torch.float16)
VARIANTS = ("", "f")  # MMA (tl.dot over a [BLOCK_M, BLOCK_N] tile); FMA (one row a program, no MMA)


def gemv_config(n: int, k: int, m: int = 1, fp8: bool = False) -> tuple[int, int, int, int, str]:
    """``(BLOCK_N, BLOCK_K, NUM_STAGES, num_warps, variant)`` for ``m`` rows and a ``[n, k]`` weight.

    One row: FMAs, no MMA, with enough programs to fill the GPU a few times over (8 columns each up to 4096
    columns, 16 above), faster there than both cuBLAS and the MMA kernel. FP8 weights (``fp8``) at one row take
    512-wide K tiles (the bytes of 256 bf16 values) except around 6,144 columns, the fastest of 11
    configurations on Qwen3-8B's layers (``benchmarks/kernels/gemv.py --fp8``). More rows: the MMA kernel,
    128-wide K tiles over 64 rows (4 stages of [128 + 32, 256] tiles would not fit in shared memory).
    """
    if m == 1 and fp8:
        return (8, 256, 6, 2, "f") if 4096 < n <= 8192 else (8, 512, 4, 2, "f")
    if m == 1:
        if n <= 4096:
            return 8, 256, 6, 2, "f"
        return (16, 256, 4, 4, "f") if n <= 8192 else (16, 512, 3, 4, "f")
    return (32, 256, 4, 4, "") if block_m(m) <= 64 else (32, 128, 4, 4, "")


def block_m(m: int) -> int:
    """The row tile for ``m`` rows: ``m`` rounded up to a power of two, at least 16, at most ``MAX_BLOCK_M``."""
    return min(MAX_BLOCK_M, max(16, triton.next_power_of_2(m)))


def gemv_takes(rows: int, weight_numel: int) -> bool:
    """Whether this many rows times a weight this large take this kernel (one row, or at most ``MAX_ROWS`` rows
    and a weight of at least ``MIN_WEIGHT_NUMEL`` elements)."""
    return 0 < rows <= MAX_ROWS and (rows == 1 or weight_numel >= MIN_WEIGHT_NUMEL)


def use_gemv(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether ``linear(x, w)`` takes this kernel: CUDA, bf16/fp16, and :func:`gemv_takes`. FP8 weights (with
    their scales) too."""
    return (x.is_cuda and x.dim() == 2 and x.dtype in DTYPES and w.dtype in (x.dtype, torch.float8_e4m3fn)
            and gemv_takes(x.shape[0], w.numel()))
