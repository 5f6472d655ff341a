"""The fused mixture-of-experts layer in Triton: ``fused_moe_triton`` (and the routing, ``select_experts_triton``).

For each token, ``sum_j topk_weights[t, j] * (w2[e_j] @ (silu(w13[e_j, :I] @ x_t) * (w13[e_j, I:] @ x_t)))`` over
its ``top_k`` experts ``e_j = topk_ids[t, j]``, accumulated in float32, in ``x``'s dtype (the reference is
``fused_moe`` in ``minivllm.kernels.moe_torch``). Two paths, neither reads a value back to the host, so both
run under CUDA-graph capture:

- **grouped** (more than ``DECODE_MAX_PAIRS`` pairs): ``moe_align_block_size`` sorts the (token, pick) pairs
  by expert into row tiles of one expert each; GEMM 1 gathers the tile's rows of ``x`` and multiplies them by
  the expert's gate and up rows at once (two accumulators), and applies SiLU-and-mul in its epilogue, so the
  ``[n * top_k, 2I]`` gate/up activations never reach memory (half the intermediate bytes, one launch fewer
  than a separate activation kernel); GEMM 2 (down) multiplies in the router weight and writes each pair's
  row to ``[n, top_k, H]``, and a sum over the picks (float32 inside ``torch.sum``) gives ``[n, H]``:
  deterministic, no atomics. Tiles follow ``fused_moe_config.get_config`` (per E, N, device and batch size).
- **decode** (a few pairs): the GEMV-shaped kernels of ``minivllm.kernels.gemv``, applied to the picked
  experts only: each program streams ``BLOCK_N`` rows of one picked expert's weight through float32 FMAs (no
  MMA, no padding to a tile, no alignment step); the down kernel loops over the token's picks in order,
  so the sum over them happens in its registers: two launches in all.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.kernels.fused_moe_config import check_config, decode_config, device_name, get_config, use_decode
from minivllm.kernels.moe_align import moe_align_block_size
from minivllm.kernels.moe_topk import select_experts_triton
from minivllm.kernels.pdl import pdl_options, pdl_wait

__all__ = ["fused_moe_triton", "select_experts_triton"]


@triton.jit
def _silu_mul(gate, up):
    """``silu(gate) * up`` in float32."""
    return gate / (1.0 + tl.exp(-gate)) * up


@triton.jit
def _moe_gemm_kernel(
    a_ptr,  # GEMM 1: x [n, K]; GEMM 2: the activations [n * TOP_K, K]
    b_ptr,  # [E, N (x2 if GATED), K]: w13 (gate rows, then up rows) or w2
    c_ptr,  # [n * TOP_K, N]
    topk_w_ptr,  # [n * TOP_K] float32 (MUL_WEIGHT)
    sorted_ptr,  # [max_padded] int32: pair indices by expert, padded with num_pairs
    expert_ids_ptr,  # [num_tiles] int32
    post_pad_ptr,  # [1] int32
    N,
    K,
    num_pairs,
    max_padded,
    stride_am,
    stride_be,
    stride_bn,
    stride_cm,
    A_ROW_DIV: tl.constexpr,  # the pair -> row of a: TOP_K (x's token) or 1 (the pair's own row)
    GATED: tl.constexpr,
    MUL_WEIGHT: tl.constexpr,
    DOT_F32: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_wait(USE_PDL)
    # GROUP_M row tiles of one column band run next to each other (their weight tiles meet in L2)
    pid = tl.program_id(0)
    num_m = tl.cdiv(max_padded, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    band = pid // (GROUP_M * num_n)
    first_m = band * GROUP_M
    rows = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_n)) % rows
    pid_n = (pid % (GROUP_M * num_n)) // rows
    if pid_m * BLOCK_M >= tl.load(post_pad_ptr):
        return  # a tile past the padded pairs: the grid is sized by the bound, not the count
    pair = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))  # [BLOCK_M]
    valid = pair < num_pairs
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    rk = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    a_rows = a_ptr + (pair // A_ROW_DIV).to(tl.int64)[:, None] * stride_am  # [BM, 1]
    b_cols = b_ptr + expert * stride_be + rn[None, :].to(tl.int64) * stride_bn  # [1, BN]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        kk = k + rk
        a = tl.load(a_rows + kk[None, :], mask=valid[:, None] & (kk[None, :] < K), other=0.0)  # [BM, BK]
        b_mask = (kk[:, None] < K) & (rn[None, :] < N)
        b = tl.load(b_cols + kk[:, None], mask=b_mask, other=0.0)  # [BK, BN]
        if DOT_F32:  # Triton runs on CPU tensors only in its interpreter, whose bf16/fp16 dot is wrong
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        if GATED:
            up = tl.load(b_cols + N * stride_bn + kk[:, None], mask=b_mask, other=0.0)  # [BK, BN]
            if DOT_F32:
                up = up.to(tl.float32)
            acc_up = tl.dot(a, up, acc_up, input_precision=PRECISION)
    if GATED:
        acc = _silu_mul(acc, acc_up)
    if MUL_WEIGHT:
        acc *= tl.load(topk_w_ptr + pair, mask=valid, other=0.0)[:, None]
    out = c_ptr + pair.to(tl.int64)[:, None] * stride_cm + rn[None, :]
    tl.store(out, acc.to(c_ptr.dtype.element_ty), mask=valid[:, None] & (rn[None, :] < N))


@triton.jit
def _moe_gemv_gate_up_kernel(
    x_ptr,  # [n, K]
    w_ptr,  # [E, 2N, K] w13: gate rows, then up rows
    ids_ptr,  # [n * TOP_K] int32
    out_ptr,  # [n * TOP_K, N]: silu(gate) * up
    N,
    K,
    stride_xm,
    stride_we,
    stride_wn,
    stride_om,
    TOP_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """One (token, pick) pair a program row (axis 0), ``BLOCK_N`` gate and up rows of its expert a program."""
    pdl_wait(USE_PDL)
    pair = tl.program_id(0).to(tl.int64)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    rk = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    expert = tl.load(ids_ptr + pair).to(tl.int64)
    x_row = x_ptr + (pair // TOP_K) * stride_xm
    gate_rows = w_ptr + expert * stride_we + rn[:, None].to(tl.int64) * stride_wn  # [BN, 1]
    up_rows = gate_rows + N * stride_wn
    acc_gate = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        kk = k + rk
        x = tl.load(x_row + kk, mask=kk < K, other=0.0).to(tl.float32)[None, :]  # [1, BK]
        mask = (rn[:, None] < N) & (kk[None, :] < K)
        acc_gate += tl.load(gate_rows + kk[None, :], mask=mask, other=0.0).to(tl.float32) * x  # [BN, BK]
        acc_up += tl.load(up_rows + kk[None, :], mask=mask, other=0.0).to(tl.float32) * x  # [BN, BK]
    out = _silu_mul(tl.sum(acc_gate, 1), tl.sum(acc_up, 1))  # [BLOCK_N]
    tl.store(out_ptr + pair * stride_om + rn, out.to(out_ptr.dtype.element_ty), mask=rn < N)


@triton.jit
def _moe_gemv_down_kernel(
    a_ptr,  # [n * TOP_K, K] the activations
    w_ptr,  # [E, N, K] w2
    ids_ptr,  # [n * TOP_K] int32
    topk_w_ptr,  # [n * TOP_K] float32
    out_ptr,  # [n, N]
    N,
    K,
    stride_am,
    stride_we,
    stride_wn,
    stride_om,
    TOP_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """One token a program row (axis 0), ``BLOCK_N`` output columns a program, its picks summed in order."""
    pdl_wait(USE_PDL)
    token = tl.program_id(0).to(tl.int64)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    rk = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        pair = token * TOP_K + j
        expert = tl.load(ids_ptr + pair).to(tl.int64)
        weight = tl.load(topk_w_ptr + pair)
        w_rows = w_ptr + expert * stride_we + rn[:, None].to(tl.int64) * stride_wn  # [BN, 1]
        for k in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
            kk = k + rk
            a = tl.load(a_ptr + pair * stride_am + kk, mask=kk < K, other=0.0).to(tl.float32) * weight  # [BK]
            w = tl.load(w_rows + kk[None, :], mask=(rn[:, None] < N) & (kk[None, :] < K), other=0.0)  # [BN, BK]
            acc += w.to(tl.float32) * a[None, :]
    out = tl.sum(acc, 1)  # [BLOCK_N]
    tl.store(out_ptr + token * stride_om + rn, out.to(out_ptr.dtype.element_ty), mask=rn < N)


def _check_moe_args(x, w13, w2, topk_weights, topk_ids) -> None:
    if x.dim() != 2 or w13.dim() != 3 or w2.dim() != 3:
        raise ValueError(f"fused_moe needs x [n, H], w13 [E, 2I, H] and w2 [E, H, I], got {tuple(x.shape)}, "
                         f"{tuple(w13.shape)} and {tuple(w2.shape)}")
    n, hidden = x.shape
    num_experts, two_i, _ = w13.shape
    if w13.shape[2] != hidden or two_i % 2 or tuple(w2.shape) != (num_experts, hidden, two_i // 2):
        raise ValueError(f"fused_moe: w13 {tuple(w13.shape)} and w2 {tuple(w2.shape)} do not fit x [n, {hidden}] "
                         f"(w13 [E, 2I, H], w2 [E, H, I])")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != n or topk_weights.shape != topk_ids.shape:
        raise ValueError(f"topk_weights and topk_ids must both be [{n}, top_k], got {tuple(topk_weights.shape)} "
                         f"and {tuple(topk_ids.shape)}")
    if w13.dtype != x.dtype or w2.dtype != x.dtype:
        raise ValueError(f"fused_moe_triton needs weights in x's dtype {x.dtype}, got {w13.dtype} and {w2.dtype}")
    if x.stride(1) != 1 or w13.stride(2) != 1 or w2.stride(2) != 1 or w13.stride(1) != hidden or w2.stride(1) != w2.shape[2]:
        raise ValueError("fused_moe_triton needs x and each expert's weight with contiguous rows")


def fused_moe_triton(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                     topk_ids: torch.Tensor, config: dict | None = None, *, decode: bool | None = None,
                     decode_tiles: tuple[tuple[int, int, int, int], tuple[int, int, int, int]] | None = None,
                     ) -> torch.Tensor:
    """The MoE layer's output ``[n, H]`` in ``x``'s dtype for ``x`` [n, H], ``w13`` [E, 2I, H] (gate rows, then
    up rows), ``w2`` [E, H, I], ``topk_weights`` [n, top_k] and ``topk_ids`` [n, top_k] (``select_experts``).

    ``config``: the grouped GEMMs' tiles (``fused_moe_config.KEYS``), else the tuned file's or the default.
    ``decode``: force the decode kernels (True) or the grouped GEMMs (False); None picks by the number of pairs
    (``fused_moe_config.use_decode``). ``decode_tiles``: the decode kernels' ``(gate/up, down)`` tiles
    ``(BLOCK_N, BLOCK_K, NUM_STAGES, num_warps)``, else ``decode_config``'s.
    """
    _check_moe_args(x, w13, w2, topk_weights, topk_ids)
    n, hidden = x.shape
    num_experts, two_i, _ = w13.shape
    inter, top_k = two_i // 2, topk_ids.shape[1]
    out = torch.empty(n, hidden, dtype=x.dtype, device=x.device)  # [n, H]
    if n == 0:
        return out
    ids = topk_ids.to(torch.int32).contiguous().view(-1)  # [n * top_k]
    weights = topk_weights.to(torch.float32).contiguous().view(-1)  # [n * top_k]
    pdl = pdl_options(x)
    if decode is None:
        decode = use_decode(n * top_k)
    if decode:
        (bn1, bk1, st1, wp1), (bn2, bk2, st2, wp2) = decode_tiles or (decode_config(inter, hidden),
                                                                      decode_config(hidden, inter))
        act = torch.empty(n * top_k, inter, dtype=x.dtype, device=x.device)  # [n * top_k, I]
        _moe_gemv_gate_up_kernel[(n * top_k, triton.cdiv(inter, bn1))](
            x, w13, ids, act, inter, hidden, x.stride(0), w13.stride(0), w13.stride(1), act.stride(0),
            TOP_K=top_k, BLOCK_N=bn1, BLOCK_K=bk1, NUM_STAGES=st1, num_warps=wp1, **pdl)
        _moe_gemv_down_kernel[(n, triton.cdiv(hidden, bn2))](
            act, w2, ids, weights, out, hidden, inter, act.stride(0), w2.stride(0), w2.stride(1), out.stride(0),
            TOP_K=top_k, BLOCK_N=bn2, BLOCK_K=bk2, NUM_STAGES=st2, num_warps=wp2, **pdl)
        return out
    if config is None:
        config = get_config(n, num_experts, inter, top_k, device_name(x.device) if x.is_cuda else None)
    cfg = check_config(config)
    bm, bn, bk = cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_N"], cfg["BLOCK_SIZE_K"]
    sorted_ids, expert_ids, post_pad = moe_align_block_size(ids.view(n, top_k), bm, num_experts)
    max_padded = sorted_ids.numel()
    num_m = triton.cdiv(max_padded, bm)
    common = dict(DOT_F32=x.device.type == "cpu" and x.dtype != torch.float32,
                  PRECISION="ieee" if x.dtype == torch.float32 else "tf32", BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                  GROUP_M=cfg["GROUP_SIZE_M"], NUM_STAGES=cfg["num_stages"], num_warps=cfg["num_warps"], **pdl)
    act = torch.empty(n * top_k, inter, dtype=x.dtype, device=x.device)  # [n * top_k, I]
    _moe_gemm_kernel[(num_m * triton.cdiv(inter, bn),)](
        x, w13, act, weights, sorted_ids, expert_ids, post_pad, inter, hidden, n * top_k, max_padded,
        x.stride(0), w13.stride(0), w13.stride(1), act.stride(0), A_ROW_DIV=top_k, GATED=True, MUL_WEIGHT=False,
        **common)
    picks = torch.empty(n, top_k, hidden, dtype=x.dtype, device=x.device)  # [n, top_k, H]
    _moe_gemm_kernel[(num_m * triton.cdiv(hidden, bn),)](
        act, w2, picks, weights, sorted_ids, expert_ids, post_pad, hidden, inter, n * top_k, max_padded,
        act.stride(0), w2.stride(0), w2.stride(1), hidden, A_ROW_DIV=1, GATED=False, MUL_WEIGHT=True, **common)
    return torch.sum(picks, dim=1, out=out)
