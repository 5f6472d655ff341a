"""Triton SiLU-and-multiply for the gated MLP: ``silu(x[:, :d]) * x[:, d:]`` in one launch.

Numerics follow ``minivllm.layers.activation.SiluAndMul`` (``F.silu(gate) * up``): SiLU is
computed in float32 and rounded to the input dtype, then the product is computed in float32
and rounded again. Grid: ``(n, cdiv(d, BLOCK))``, rows on axis 0 (no 65,535 limit).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.kernels.pdl import pdl_options, pdl_wait


@triton.jit
def silu_and_mul_cols(x_ptr, row, stride_x, d, offs, mask):
    """Columns ``offs`` of row ``row``: ``silu(gate) * up`` ``[BLOCK]`` float32 (0 where not ``mask``), not
    yet rounded to the output dtype (x's). Shared with ``fused_quant`` (the FP8 variant)."""
    dt = x_ptr.dtype.element_ty
    gate = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)  # [BLOCK]
    up = tl.load(x_ptr + row * stride_x + d + offs, mask=mask, other=0.0).to(tl.float32)  # [BLOCK]
    act = (gate / (1.0 + tl.exp(-gate))).to(dt).to(tl.float32)  # [BLOCK] F.silu, rounded to the dtype
    return act * up  # [BLOCK] float32


@triton.jit
def _silu_and_mul_kernel(
    x_ptr,  # [n, 2 * d] gate | up (unit stride in the last dim)
    out_ptr,  # [n, d], x's dtype
    stride_x,
    stride_out,
    d,
    BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_wait(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    mask = offs < d
    y = silu_and_mul_cols(x_ptr, row, stride_x, d, offs, mask)  # [BLOCK] float32
    tl.store(out_ptr + row * stride_out + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` ``[..., 2 * d]`` -> ``silu(x[..., :d]) * x[..., d:]`` ``[..., d]`` (a new tensor unless ``out``)."""
    two_d = x.shape[-1]
    assert two_d % 2 == 0, "last dim must be even (gate | up)"
    d = two_d // 2
    if x.stride(-1) != 1:
        x = x.contiguous()
    x2 = x if x.dim() == 2 else x.reshape(-1, two_d)  # [n, 2 * d]
    if out is None:
        out = torch.empty((*x.shape[:-1], d), dtype=x.dtype, device=x.device)  # [..., d]
    out2 = out.view(-1, d)  # [n, d]
    assert out2.shape[0] == x2.shape[0] and out2.stride(-1) == 1 and out.dtype == x.dtype
    n = x2.shape[0]
    if n == 0:
        return out
    block = min(triton.next_power_of_2(d), 1024)
    grid = (n, triton.cdiv(d, block))
    _silu_and_mul_kernel[grid](x2, out2, x2.stride(0), out2.stride(0), d, BLOCK=block,
                               num_warps=max(1, min(4, block // 256)), **pdl_options(x2))
    return out
