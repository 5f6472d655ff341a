"""MXFP4 weights dequantized in registers, for the Triton MoE kernels (``fused_moe.py``, ``fused_moe_decode.py``):
a tile of packed e2m1 values and their e8m0 scales in, float32 values out (the layout: ``kernels/mxfp4.py``,
whose ``dequantize_mxfp4`` is the reference)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def e2m1_to_float(nibble):
    """The e2m1 value of each 4-bit code (int32) by bit arithmetic: sign bit 3, exponent bits 2-1 (bias 1),
    mantissa bit 0. A normal code (exponent e > 0) becomes the float32 with exponent ``e - 1`` and the mantissa
    bit at the top of the float's mantissa; the subnormal codes are 0 and 0.5."""
    e = (nibble >> 1) & 3
    m = nibble & 1
    bits = tl.where(e == 0, m * 0x3F000000, ((e + 126) << 23) | (m << 22))  # 0x3F000000: 0.5
    bits = bits | ((nibble & 8) << 28)  # the sign to bit 31
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def e8m0_to_float(s):
    """``2^(s - 127)`` in float32 for e8m0 codes ``s`` (int32): ``s`` is the float's exponent field (``s = 0``,
    2^-127, is a subnormal's bits)."""
    return tl.where(s == 0, 1 << 22, s << 23).to(tl.float32, bitcast=True)


@triton.jit
def load_mxfp4(w_rows, s_rows, k0, K, row_mask, stride_sk, BLOCK_K: tl.constexpr):
    """Float32 weights ``[BN, BLOCK_K]``: columns ``[k0, k0 + BLOCK_K)`` of the rows whose packed bytes start
    at ``w_rows`` and scales at ``s_rows`` (``[BN, 1]`` pointers; ``row_mask`` ``[BN, 1]``). ``k0`` and
    ``BLOCK_K`` are multiples of 32, so the tile holds whole scale groups. The bytes load as one contiguous run
    a row (vectorized); byte ``j``'s low nibble is column ``2j``, its high nibble ``2j + 1`` (joined, then
    flattened); each group of 32 columns is multiplied by its scale. Columns past ``K`` are 0."""
    kb = k0 // 2 + tl.arange(0, BLOCK_K // 2)  # [BK/2] byte columns
    byte = tl.load(w_rows + kb[None, :], mask=row_mask & (kb[None, :] < K // 2), other=0).to(tl.int32)  # [BN, BK/2]
    values = tl.join(e2m1_to_float(byte & 0xF), e2m1_to_float(byte >> 4))  # [BN, BK/2, 2]
    kg = k0 // 32 + tl.arange(0, BLOCK_K // 32)  # [BK/32] scale groups
    s = tl.load(s_rows + kg[None, :] * stride_sk, mask=row_mask & (kg[None, :] < K // 32), other=0)  # [BN, BK/32]
    values = tl.reshape(values, [values.shape[0], BLOCK_K // 32, 32])  # [BN, BK/32, 32]
    values = values * e8m0_to_float(s.to(tl.int32))[:, :, None]
    return tl.reshape(values, [values.shape[0], BLOCK_K])
