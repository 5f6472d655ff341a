"""Dynamic per-token FP8 (e4m3) quantization of activations in one kernel (Triton).

Program ``m`` reads row ``m`` of ``x`` once to find its largest magnitude, then again to write
``x8 = x / scale`` saturated at +-448, with ``scale = amax / 448`` (the row stays in L2 between the passes).
The FP8 GEMM then multiplies ``x8 @ w8^T`` and scales row ``m`` by ``scale[m]`` and column ``n`` by the
weight's scale. With ``scale`` given (a tensor-parallel row-parallel layer's input, its amax all-reduced over
the ranks) the first pass is skipped. Reference: ``quantize_fp8_ref`` in ``minivllm.kernels.torch_backend``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

FP8_MAX = 448.0


@triton.jit
def _quant_row_kernel(x_ptr, q_ptr, scale_ptr, K, stride_x, stride_q, BLOCK: tl.constexpr,
                      GIVEN_SCALE: tl.constexpr):
    m = tl.program_id(0).to(tl.int64)
    if GIVEN_SCALE:
        scale = tl.load(scale_ptr + m)
    else:
        amax = tl.zeros([BLOCK], dtype=tl.float32)
        for k0 in range(0, K, BLOCK):
            offs = k0 + tl.arange(0, BLOCK)
            v = tl.load(x_ptr + m * stride_x + offs, mask=offs < K, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(v))
        scale = tl.maximum(tl.max(amax, 0) / 448.0, 1e-12)
        tl.store(scale_ptr + m, scale)
    inv = 1.0 / scale
    for k0 in range(0, K, BLOCK):
        offs = k0 + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + m * stride_x + offs, mask=offs < K, other=0.0).to(tl.float32)
        q = tl.minimum(tl.maximum(v * inv, -448.0), 448.0)
        tl.store(q_ptr + m * stride_q + offs, q.to(q_ptr.dtype.element_ty), mask=offs < K)


def quantize_fp8_per_token(x: torch.Tensor, block: int = 1024,
                           scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` ([M, K], contiguous rows) -> ``(x8 [M, K] float8_e4m3fn, scale [M, 1] float32)`` (``scale``
    given: used as it is)."""
    M, K = x.shape
    q = torch.empty(M, K, dtype=torch.float8_e4m3fn, device=x.device)
    given = scale is not None
    if not given:
        scale = torch.empty(M, 1, dtype=torch.float32, device=x.device)
    if M:
        _quant_row_kernel[(M,)](x, q, scale, K, x.stride(0), q.stride(0), BLOCK=min(block, triton.next_power_of_2(K)),
                                GIVEN_SCALE=given)
    return q, scale
