"""W8A8 FP8 (e4m3) GEMM with block / group scales, and the per-token-group activation quantizer (Triton).

The FP8 block recipe (Qwen3-8B-FP8, DeepSeek-V3) stores one weight scale per 128 x 128 block and quantizes
activations per token and per group of 128 columns, so that an outlier costs precision only in its own
group. ``quantize_fp8_per_group`` makes ``x8 [M, K]`` and ``x_scale [M, ceil(K / 128)]`` in one kernel;
``fp8_block_gemm`` multiplies ``x8 @ w8^T`` on the FP8 tensor cores (fp8 x fp8 -> fp32), one ``BLOCK_K``
tile at a time, and adds each tile's partial product times ``x_scale[m, g] * w_scale[n // 128, g]`` (``g``
the tile's group) to a float32 accumulator: no dequantized weight is ever materialized. With per-channel
weights (``block=None``: ``w_scale [N]``, ``x_scale [M, 1]``) both scales are applied once, in the epilogue.
References: ``quantize_fp8_ref`` and ``fp8_linear_ref`` in ``minivllm.kernels.torch_backend``.

Tile configurations are an explicit table keyed on M (host ints only: no ``.item()``, no autotuning, so a
call is CUDA-graph safe).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.kernels.pdl import pdl_options, pdl_wait


@triton.jit
def _quant_group_kernel(
    x_ptr,  # [M, K]
    q_ptr,  # [M, K] float8_e4m3fn
    scale_ptr,  # [M, G] float32, G = cdiv(K, GROUP)
    K,
    G,
    stride_x,
    stride_q,
    stride_s,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,  # GROUP rounded up to a power of two
    BLOCK_G: tl.constexpr,  # groups per program
    USE_PDL: tl.constexpr,
):
    pdl_wait(USE_PDL)
    m = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1) * BLOCK_G + tl.arange(0, BLOCK_G)  # [BLOCK_G]
    j = tl.arange(0, GROUP_PAD)  # [GROUP_PAD]
    col = g[:, None] * GROUP + j[None, :]  # [BLOCK_G, GROUP_PAD]
    mask = (j[None, :] < GROUP) & (col < K) & (g[:, None] < G)
    v = tl.load(x_ptr + m * stride_x + col, mask=mask, other=0.0).to(tl.float32)  # [BLOCK_G, GROUP_PAD]
    scale = tl.maximum(tl.max(tl.abs(v), 1) / 448.0, 1e-12)  # [BLOCK_G]
    tl.store(scale_ptr + m * stride_s + g, scale, mask=g < G)
    # NOTE: times the reciprocal (as quantize_fp8_ref does), so both round to the same FP8 values
    q = tl.minimum(tl.maximum(v * (1.0 / scale)[:, None], -448.0), 448.0)
    tl.store(q_ptr + m * stride_q + col, q.to(q_ptr.dtype.element_ty), mask=mask)


def quantize_fp8_per_group(x: torch.Tensor, group: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` ([M, K], contiguous rows) -> ``(x8 [M, K] float8_e4m3fn, scale [M, ceil(K / group)] float32)``, one
    scale per ``group`` columns of a row: ``x ~ x8 * scale`` (``quantize_fp8_ref(x, group)``)."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"quantize_fp8_per_group needs x [M, K] with contiguous rows, got {tuple(x.shape)}")
    M, K = x.shape
    G = triton.cdiv(K, group)
    q = torch.empty(M, K, dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty(M, G, dtype=torch.float32, device=x.device)
    if M == 0 or K == 0:
        return q, scale
    group_pad = triton.next_power_of_2(group)
    block_g = min(triton.next_power_of_2(G), max(1, 2048 // group_pad))  # ~2K elements a program
    grid = (M, triton.cdiv(G, block_g))
    _quant_group_kernel[grid](x, q, scale, K, G, x.stride(0), q.stride(0), scale.stride(0), GROUP=group,
                              GROUP_PAD=group_pad, BLOCK_G=block_g, num_warps=4, **pdl_options(x))
    return q, scale


@triton.jit
def _fp8_gemm_kernel(
    a_ptr,  # [M, K] float8_e4m3fn (activations)
    b_ptr,  # [N, K] float8_e4m3fn (weights)
    as_ptr,  # [M, cdiv(K, GROUP_K)] float32 (block), or [M, 1] (per channel)
    bs_ptr,  # [cdiv(N, GROUP_N), cdiv(K, GROUP_K)] float32 (block), or [N] (per channel)
    bias_ptr,  # [N] or a dummy
    c_ptr,  # [M, N]
    M,
    N,
    K,
    stride_am,
    stride_bn,
    stride_cm,
    stride_asm,
    stride_bsn,
    GROUP_N: tl.constexpr,  # rows of a weight block (block scales)
    GROUP_K: tl.constexpr,  # columns of a weight block and of an activation group (block scales)
    BLOCK_SCALES: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    DOT_F32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SWIZZLE_M: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_wait(USE_PDL)
    # SWIZZLE_M row tiles of one column band run next to each other, so its weight tiles stay in L2
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    band = pid // (SWIZZLE_M * num_n)
    first_m = band * SWIZZLE_M
    rows = min(num_m - first_m, SWIZZLE_M)
    pid_m = first_m + (pid % (SWIZZLE_M * num_n)) % rows
    pid_n = (pid % (SWIZZLE_M * num_n)) // rows
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M]
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    rk = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    # rows and columns past M and N wrap around (always in bounds, no load masks); the store drops them
    rm_in = rm % M
    rn_in = rn % N
    a_rows = a_ptr + rm_in[:, None].to(tl.int64) * stride_am  # [BLOCK_M, 1]
    b_cols = b_ptr + rn_in[None, :].to(tl.int64) * stride_bn  # [1, BLOCK_N]
    as_rows = as_ptr + rm_in.to(tl.int64) * stride_asm  # [BLOCK_M]
    bs_rows = bs_ptr + (rn_in // GROUP_N).to(tl.int64) * stride_bsn  # [BLOCK_N] (block scales)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        kk = k + rk  # [BLOCK_K]
        a = tl.load(a_rows + kk[None, :], mask=kk[None, :] < K, other=0.0)  # [BM, BK]
        b = tl.load(b_cols + kk[:, None], mask=kk[:, None] < K, other=0.0)  # [BK, BN] (K-major)
        if DOT_F32:  # Triton runs on CPU tensors only in its interpreter: float32 tiles there
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        if BLOCK_SCALES:
            # NOTE: BLOCK_K divides GROUP_K, so the whole tile lies in group k // GROUP_K
            a_s = tl.load(as_rows + k // GROUP_K)  # [BM]
            b_s = tl.load(bs_rows + k // GROUP_K)  # [BN]
            acc += tl.dot(a, b) * (a_s[:, None] * b_s[None, :])  # [BM, BN]
        else:
            # NOTE: on sm_90 Triton lets an FP8 MMA sum a whole K loop in the tensor cores' reduced precision
            # unless told otherwise: here each tile's sum is added to the float32 accumulator, as with blocks
            acc = tl.dot(a, b, acc, max_num_imprecise_acc=BLOCK_K)  # [BM, BN]
    if not BLOCK_SCALES:
        acc *= tl.load(as_rows)[:, None] * tl.load(bs_ptr + rn_in)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn_in).to(tl.float32)[None, :]
    out = c_ptr + rm[:, None].to(tl.int64) * stride_cm + rn[None, :]
    tl.store(out, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


# (max M, (BLOCK_M, BLOCK_N, BLOCK_K, SWIZZLE_M, NUM_STAGES, num_warps)), the first bucket that holds M: the
# fastest of 16 configurations at Qwen3-8B's four linear shapes on an H100 (CUDA graphs, weights from HBM);
# re-tune with ``PYTHONPATH=. python benchmarks/kernels/fp8_gemm.py --configs 64x128x128x8x3x4 ...``.
# Up to 32 rows the dot runs on mma.sync (float32 sums); from 64-row tiles on wgmma, whose FP8 sums are less
# exact, about as much as cuBLASLt's own FP8 GEMM (tests/gpu/test_fp8_block_gemm_gpu.py bounds the error).
# 128-row tiles (8 warps) were slower (docs/performance-notes.md).
CONFIGS = (
    (16, (16, 64, 128, 8, 4, 4)),
    (32, (32, 64, 128, 8, 4, 4)),
    (64, (64, 64, 128, 8, 4, 4)),
    (1 << 62, (64, 128, 128, 8, 3, 4)),
)


def fp8_gemm_config(m: int) -> tuple[int, int, int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, BLOCK_K, SWIZZLE_M, NUM_STAGES, num_warps)`` for ``m`` rows."""
    return next(cfg for top, cfg in CONFIGS if m <= top)


def fp8_block_gemm(x8: torch.Tensor, x_scale: torch.Tensor, w8: torch.Tensor, w_scale: torch.Tensor,
                   block: tuple[int, int] | None, out_dtype: torch.dtype, bias: torch.Tensor | None = None,
                   config: tuple[int, int, int, int, int, int] | None = None) -> torch.Tensor:
    """``(x8 * x_scale) @ (w8 * w_scale)^T + bias`` -> ``[M, N]`` in ``out_dtype``, accumulated in float32.

    ``x8`` [M, K] and ``w8`` [N, K] are float8_e4m3fn with contiguous rows. With ``block = (b0, b1)``:
    ``x_scale`` [M, ceil(K / b1)] (``quantize_fp8_per_group(x, b1)``) and ``w_scale`` [ceil(N / b0),
    ceil(K / b1)]. With ``block=None``: ``x_scale`` [M, 1] (per token) and ``w_scale`` [N] (per channel).
    ``config`` overrides the table (``fp8_gemm_config``); with block scales its BLOCK_K is cut to ``b1``.
    """
    M, K = x8.shape
    N = w8.shape[0]
    if x8.dtype != torch.float8_e4m3fn or w8.dtype != torch.float8_e4m3fn:
        raise ValueError(f"fp8_block_gemm needs float8_e4m3fn operands, got {x8.dtype} and {w8.dtype}")
    if w8.shape[1] != K or x8.stride(1) != 1 or w8.stride(1) != 1:
        raise ValueError(f"fp8_block_gemm needs x8 [M, K], w8 [N, K] with contiguous rows, got {tuple(x8.shape)} "
                         f"and {tuple(w8.shape)}")
    bm, bn, bk, swizzle, stages, warps = config or fp8_gemm_config(M)
    if block is not None:
        gn, gk = block
        want_x, want_w = (M, triton.cdiv(K, gk)), (triton.cdiv(N, gn), triton.cdiv(K, gk))
        bk = min(bk, gk)
        if gk % bk:
            raise ValueError(f"a K tile of {bk} does not divide the scale group of {gk} columns")
        bs_stride = w_scale.stride(0)
    else:
        gn, gk = 1, 1
        want_x, want_w = (M, 1), (N,)
        bs_stride = 1
    if tuple(x_scale.shape) != want_x or tuple(w_scale.shape) != want_w:
        raise ValueError(f"scales for block {block}: x_scale {want_x} and w_scale {want_w}, got "
                         f"{tuple(x_scale.shape)} and {tuple(w_scale.shape)}")
    if (x_scale.stride(-1) != 1 and x_scale.shape[-1] > 1) or (w_scale.stride(-1) != 1 and w_scale.shape[-1] > 1):
        raise ValueError("fp8_block_gemm needs scales with contiguous rows")
    out = torch.empty(M, N, dtype=out_dtype, device=x8.device)  # [M, N]
    if M == 0 or N == 0:
        return out
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
    _fp8_gemm_kernel[grid](
        x8, w8, x_scale, w_scale, bias if bias is not None else out, out, M, N, K,
        x8.stride(0), w8.stride(0), out.stride(0), x_scale.stride(0), bs_stride,
        GROUP_N=gn, GROUP_K=gk, BLOCK_SCALES=block is not None, HAS_BIAS=bias is not None,
        DOT_F32=x8.device.type == "cpu", BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SWIZZLE_M=swizzle,
        NUM_STAGES=stages, num_warps=warps, **pdl_options(x8))  # fmt: skip
    return out
