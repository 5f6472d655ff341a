"""Which rows and weights take the Triton GEMV (``minivllm.kernels.gemv``), and its tile configuration.

``use_gemv`` decides per linear call (CUDA, bf16/fp16, few rows); ``gemv_config`` picks
``(BLOCK_N, BLOCK_K, NUM_STAGES, num_warps, variant)`` by shape, from measurements on an H200;
``MINIVLLM_GEMV``, ``MINIVLLM_GEMV_MAX_ROWS`` and ``MINIVLLM_GEMV_CFG`` override.
"""

from __future__ import annotations

import os

import torch
import triton

from minivllm.utils.env import env_int

MAX_BLOCK_M = 128  # more rows than this take several row blocks (each re-reads the weights, from L2)
# NOTE: several rows: measured faster than cuBLAS (2 x H200, 2026-11-22) from 8M-element weights up (the 8B
# layers, TP=1 and 2); smaller ones stay on cuBLAS. One row (the FMA variant) takes every weight: 1.2-4.2x
# cuBLAS on Qwen3-0.6B's 2-6M-element layers (H200, 2026-11-23, bench_gemv.py --models 0.6b)
MIN_WEIGHT_NUMEL = 1 << 23
ENABLED = os.environ.get("MINIVLLM_GEMV", "1") != "0"  # NOTE: read once, at import
DTYPES = (torch.bfloat16, torch.float16)


def max_rows() -> int:
    """``MINIVLLM_GEMV_MAX_ROWS``: the most rows a linear layer sends to this kernel (default 16)."""
    return env_int("MINIVLLM_GEMV_MAX_ROWS", 16, what="a row count")


MAX_ROWS = max_rows()  # NOTE: read once, at import (a decode graph's kernels are fixed at capture)


VARIANTS = ("", "s", "f", "t", "ts")  # MMA; MMA with SWAP_AB; FMA (one row a program); TMA loads (+ SWAP_AB)


def parse_config(text: str) -> tuple[int, int, int, int, str]:
    """``"BNxBKxSTAGESxWARPS"`` then a variant of ``VARIANTS``: e.g. ``"64x128x4x4s"``, ``"32x256x4x4t"``."""
    body = text.rstrip("stf")
    variant = text[len(body):]
    try:
        bn, bk, st, w = (int(v) for v in body.split("x"))
    except ValueError:
        raise ValueError(f"a GEMV config is BLOCK_NxBLOCK_KxSTAGESxWARPS[{'|'.join(VARIANTS[1:])}], got {text!r}"
                         ) from None
    if variant not in VARIANTS:
        raise ValueError(f"a GEMV config's variant is one of {VARIANTS}, got {variant!r} in {text!r}")
    if not all(v > 0 and v & (v - 1) == 0 for v in (bn, bk, w)) or st < 1 or w > 32:
        raise ValueError(f"a GEMV config needs BLOCK_N, BLOCK_K and WARPS (<= 32) powers of two and STAGES >= 1, "
                         f"got {text!r}")
    return bn, bk, st, w, variant


def gemv_config(n: int, k: int, m: int = 1) -> tuple[int, int, int, int, str]:
    """``(BLOCK_N, BLOCK_K, NUM_STAGES, num_warps, variant)`` for ``m`` rows and a ``[n, k]`` weight;
    ``MINIVLLM_GEMV_CFG`` overrides.

    NOTE: the fastest on an H200 of 20 configs at Qwen3-8B's shapes at TP=1 and 2 (2026-11-23,
    ``bench_gemv.py --rows 1 4 16 32 48 64``, docs/benchmarks.md). One row: FMAs, no MMA, with
    enough programs to fill the GPU a few times over (8 columns each up to 4096 columns, 16 above):
    1.1-1.4x cuBLAS and 3-16% under the MMA kernel. More rows: the MMA kernel with plain loads (TMA tiles
    with SWAP_AB, ``64x128x6x4ts``, were 1-3% faster at 2-16 rows on the 8B shapes but 6-7% slower on
    the 32B ones), 128-wide K tiles over 64 rows (4 stages of [128 + 32, 256] tiles would not fit in
    shared memory); cuBLAS takes more than 16 rows unless ``MINIVLLM_GEMV_MAX_ROWS`` says otherwise (64 lost
    1.1-1.3% of the nano workload's throughput at TP=1, H200, 2026-11-23).
    """
    env = os.environ.get("MINIVLLM_GEMV_CFG")
    if env:
        return parse_config(env)
    if m == 1:
        if n <= 4096:
            return 8, 256, 6, 2, "f"
        return (16, 256, 4, 4, "f") if n <= 8192 else (16, 512, 3, 4, "f")
    return (32, 256, 4, 4, "") if block_m(m) <= 64 else (32, 128, 4, 4, "")


def block_m(m: int) -> int:
    """The row tile for ``m`` rows: ``m`` rounded up to a power of two, at least 16, at most ``MAX_BLOCK_M``."""
    return min(MAX_BLOCK_M, max(16, triton.next_power_of_2(m)))


def use_gemv(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether ``linear(x, w)`` takes this kernel: CUDA, bf16/fp16, one row, or at most ``MAX_ROWS`` rows and a
    weight of at least ``MIN_WEIGHT_NUMEL`` elements (``MINIVLLM_GEMV=0``: never)."""
    return (ENABLED and x.is_cuda and x.dim() == 2 and 0 < x.shape[0] <= MAX_ROWS and x.dtype in DTYPES
            and w.dtype == x.dtype and (x.shape[0] == 1 or w.numel() >= MIN_WEIGHT_NUMEL))
