"""The fused MoE layer's decode path (``minivllm.kernels.fused_moe``): two GEMV-shaped kernels over the picked
experts only, for batches of a few tokens.

Gate/up: one program a (token, pick) pair (the fastest grid axis, so that two tokens that picked one expert read
its rows at about the same time) and ``BLOCK_N`` gate and up rows of its expert, float32 FMAs, SiLU-and-mul at the
end. Down: one program a token, ``BLOCK_N`` output columns and a group of ``PICKS`` picks, summed in order in
registers (times the router weights); with fewer picks a group than ``top_k``, each group writes a partial row and
a sum over the groups follows (more programs reading weights at once when there are few tokens). FP8 weights are
widened and scaled in registers, MXFP4 ones unpacked and scaled there (``mxfp4_dequant.load_mxfp4``); the
activations stay unquantized. No alignment, no host sync.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.kernels.mxfp4_dequant import load_mxfp4
from minivllm.kernels.pdl import pdl_wait

__all__ = ["fused_moe_decode", "gated_act", "silu_mul"]

#: the kernels' ``ACTIVATION`` constexpr for ``moe_torch.EXPERT_ACTIVATIONS``
ACTIVATION_IDS = {"silu": 0, "swigluoai": 1}


@triton.jit
def silu_mul(gate, up):
    """``silu(gate) * up`` in float32."""
    return gate / (1.0 + tl.exp(-gate)) * up


@triton.jit
def gated_act(gate, up, ACTIVATION: tl.constexpr, ALPHA: tl.constexpr, LIMIT: tl.constexpr):
    """The experts' activation in float32: ``silu(gate) * up`` (ACTIVATION 0), or gpt-oss's clamped SwiGLU
    (1): ``(clamp(up, -LIMIT, LIMIT) + 1) * g * sigmoid(ALPHA * g)``, ``g = min(gate, LIMIT)``."""
    if ACTIVATION == 1:
        g = tl.minimum(gate, LIMIT)
        u = tl.minimum(tl.maximum(up, -LIMIT), LIMIT)
        out = (u + 1.0) * (g / (1.0 + tl.exp(-g * ALPHA)))
    else:
        out = silu_mul(gate, up)
    return out


@triton.jit
def _moe_gemv_gate_up_kernel(
    x_ptr,  # [n, K]
    w_ptr,  # [E, 2N, K] w13: gate rows, then up rows (bf16/fp16/fp32, FP8 with HAS_SCALE); MXFP4: [E, 2N, K/2] uint8
    scale_ptr,  # HAS_SCALE: [E, 2N blocks, K blocks] or [E, 2N] float32; MXFP4: [E, 2N, K/32] uint8; else a dummy
    ids_ptr,  # [n * TOP_K] int32
    out_ptr,  # [n * TOP_K, N]: silu(gate) * up
    N,
    K,
    stride_xm,
    stride_we,
    stride_wn,
    stride_om,
    stride_se,
    stride_sn,
    stride_sk,  # 0 with one scale a row
    up_scale_row,
    TOP_K: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    MXFP4: tl.constexpr,
    GROUP_N: tl.constexpr,
    GROUP_K: tl.constexpr,  # a multiple of BLOCK_K
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    USE_PDL: tl.constexpr,
    bias_ptr=None,  # HAS_BIAS: [E, 2N] the gate biases, then the up biases
    stride_bias_e=0,
    HAS_BIAS: tl.constexpr = False,
    ACTIVATION: tl.constexpr = 0,  # ``gated_act``'s
    ALPHA: tl.constexpr = 1.702,
    LIMIT: tl.constexpr = 7.0,
):
    """One (token, pick) pair a program row (axis 0), ``BLOCK_N`` gate and up rows of its expert a program.
    FP8 and MXFP4 weights are widened and scaled in registers; the activations stay unquantized."""
    pdl_wait(USE_PDL)
    pair = tl.program_id(0).to(tl.int64)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    rk = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    expert = tl.load(ids_ptr + pair).to(tl.int64)
    x_row = x_ptr + (pair // TOP_K) * stride_xm
    gate_rows = w_ptr + expert * stride_we + rn[:, None].to(tl.int64) * stride_wn  # [BN, 1]
    up_rows = gate_rows + N * stride_wn
    gate_s = scale_ptr + expert * stride_se + (rn // GROUP_N) * stride_sn  # [BN] (HAS_SCALE)
    up_s = gate_s + up_scale_row * stride_sn
    acc_gate = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        kk = k + rk
        x = tl.load(x_row + kk, mask=kk < K, other=0.0).to(tl.float32)[None, :]  # [1, BK]
        mask = (rn[:, None] < N) & (kk[None, :] < K)
        if MXFP4:
            gate = load_mxfp4(gate_rows, gate_s[:, None], k, K, rn[:, None] < N, stride_sk, BLOCK_K)  # [BN, BK]
            up = load_mxfp4(up_rows, up_s[:, None], k, K, rn[:, None] < N, stride_sk, BLOCK_K)  # [BN, BK]
        else:
            gate = tl.load(gate_rows + kk[None, :], mask=mask, other=0.0).to(tl.float32)  # [BN, BK]
            up = tl.load(up_rows + kk[None, :], mask=mask, other=0.0).to(tl.float32)  # [BN, BK]
        if HAS_SCALE:
            gate *= tl.load(gate_s + (k // GROUP_K) * stride_sk, mask=rn < N, other=0.0)[:, None]
            up *= tl.load(up_s + (k // GROUP_K) * stride_sk, mask=rn < N, other=0.0)[:, None]
        acc_gate += gate * x
        acc_up += up * x
    gate, up = tl.sum(acc_gate, 1), tl.sum(acc_up, 1)  # [BLOCK_N] each
    if HAS_BIAS:
        b_row = bias_ptr + expert * stride_bias_e + rn  # [BLOCK_N]
        gate += tl.load(b_row, mask=rn < N, other=0.0).to(tl.float32)
        up += tl.load(b_row + N, mask=rn < N, other=0.0).to(tl.float32)
    out = gated_act(gate, up, ACTIVATION, ALPHA, LIMIT)  # [BLOCK_N]
    tl.store(out_ptr + pair * stride_om + rn, out.to(out_ptr.dtype.element_ty), mask=rn < N)


@triton.jit
def _moe_gemv_down_kernel(
    a_ptr,  # [n * TOP_K, K] the activations
    w_ptr,  # [E, N, K] w2 (bf16/fp16/fp32, or FP8 with HAS_SCALE); MXFP4: [E, N, K/2] uint8
    scale_ptr,  # HAS_SCALE: [E, N blocks, K blocks] or [E, N] float32; MXFP4: [E, N, K/32] uint8; else a dummy
    ids_ptr,  # [n * TOP_K] int32
    topk_w_ptr,  # [n * TOP_K] float32
    out_ptr,  # [n, N], or [n, TOP_K // PICKS, N] with the picks split over programs
    N,
    K,
    stride_am,
    stride_we,
    stride_wn,
    stride_om,
    stride_os,  # between a token's pick groups (PICKS < TOP_K)
    stride_se,
    stride_sn,
    stride_sk,
    TOP_K: tl.constexpr,
    PICKS: tl.constexpr,  # picks a program sums (divides TOP_K)
    HAS_SCALE: tl.constexpr,
    MXFP4: tl.constexpr,
    GROUP_N: tl.constexpr,
    GROUP_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    USE_PDL: tl.constexpr,
    bias_ptr=None,  # HAS_BIAS: [E, N], added to each pick's row before its router weight
    stride_bias_e=0,
    HAS_BIAS: tl.constexpr = False,
):
    """One token a program row (axis 0), ``BLOCK_N`` output columns a program (axis 1), ``PICKS`` of its picks
    summed in order (axis 2: the pick group). The picks' K loops run as one loop, so that the load pipeline does
    not drain and refill at each pick. With ``PICKS < TOP_K`` each group writes its own partial row: more
    programs stream weights at once when there are few tokens, and the caller sums the groups."""
    pdl_wait(USE_PDL)
    token = tl.program_id(0).to(tl.int64)
    group = tl.program_id(2)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    rk = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    w_cols = rn[:, None].to(tl.int64) * stride_wn  # [BN, 1]
    s_cols = (rn // GROUP_N) * stride_sn  # [BN] (HAS_SCALE)
    num_k = tl.cdiv(K, BLOCK_K)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for step in tl.range(0, PICKS * num_k, num_stages=NUM_STAGES):
        pair = token * TOP_K + group * PICKS + step // num_k
        k = (step % num_k) * BLOCK_K
        kk = k + rk
        expert = tl.load(ids_ptr + pair).to(tl.int64)
        a = tl.load(a_ptr + pair * stride_am + kk, mask=kk < K, other=0.0).to(tl.float32)  # [BK]
        a *= tl.load(topk_w_ptr + pair)
        if MXFP4:
            w = load_mxfp4(w_ptr + expert * stride_we + w_cols, scale_ptr + expert * stride_se + s_cols[:, None],
                           k, K, rn[:, None] < N, stride_sk, BLOCK_K)  # [BN, BK]
        else:
            w = tl.load(w_ptr + expert * stride_we + w_cols + kk[None, :],
                        mask=(rn[:, None] < N) & (kk[None, :] < K), other=0.0).to(tl.float32)  # [BN, BK]
        if HAS_SCALE:
            w *= tl.load(scale_ptr + expert * stride_se + s_cols + (k // GROUP_K) * stride_sk, mask=rn < N,
                         other=0.0)[:, None]
        acc += w * a[None, :]
    out = tl.sum(acc, 1)  # [BLOCK_N]
    if HAS_BIAS:  # sum_j w_j * (row_j + bias_j): the biases of this group's picks, weighted
        for j in tl.static_range(PICKS):
            pair = token * TOP_K + group * PICKS + j
            expert = tl.load(ids_ptr + pair).to(tl.int64)
            bias = tl.load(bias_ptr + expert * stride_bias_e + rn, mask=rn < N, other=0.0).to(tl.float32)
            out += tl.load(topk_w_ptr + pair) * bias
    tl.store(out_ptr + token * stride_om + group * stride_os + rn, out.to(out_ptr.dtype.element_ty), mask=rn < N)


def fused_moe_decode(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                     act: torch.Tensor, out: torch.Tensor, s13, s2, tiles: tuple[tuple[int, ...], tuple[int, ...]],
                     pdl: dict, epilogue13: dict | None = None, epilogue2: dict | None = None) -> torch.Tensor:
    """Writes the layer's output into ``out`` [n, H] and returns it, for ``x`` [n, H], the experts ``w13``
    [E, 2I, H] and ``w2`` [E, H, I], the flat picks ``ids`` / ``weights`` [n * top_k], the activations buffer
    ``act`` [n * top_k, I], the weights' scale layouts ``s13`` / ``s2`` (``fused_moe._Scales``) and checked
    ``tiles`` (``fused_moe_config.check_decode_tiles``). ``epilogue13`` / ``epilogue2``: the gate/up and down
    kernels' bias and activation arguments (``fused_moe.moe_epilogue``; none: no biases, SiLU)."""
    n, hidden = x.shape
    inter, top_k = act.shape[1], ids.numel() // n
    fp8, mxfp4 = w13.dtype == torch.float8_e4m3fn, w13.dtype == torch.uint8
    (bn1, bk1, st1, wp1), (bn2, bk2, st2, wp2, *split) = tiles
    picks = split[0] if split else top_k
    if mxfp4:  # NOTE: an MXFP4 K tile holds whole groups of 32 columns (any number of them)
        bk1, bk2 = max(bk1, 32), max(bk2, 32)
    else:  # NOTE: an FP8 K tile must lie in one scale block
        bk1, bk2 = min(bk1, s13.group_k), min(bk2, s2.group_k)
    _moe_gemv_gate_up_kernel[(n * top_k, triton.cdiv(inter, bn1))](
        x, w13, s13.tensor if fp8 or mxfp4 else act, ids, act, inter, hidden, x.stride(0), w13.stride(0), w13.stride(1),
        act.stride(0), *s13.strides, s13.up_row, TOP_K=top_k, HAS_SCALE=fp8, MXFP4=mxfp4, GROUP_N=s13.group_n,
        GROUP_K=s13.group_k, BLOCK_N=bn1, BLOCK_K=bk1, NUM_STAGES=st1, num_warps=wp1, **pdl, **(epilogue13 or {}))
    groups = top_k // picks
    # [n, groups, H] partial sums over each group's picks, summed below; one group writes out directly
    partial = out if groups == 1 else torch.empty(n, groups, hidden, dtype=x.dtype, device=x.device)
    _moe_gemv_down_kernel[(n, triton.cdiv(hidden, bn2), groups)](
        act, w2, s2.tensor if fp8 or mxfp4 else act, ids, weights, partial, hidden, inter, act.stride(0), w2.stride(0),
        w2.stride(1), partial.stride(0), partial.stride(1) if groups > 1 else 0, *s2.strides, TOP_K=top_k,
        PICKS=picks, HAS_SCALE=fp8, MXFP4=mxfp4, GROUP_N=s2.group_n, GROUP_K=s2.group_k, BLOCK_N=bn2, BLOCK_K=bk2,
        NUM_STAGES=st2, num_warps=wp2, **pdl, **(epilogue2 or {}))
    return out if groups == 1 else torch.sum(partial, dim=1, out=out)
