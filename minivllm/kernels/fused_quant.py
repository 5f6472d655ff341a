"""Dynamic FP8 (e4m3) activation quantization fused into the kernels that produce an FP8 GEMM's input:
RMSNorm, add+RMSNorm and SiLU-and-mul write ``x8`` and its scales directly instead of a bf16 tensor that
``quantize_fp8_per_token`` then reads back (one launch and one round trip of the activations fewer).

Scales: per token (``scale [M, 1] = amax(row) / 448``), or per token and ``group`` columns (``[M, ceil(K /
group)]``, for 128x128-block weights). Numerics: the value quantized is exactly what ``rms_norm`` /
``fused_add_rms_norm`` / ``silu_and_mul`` would have written in the activations' dtype (the same jitted row
code, rounded to that dtype), so the result is ``quantize_fp8_ref(unfused_output, group)``: scale = amax / 448
clamped at 1e-12, ``x8 = clamp(v * (1 / scale), +-448)`` cast to e4m3 round-to-nearest-even.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.kernels.fused_act import silu_and_mul_cols
from minivllm.kernels.fused_norm import _as_rows, _num_warps, rms_norm_apply, rms_norm_input, rms_norm_rstd
from minivllm.kernels.pdl import pdl_options, pdl_wait

FP8_MAX = 448.0
# per token, SiLU-and-mul keeps a row of up to this many (padded) columns in registers (16 or 32 warps,
# 32 values a thread), reading gate | up once; only wider rows go over the row twice (gate | up read again,
# from L2), which measured slower at Qwen3-8B's and 32B's D (docs/performance-notes.md). Re-measure with
# ``PYTHONPATH=. python benchmarks/kernels/fused_quant.py --inter 25600 --hidden 5120``, then again with this
# constant below D for the two-pass time.
ONE_PASS_MAX = 32768


@triton.jit
def _fp8_scale(amax):
    """amax (any shape, float32) -> (scale, 1 / scale), as ``quantize_fp8_ref`` computes them on CUDA.

    NOTE: torch on CUDA divides a tensor by a Python scalar as a multiply by the scalar's float32 reciprocal,
    and ``1.0 / scale`` is an IEEE reciprocal: so ``amax * (1 / 448)`` and ``div_rn`` (not Triton's float32
    ``/``, the approximate ``div.full.f32``, up to 2 ulp off). Then scale and x8 equal the reference's bit
    for bit on a GPU; torch on the CPU divides by 448 exactly, so there the scale may be 1 ulp off the
    reference's.
    """
    scale = tl.maximum(amax * (1.0 / 448.0), 1e-12)
    return scale, tl.math.div_rn(1.0, scale)


@triton.jit
def _to_fp8(v, inv):
    return tl.minimum(tl.maximum(v * inv, -448.0), 448.0).to(tl.float8e4nv)


@triton.jit
def _store_fp8_row(y, q_ptr, scale_ptr, offs, d):
    """Quantize ``y`` ``[BLOCK]`` (a whole row at ``offs``, 0 past ``d``) with one scale and store it."""
    scale, inv = _fp8_scale(tl.max(tl.abs(y), axis=0))  # scalars
    tl.store(scale_ptr, scale)
    tl.store(q_ptr + offs, _to_fp8(y, inv), mask=offs < d)


@triton.jit
def _store_fp8_groups(y, q_ptr, scale_ptr, offs, c0, d, GROUP: tl.constexpr):
    """Quantize ``y`` ``[NG, GROUP]`` (columns ``offs`` = ``_group_offs(c0, ..)``) per group and store it."""
    scale, inv = _fp8_scale(tl.max(tl.abs(y), axis=1))  # [NG] each
    gi = c0 // GROUP + tl.arange(0, y.shape[0])  # [NG] group index
    tl.store(scale_ptr + gi, scale, mask=gi * GROUP < d)
    tl.store(q_ptr + offs, _to_fp8(y, inv[:, None]), mask=offs < d)


@triton.jit
def _group_offs(c0, BLOCK: tl.constexpr, GROUP: tl.constexpr):
    """Columns ``c0 .. c0 + BLOCK`` as ``[BLOCK // GROUP, GROUP]``, one group a row."""
    return c0 + tl.arange(0, BLOCK // GROUP)[:, None] * GROUP + tl.arange(0, GROUP)[None, :]


@triton.jit
def _rms_norm_fp8_kernel(
    x_ptr,  # [n, d] input (unit stride in d)
    res_ptr,  # [n, d] residual, read if HAS_RESIDUAL
    w_ptr,  # [d] weight
    res_out_ptr,  # [n, d] x + residual, written if HAS_RESIDUAL (aliases res_ptr)
    q_ptr,  # [n, d] float8_e4m3fn
    scale_ptr,  # [n, ng] float32, ng = 1 (GROUP == 0) or cdiv(d, GROUP)
    stride_x,
    stride_res,
    stride_res_out,
    stride_q,
    stride_s,
    d,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    GROUP: tl.constexpr,  # 0: one scale per row
    BLOCK_D: tl.constexpr,
    VEC: tl.constexpr,  # 16 // x's element size
    USE_PDL: tl.constexpr,
):
    pdl_wait(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    dt = x_ptr.dtype.element_ty
    # NOTE: rms_norm's sum of squares, bit for bit, needs its register layout, which Triton takes from the
    # widest vector (up to 16 bytes a thread) of the loads and stores connected to the row: the FP8 stores
    # are told VEC (x's 16 bytes) values are contiguous, not 16, and per group the row is loaded again as
    # [groups, group] rather than reshaped (a reshape's layout propagates back to the sum). Unpinned, a
    # float32 row took 8 or 16 values a thread where rms_norm has 4, and rstd differed by an ulp. Checked on
    # H100 for d a multiple of 16 (every real hidden size); per group with a ragged d (1000, 3000) the sum's
    # layout still differs, and some float32 scales (rarely an FP8 value) come out 1 ulp off.
    offs = tl.max_contiguous(tl.arange(0, BLOCK_D), VEC)  # [BLOCK_D]
    x = rms_norm_input(x_ptr, res_ptr, row, stride_x, stride_res, offs, offs < d, HAS_RESIDUAL)  # [BLOCK_D]
    rstd = rms_norm_rstd(x, d, eps)  # scalar float32
    q_row, s_row = q_ptr + row * stride_q, scale_ptr + row * stride_s
    if GROUP == 0:
        if HAS_RESIDUAL:
            tl.store(res_out_ptr + row * stride_res_out + offs, x, mask=offs < d)
        y = rms_norm_apply(x, rstd, w_ptr, offs, offs < d).to(dt).to(tl.float32)  # [BLOCK_D] rms_norm's out
        _store_fp8_row(y, q_row, s_row, offs, d)
    else:
        offs2 = tl.max_contiguous(_group_offs(0, BLOCK_D, GROUP), [1, VEC])  # [NG, GROUP]
        x2 = rms_norm_input(x_ptr, res_ptr, row, stride_x, stride_res, offs2, offs2 < d, HAS_RESIDUAL)
        if HAS_RESIDUAL:  # NOTE: after both loads of the residual: res_out_ptr aliases res_ptr
            tl.store(res_out_ptr + row * stride_res_out + offs2, x2, mask=offs2 < d)
        y = rms_norm_apply(x2, rstd, w_ptr, offs2, offs2 < d).to(dt).to(tl.float32)  # [NG, GROUP]
        _store_fp8_groups(y, q_row, s_row, offs2, 0, d, GROUP)


@triton.jit
def _silu_cols(x_ptr, row, stride_x, d, offs):
    y = silu_and_mul_cols(x_ptr, row, stride_x, d, offs, offs < d)  # [BLOCK] float32
    return y.to(x_ptr.dtype.element_ty).to(tl.float32)  # [BLOCK] what silu_and_mul writes


@triton.jit
def _silu_and_mul_fp8_kernel(
    x_ptr,  # [n, 2 * d] gate | up (unit stride in the last dim)
    q_ptr,  # [n, d] float8_e4m3fn
    scale_ptr,  # [n, ng] float32
    stride_x,
    stride_q,
    stride_s,
    d,
    GROUP: tl.constexpr,  # 0: one scale per row (grid (n,)); else grid (n, cdiv(d, BLOCK))
    ONE_PASS: tl.constexpr,  # GROUP == 0 and BLOCK >= d: the whole row in registers
    BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_wait(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)  # [BLOCK]
    q_row, s_row = q_ptr + row * stride_q, scale_ptr + row * stride_s
    if GROUP != 0:
        c0 = tl.program_id(1) * BLOCK
        offs2 = _group_offs(c0, BLOCK, GROUP)  # [BLOCK // GROUP, GROUP]
        _store_fp8_groups(_silu_cols(x_ptr, row, stride_x, d, offs2), q_row, s_row, offs2, c0, d, GROUP)
    elif ONE_PASS:
        _store_fp8_row(_silu_cols(x_ptr, row, stride_x, d, cols), q_row, s_row, cols, d)
    else:
        # the amax, then the same values recomputed and written (gate | up read again, from L2)
        amax = tl.zeros([BLOCK], dtype=tl.float32)  # [BLOCK]
        for c0 in range(0, d, BLOCK):
            amax = tl.maximum(amax, tl.abs(_silu_cols(x_ptr, row, stride_x, d, c0 + cols)))
        scale, inv = _fp8_scale(tl.max(amax, axis=0))
        tl.store(s_row, scale)
        for c0 in range(0, d, BLOCK):
            v = _silu_cols(x_ptr, row, stride_x, d, c0 + cols)  # [BLOCK]
            tl.store(q_row + c0 + cols, _to_fp8(v, inv), mask=c0 + cols < d)


def _check_group(group: int | None, d: int) -> int:
    """The kernels' GROUP: 0 for one scale per row (``group`` None, or a group spanning the whole row)."""
    if group is None:
        return 0
    assert group > 0 and group & (group - 1) == 0, f"group must be a power of two, got {group}"
    return 0 if group >= d else group


def _outputs(n: int, d: int, group: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    q = torch.empty(n, d, dtype=torch.float8_e4m3fn, device=device)  # [n, d]
    ng = triton.cdiv(d, group) if group else 1
    scale = torch.empty(n, ng, dtype=torch.float32, device=device)  # [n, ng]
    return q, scale


def _norm_fp8(x2, r2, weight, eps, group, has_res):
    n, d = x2.shape
    assert weight.shape == (d,) and weight.is_contiguous(), "weight must be a contiguous [d] tensor"
    g = _check_group(group, d)
    q, scale = _outputs(n, d, g, x2.device)
    if n:
        block_d = triton.next_power_of_2(d)  # as rms_norm's, with its warps: the same float32 sum
        _rms_norm_fp8_kernel[(n,)](
            x2, r2, weight, r2, q, scale, x2.stride(0), r2.stride(0), r2.stride(0), q.stride(0),
            scale.stride(0), d, eps, HAS_RESIDUAL=has_res, GROUP=g, BLOCK_D=block_d,
            VEC=16 // x2.element_size(), num_warps=_num_warps(block_d), **pdl_options(x2),
        )
    return q, scale


def rms_norm_fp8(x: torch.Tensor, weight: torch.Tensor, eps: float,
                 group: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize_fp8_ref(rms_norm(x, weight, eps), group)`` in one launch.

    ``x`` ``[M, H]`` (leading dims are flattened) -> ``(x8 [M, H] float8_e4m3fn, scale [M, 1] (group None) or
    [M, ceil(H / group)] float32)``; ``group`` a power of two.
    """
    x2 = _as_rows(x)  # [M, H]
    return _norm_fp8(x2, x2, weight, eps, group, False)


def fused_add_rms_norm_fp8(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                           group: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``residual += x`` in place (in x's dtype, as ``fused_add_rms_norm(..., inplace=True)``), then ``(x8,
    scale)`` of ``rms_norm(residual)`` as :func:`rms_norm_fp8`. Returns ``(x8, scale, residual)``; ``x`` is
    not modified. ``residual`` needs unit stride in H."""
    d = x.shape[-1]
    assert residual.shape == x.shape and residual.dtype == x.dtype, "x and residual must match"
    assert residual.stride(-1) == 1, "the residual is updated in place: it needs unit stride in H"
    x2, r2 = _as_rows(x), residual.view(-1, d)  # [M, H] each; r2 a view of the caller's buffer
    q, scale = _norm_fp8(x2, r2, weight, eps, group, True)
    return q, scale, residual


def silu_and_mul_fp8(x: torch.Tensor, group: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize_fp8_ref(silu_and_mul(x), group)`` in one launch: ``x`` ``[M, 2D]`` (gate | up; leading dims
    flattened) -> ``(x8 [M, D] float8_e4m3fn, scale [M, 1] or [M, ceil(D / group)] float32)``.

    Per token, the scale needs the whole row's amax, so one program owns a row; up to ``ONE_PASS_MAX``
    columns (Qwen3-32B's D = 25600 included) it holds the row in registers and reads gate | up once, which
    measured faster than two passes over it in chunks (the amax, then the values again from L2), kept for
    wider rows (docs/performance-notes.md). Per group, groups are independent: a grid of (rows, column blocks)
    as silu_and_mul's, one pass.
    """
    two_d = x.shape[-1]
    assert two_d % 2 == 0, "last dim must be even (gate | up)"
    d = two_d // 2
    if x.stride(-1) != 1:
        x = x.contiguous()
    x2 = x if x.dim() == 2 else x.reshape(-1, two_d)  # [M, 2D]
    n = x2.shape[0]
    g = _check_group(group, d)
    q, scale = _outputs(n, d, g, x2.device)
    if n == 0:
        return q, scale
    one_pass = not g and triton.next_power_of_2(d) <= ONE_PASS_MAX
    if g:
        block = max(g, min(triton.next_power_of_2(d), 1024))  # a multiple of the group
        grid, warps = (n, triton.cdiv(d, block)), max(1, min(4, block // 256))
    elif one_pass:
        block = triton.next_power_of_2(d)
        grid, warps = (n,), max(1, min(8, block // 256)) if block <= 4096 else 16 if block <= 16384 else 32
    else:
        block, grid, warps = 4096, (n,), 16
    _silu_and_mul_fp8_kernel[grid](x2, q, scale, x2.stride(0), q.stride(0), scale.stride(0), d, GROUP=g,
                                   ONE_PASS=one_pass, BLOCK=block, num_warps=warps, **pdl_options(x2))
    return q, scale
