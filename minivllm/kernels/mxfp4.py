"""MXFP4 (OCP microscaling FP4) weights in plain torch: dequantization (the CPU path and the reference of the
Triton kernels) and a quantizer (dummy weights, tests).

A weight ``[..., N, K]`` is stored as e2m1 values, two a byte, and one e8m0 scale a group of 32 values along K,
as gpt-oss's checkpoints store their experts:

- ``blocks`` uint8 ``[..., N, K / 32, 16]`` (or flattened, ``[..., N, K / 2]``): byte ``j`` of group ``g`` holds
  value ``k = 32 g + 2 j`` in its low nibble and ``k + 1`` in its high nibble;
- ``scales`` uint8 ``[..., N, K / 32]``: the group's scale ``2^(s - 127)``;
- a nibble is sign (bit 3), exponent (bits 2-1), mantissa (bit 0): ``E2M1_VALUES[nibble]``.
"""

from __future__ import annotations

import torch

#: the 16 e2m1 values by nibble (OCP MX spec, transformers' ``FP4_VALUES``)
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
#: values a scale covers along K
MXFP4_BLOCK = 32
#: the midpoints between neighbouring e2m1 magnitudes (the quantizer's rounding boundaries)
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
#: the largest e2m1 magnitude
E2M1_MAX = 6.0
#: the e8m0 scale's exponent bias
E8M0_BIAS = 127


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``[..., N, K]`` in ``dtype`` from ``blocks`` uint8 ``[..., N, K / 32, 16]`` or ``[..., N, K / 2]`` and
    ``scales`` uint8 ``[..., N, K / 32]``."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"dequantize_mxfp4 needs uint8 blocks and scales, got {blocks.dtype} and {scales.dtype}")
    groups = scales.shape[-1]
    packed = blocks.reshape(*blocks.shape[:-2], -1) if blocks.dim() == scales.dim() + 1 else blocks
    if tuple(packed.shape) != (*scales.shape[:-1], groups * MXFP4_BLOCK // 2):
        raise ValueError(f"dequantize_mxfp4: blocks {tuple(blocks.shape)} do not fit scales {tuple(scales.shape)} "
                         f"(blocks [..., N, K/32, 16] or [..., N, K/2], scales [..., N, K/32])")
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=blocks.device)
    lo, hi = table[(packed & 0x0F).long()], table[(packed >> 4).long()]  # [..., N, K/2] each
    values = torch.stack([lo, hi], dim=-1).reshape(*packed.shape[:-1], groups, MXFP4_BLOCK)  # [..., N, K/32, 32]
    scale = e8m0_to_float(scales)  # [..., N, K/32]
    return (values * scale[..., None]).reshape(*packed.shape[:-1], -1).to(dtype)


def e8m0_to_float(scales: torch.Tensor) -> torch.Tensor:
    """``2^(s - 127)`` in float32, exactly, for integer ``scales`` in [0, 254] (255, e8m0's NaN, is not a
    scale any quantizer writes): the float's exponent field is ``s`` itself, and ``s = 0`` the subnormal
    2^-127."""
    s = scales.to(torch.int32)
    return torch.where(s == 0, torch.full_like(s, 1 << 22), s << 23).view(torch.float32)


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w`` ``[..., N, K]`` (K a multiple of 32) -> ``(blocks uint8 [..., N, K / 2], scales uint8
    [..., N, K / 32])``.

    Each group's scale is the smallest power of two with ``amax / scale <= 6`` (the rounding up of
    ``amax / 6`` that triton_kernels' ``downcast_to_mxfp`` uses by default, and transformers with it), so no
    value saturates; each value is then the nearest e2m1 one, ties to the even mantissa. An all-zero group
    gets the smallest scale."""
    if w.shape[-1] % MXFP4_BLOCK:
        raise ValueError(f"quantize_mxfp4 needs K (the last dimension) a multiple of {MXFP4_BLOCK}, "
                         f"got {tuple(w.shape)}")
    groups = w.float().reshape(*w.shape[:-1], -1, MXFP4_BLOCK)  # [..., N, K/32, 32]
    amax = groups.abs().amax(-1)  # [..., N, K/32]
    # frexp: amax / 6 = m * 2^e with m in [0.5, 1), so 2^e is the power of two at or above it (2^(e-1) on m = 0.5)
    mant, exp = torch.frexp(amax / E2M1_MAX)
    exp = torch.where(mant == 0.5, exp - 1, exp)
    biased = torch.where(amax > 0, exp + E8M0_BIAS, torch.zeros_like(exp)).clamp(0, 254)  # [..., N, K/32]
    scaled = groups / e8m0_to_float(biased)[..., None]  # [..., N, K/32, 32]
    # the nearest magnitude's code: the midpoints between neighbours, a tie going to the lower code (right=False)
    # except where the upper one has the even mantissa (0.75, 1.75, 3.5)
    mids = torch.tensor(_E2M1_MIDPOINTS, dtype=torch.float32, device=w.device)
    mag = scaled.abs()  # [..., N, K/32, 32]
    code = torch.bucketize(mag, mids) + ((mag == 0.75) | (mag == 1.75) | (mag == 3.5)).long()
    code = code.to(torch.uint8) | ((scaled < 0).to(torch.uint8) << 3)  # [..., N, K/32, 32]
    code = code.reshape(*w.shape[:-1], -1, 2)  # [..., N, K/2, 2]
    return code[..., 0] | (code[..., 1] << 4), biased.to(torch.uint8)
