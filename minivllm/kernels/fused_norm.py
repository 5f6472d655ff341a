"""Triton RMSNorm, alone or fused with the residual add: one launch instead of ~8 elementwise kernels.

Numerics follow ``minivllm.layers.layernorm.RMSNorm`` (and Hugging Face's Qwen3RMSNorm) op by op:

    h   = x + residual                                   # in x's dtype (fused variant only)
    out = (h.float() * rsqrt(mean(h.float()^2) + eps)).to(x.dtype) * weight

i.e. the normalised row is rounded to x's dtype *before* the weight multiply, and that product
is rounded again, so bf16/fp16 results match the torch layer to the last bit except where the
float32 ``rsqrt`` / reduction order differ by an ulp. One program normalises one row
(``BLOCK_D = next_power_of_2(d)`` lanes, masked), which covers d up to 8192 in registers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.kernels.pdl import pdl_options, pdl_wait


@triton.jit
def rms_norm_input(x_ptr, res_ptr, row, stride_x, stride_res, offs, mask, HAS_RESIDUAL: tl.constexpr):
    """``x`` (``+ residual`` if HAS_RESIDUAL, rounded to x's dtype) at ``offs`` of row ``row``, any shape."""
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)  # [BLOCK_D] x.dtype
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_res + offs, mask=mask, other=0.0)  # [BLOCK_D]
        # rounded to x's dtype like the torch ``x = x + residual``; the norm reads the rounded sum
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # [BLOCK_D]
    return x


@triton.jit
def rms_norm_rstd(x, d, eps):
    """``1 / rms`` of a whole row ``x`` ``[BLOCK_D]`` (0 past ``d``), float32.

    NOTE: bit for bit rms_norm's only if the sum is reduced in the same order: ``BLOCK_D =
    next_power_of_2(d)``, ``_num_warps(BLOCK_D)`` warps and the same register layout, which Triton derives
    from the vector width of every load and store connected to the row (see ``fused_quant``).
    """
    xf = x.to(tl.float32)  # [BLOCK_D]
    return 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / d + eps)  # scalar float32


@triton.jit
def rms_norm_apply(x, rstd, w_ptr, offs, mask):
    """``normed * weight`` at ``offs`` (any shape), float32, not yet rounded to the output dtype."""
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)  # [BLOCK_D]
    normed = (x.to(tl.float32) * rstd).to(x.dtype).to(tl.float32)  # [BLOCK_D] rounded to x's dtype first
    return normed * w


@triton.jit
def _rms_norm_kernel(
    x_ptr,  # [n, d] input (unit stride in d)
    res_ptr,  # [n, d] residual, read if HAS_RESIDUAL
    w_ptr,  # [d] weight
    out_ptr,  # [n, d] normalised output (may alias x_ptr)
    res_out_ptr,  # [n, d] x + residual, written if HAS_RESIDUAL (may alias res_ptr)
    stride_x,
    stride_res,
    stride_out,
    stride_res_out,
    d,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_D: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_wait(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    mask = offs < d
    x = rms_norm_input(x_ptr, res_ptr, row, stride_x, stride_res, offs, mask, HAS_RESIDUAL)  # [BLOCK_D]
    if HAS_RESIDUAL:
        tl.store(res_out_ptr + row * stride_res_out + offs, x, mask=mask)
    y = rms_norm_apply(x, rms_norm_rstd(x, d, eps), w_ptr, offs, mask)  # [BLOCK_D] float32
    tl.store(out_ptr + row * stride_out + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def _num_warps(block_d: int) -> int:
    return max(1, min(16, block_d // 256))


def _as_rows(t: torch.Tensor) -> torch.Tensor:
    """``[..., d]`` -> a ``[n, d]`` view with unit stride in d (a copy only if no such view exists)."""
    if t.stride(-1) != 1:
        t = t.contiguous()
    return t if t.dim() == 2 else t.reshape(-1, t.shape[-1])


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm of each row of ``x`` ``[..., d]`` -> new tensor of x's shape and dtype.

    ``out`` (same shape, unit stride in d) may be given to write into, e.g. ``out=x`` for in place.
    """
    d = x.shape[-1]
    assert weight.shape == (d,) and weight.is_contiguous(), "weight must be a contiguous [d] tensor"
    x2 = _as_rows(x)  # [n, d]
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # [..., d]
    out2 = out.view(-1, d)  # [n, d]
    assert out2.stride(-1) == 1 and out2.shape == x2.shape
    n = x2.shape[0]
    if n == 0:
        return out
    block_d = triton.next_power_of_2(d)
    _rms_norm_kernel[(n,)](
        x2, x2, weight, out2, out2, x2.stride(0), 0, out2.stride(0), 0, d, eps,
        HAS_RESIDUAL=False, BLOCK_D=block_d, num_warps=_num_warps(block_d), **pdl_options(x2),
    )
    return out


def fused_add_rms_norm(
    x: torch.Tensor,  # [n, d]
    residual: torch.Tensor,  # [n, d], same dtype as x
    weight: torch.Tensor,  # [d]
    eps: float,
    inplace: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:  # (out [n, d], new_residual [n, d])
    """``h = x + residual`` (in x's dtype); returns ``(rms_norm(h), h)`` in one launch.

    ``inplace=False``: both results are new tensors and the inputs are untouched.
    ``inplace=True``: ``residual`` is overwritten with ``h`` and ``x`` with ``rms_norm(h)``; the
    returned tensors are ``x`` and ``residual`` themselves (both need unit stride in d).
    """
    d = x.shape[-1]
    assert residual.shape == x.shape and residual.dtype == x.dtype, "x and residual must match"
    assert weight.shape == (d,) and weight.is_contiguous(), "weight must be a contiguous [d] tensor"
    if inplace:
        assert x.stride(-1) == 1 and residual.stride(-1) == 1, "in place needs unit stride in d"
        x2, r2 = x.view(-1, d), residual.view(-1, d)  # [n, d] views of the caller's buffers
        out, new_res = x, residual
    else:
        x2, r2 = _as_rows(x), _as_rows(residual)  # [n, d]
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # [..., d]
        new_res = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # [..., d]
    out2, nr2 = out.view(-1, d), new_res.view(-1, d)  # [n, d]
    n = x2.shape[0]
    if n == 0:
        return out, new_res
    block_d = triton.next_power_of_2(d)
    _rms_norm_kernel[(n,)](
        x2, r2, weight, out2, nr2, x2.stride(0), r2.stride(0), out2.stride(0), nr2.stride(0), d, eps,
        HAS_RESIDUAL=True, BLOCK_D=block_d, num_warps=_num_warps(block_d), **pdl_options(x2),
    )
    return out, new_res
