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
def load_mxfp4(w_row, s_row, kk, mask, stride_sk):
    """Float32 weights at input columns ``kk`` of the rows whose packed bytes start at ``w_row`` and scales at
    ``s_row`` (``w_row``, ``s_row`` and ``kk`` broadcast to the tile's shape: ``[BN, 1]`` and ``[1, BK]``, or
    ``[1, BN]`` and ``[BK, 1]``). Column ``k``'s value is byte ``k // 2``'s low nibble (``k`` even) or high
    one, times the scale of group ``k // 32``; masked-out entries are 0."""
    byte = tl.load(w_row + kk // 2, mask=mask, other=0).to(tl.int32)
    nibble = (byte >> ((kk % 2) * 4)) & 0xF
    s = tl.load(s_row + (kk // 32) * stride_sk, mask=mask, other=0).to(tl.int32)
    return e2m1_to_float(nibble) * e8m0_to_float(s)
