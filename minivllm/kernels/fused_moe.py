"""The fused mixture-of-experts layer in Triton: ``fused_moe_triton`` (and the routing, ``select_experts_triton``).

For each token, ``sum_j topk_weights[t, j] * (w2[e_j] @ (silu(w13[e_j, :I] @ x_t) * (w13[e_j, I:] @ x_t)))`` over
its ``top_k`` experts ``e_j = topk_ids[t, j]``, accumulated in float32, in ``x``'s dtype (the reference is
``fused_moe`` in ``minivllm.kernels.moe_torch``). Two paths, neither reads a value back to the host, so both
run under CUDA-graph capture:

- **grouped** (larger batches): ``moe_align_block_size`` sorts the (token, pick) pairs
  by expert into row tiles of one expert each; GEMM 1 gathers the tile's rows of ``x`` and multiplies them by
  the expert's gate and up rows at once (two accumulators), and applies SiLU-and-mul in its epilogue, so the
  ``[n * top_k, 2I]`` gate/up activations never reach memory (half the intermediate bytes, one launch fewer
  than a separate activation kernel); GEMM 2 (down) multiplies in the router weight and writes each pair's
  row to ``[n, top_k, H]``, and a sum over the picks (float32 inside ``torch.sum``) gives ``[n, H]``:
  deterministic, no atomics. Tiles follow ``fused_moe_config.get_config`` (per E, N, device and batch size).
- **decode** (a few tokens): ``minivllm.kernels.fused_moe_decode``, GEMVs over the picked experts only (no
  alignment, no padding to a tile), two or three launches. Its tiles and the batch size up to which it runs come
  from the device's tuned decode file (``fused_moe_config.decode_config``), else defaults.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.kernels.fp8_block_gemm import quantize_fp8_per_group
from minivllm.kernels.fp8_quant import quantize_fp8_per_token
from minivllm.kernels.fused_moe_config import (
    check_config,
    check_decode_tiles,
    decode_config,
    device_name,
    get_config,
    use_decode,
)
from minivllm.kernels.fused_moe_decode import ACTIVATION_IDS, fused_moe_decode, gated_act
from minivllm.kernels.moe_align import moe_align_block_size
from minivllm.kernels.moe_topk import select_experts_triton
from minivllm.kernels.mxfp4_dequant import load_mxfp4
from minivllm.kernels.pdl import pdl_options, pdl_wait

__all__ = ["fused_moe_triton", "select_experts_triton"]


@triton.jit
def _moe_gemm_kernel(
    a_ptr,  # GEMM 1: x [n, K]; GEMM 2: the activations [n * TOP_K, K] (bf16/fp16/fp32, or FP8)
    b_ptr,  # [E, N (x2 if GATED), K]: w13 (gate rows, then up rows) or w2; MXFP4: [E, N (x2), K/2] uint8
    c_ptr,  # [n * TOP_K, N]
    a_scale_ptr,  # FP8: [rows of a, cdiv(K, GROUP_K)] or [rows of a, 1] float32; else a dummy
    b_scale_ptr,  # FP8: [E, N blocks (x2), K blocks] or [E, N (x2)] float32; MXFP4: [E, N (x2), K/32] uint8
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
    stride_asm,
    stride_ask,  # 0 with one activation scale a row
    stride_bse,
    stride_bsn,
    stride_bsk,  # 0 with one weight scale a row
    up_scale_row,  # GATED FP8: the first scale row of the up half
    A_ROW_DIV: tl.constexpr,  # the pair -> row of a: TOP_K (x's token) or 1 (the pair's own row)
    GATED: tl.constexpr,
    MUL_WEIGHT: tl.constexpr,
    FP8: tl.constexpr,
    MXFP4: tl.constexpr,  # weights dequantized in registers to a's dtype, a unquantized
    GROUP_N: tl.constexpr,  # FP8: weight rows a scale (1 per channel)
    GROUP_K: tl.constexpr,  # FP8: columns a scale; a multiple of BLOCK_K
    DOT_F32: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    USE_PDL: tl.constexpr,
    bias_ptr=None,  # HAS_BIAS: [E, N (x2 if GATED)] (GATED: the gate biases, then the up biases)
    stride_bias_e=0,
    HAS_BIAS: tl.constexpr = False,
    ACTIVATION: tl.constexpr = 0,  # GATED: ``gated_act``'s
    ALPHA: tl.constexpr = 1.702,
    LIMIT: tl.constexpr = 7.0,
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
    a_row = (pair // A_ROW_DIV).to(tl.int64)  # [BM]
    a_rows = a_ptr + a_row[:, None] * stride_am  # [BM, 1]
    b_cols = b_ptr + expert * stride_be + rn[None, :].to(tl.int64) * stride_bn  # [1, BN]
    b_rows = b_ptr + expert * stride_be + rn[:, None].to(tl.int64) * stride_bn  # [BN, 1] (MXFP4)
    as_rows = a_scale_ptr + a_row * stride_asm  # [BM] (FP8)
    bs_cols = b_scale_ptr + expert * stride_bse + (rn // GROUP_N) * stride_bsn  # [BN] (FP8)
    bs_up = bs_cols + up_scale_row * stride_bsn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        kk = k + rk
        a = tl.load(a_rows + kk[None, :], mask=valid[:, None] & (kk[None, :] < K), other=0.0)  # [BM, BK]
        b_mask = (kk[:, None] < K) & (rn[None, :] < N)
        if MXFP4:
            b = tl.trans(load_mxfp4(b_rows, bs_cols[:, None], k, K, rn[:, None] < N, stride_bsk, BLOCK_K))
            b = b.to(a.dtype)  # [BK, BN]
        else:
            b = tl.load(b_cols + kk[:, None], mask=b_mask, other=0.0)  # [BK, BN]
        if DOT_F32:  # Triton runs on CPU tensors only in its interpreter, whose bf16/fp16/fp8 dot is wrong
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        if FP8:
            # NOTE: GROUP_K is a multiple of BLOCK_K, so the whole K tile lies in scale group k // GROUP_K
            a_s = tl.load(as_rows + (k // GROUP_K) * stride_ask, mask=valid, other=0.0)  # [BM]
            b_s = tl.load(bs_cols + (k // GROUP_K) * stride_bsk, mask=rn < N, other=0.0)  # [BN]
            acc += tl.dot(a, b) * (a_s[:, None] * b_s[None, :])
        else:
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
        if GATED:
            if MXFP4:
                up = tl.trans(load_mxfp4(b_rows + N * stride_bn, bs_up[:, None], k, K, rn[:, None] < N, stride_bsk,
                                         BLOCK_K)).to(a.dtype)  # [BK, BN]
            else:
                up = tl.load(b_cols + N * stride_bn + kk[:, None], mask=b_mask, other=0.0)  # [BK, BN]
            if DOT_F32:
                up = up.to(tl.float32)
            if FP8:
                up_s = tl.load(bs_up + (k // GROUP_K) * stride_bsk, mask=rn < N, other=0.0)  # [BN]
                acc_up += tl.dot(a, up) * (a_s[:, None] * up_s[None, :])
            else:
                acc_up = tl.dot(a, up, acc_up, input_precision=PRECISION)
    if HAS_BIAS:  # before the activation (GEMM 1) or the router weight (GEMM 2), as transformers adds them
        b_row = bias_ptr + expert * stride_bias_e + rn  # [BN]
        acc += tl.load(b_row, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        if GATED:
            acc_up += tl.load(b_row + N, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    if GATED:
        acc = gated_act(acc, acc_up, ACTIVATION, ALPHA, LIMIT)
    if MUL_WEIGHT:
        acc *= tl.load(topk_w_ptr + pair, mask=valid, other=0.0)[:, None]
    out = c_ptr + pair.to(tl.int64)[:, None] * stride_cm + rn[None, :]
    tl.store(out, acc.to(c_ptr.dtype.element_ty), mask=valid[:, None] & (rn[None, :] < N))


class _Scales:
    """How an FP8 expert weight's scales are laid out, as the kernels address them: ``strides`` (expert, row
    block, K block; 0 along K per channel), ``group_n`` / ``group_k`` (rows and columns a scale) and ``up_row``
    (the first scale row of w13's up half). Unquantized weights: dummies (the kernels ignore them)."""

    def __init__(self, scale: torch.Tensor | None, block: tuple[int, int] | None, rows: int, gated: bool):
        self.tensor = scale
        if scale is None:
            self.strides, self.group_n, self.group_k, self.up_row = (0, 0, 0), 1, 1 << 30, 0
        elif block is None:  # [E, rows (x2)]
            self.strides, self.group_n, self.group_k = (scale.stride(0), scale.stride(1), 0), 1, 1 << 30
            self.up_row = rows if gated else 0
        else:  # [E, row blocks (x2), K blocks]
            self.strides, (self.group_n, self.group_k) = (scale.stride(0), scale.stride(1), scale.stride(2)), block
            self.up_row = triton.cdiv(rows, block[0]) if gated else 0


def _check_moe_args(x, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale, block) -> None:
    if x.dim() != 2 or w13.dim() != 3 or w2.dim() != 3:
        raise ValueError(f"fused_moe needs x [n, H], w13 [E, 2I, H] and w2 [E, H, I], got {tuple(x.shape)}, "
                         f"{tuple(w13.shape)} and {tuple(w2.shape)}")
    n, hidden = x.shape
    num_experts, two_i, _ = w13.shape
    inter = two_i // 2
    mxfp4 = w13.dtype == torch.uint8
    pack = 2 if mxfp4 else 1  # values a stored element along K
    if w13.shape[2] * pack != hidden or two_i % 2 or tuple(w2.shape) != (num_experts, hidden, inter // pack):
        raise ValueError(f"fused_moe: w13 {tuple(w13.shape)} and w2 {tuple(w2.shape)} do not fit x [n, {hidden}] "
                         f"(w13 [E, 2I, H], w2 [E, H, I])")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != n or topk_weights.shape != topk_ids.shape:
        raise ValueError(f"topk_weights and topk_ids must both be [{n}, top_k], got {tuple(topk_weights.shape)} "
                         f"and {tuple(topk_ids.shape)}")
    if w13.stride(2) != 1 or w2.stride(2) != 1 or w13.stride(1) != w13.shape[2] or w2.stride(1) != w2.shape[2]:
        raise ValueError("fused_moe_triton needs each expert's weight with contiguous rows (w13[e], w2[e] contiguous)")
    fp8 = w13.dtype == torch.float8_e4m3fn
    if w2.dtype != w13.dtype or (not fp8 and not mxfp4 and w13.dtype != x.dtype):
        raise ValueError(f"fused_moe_triton needs weights in x's dtype {x.dtype}, both float8_e4m3fn or both uint8 "
                         f"(MXFP4), got {w13.dtype} and {w2.dtype}")
    if mxfp4:
        _check_mxfp4_scales(w13, w2, w13_scale, w2_scale, block)
        return
    if not fp8:
        if w13_scale is not None or w2_scale is not None:
            raise ValueError("w13_scale and w2_scale go with float8_e4m3fn weights only")
        return
    if block is None:
        want13, want2 = (num_experts, two_i), (num_experts, hidden)
    else:
        bn, bk = block
        if bk & (bk - 1) or bk < 32:
            raise ValueError(f"block_shape's K block must be a power of two of at least 32, got {block}")
        want13 = (num_experts, 2 * triton.cdiv(inter, bn), triton.cdiv(hidden, bk))
        want2 = (num_experts, triton.cdiv(hidden, bn), triton.cdiv(inter, bk))
    for name, scale, want in (("w13_scale", w13_scale, want13), ("w2_scale", w2_scale, want2)):
        if scale is None or tuple(scale.shape) != want or scale.dtype != torch.float32:
            got = None if scale is None else (tuple(scale.shape), scale.dtype)
            raise ValueError(f"{name} must be float32 {want} for FP8 weights with block_shape {block}, got {got}")


def _check_mxfp4_scales(w13, w2, w13_scale, w2_scale, block) -> None:
    """ValueError unless MXFP4 ``w13`` [E, 2I, H/2] / ``w2`` [E, H, I/2] come with uint8 scales [E, 2I, H/32] /
    [E, H, I/32] with contiguous rows, and no ``block_shape``."""
    if block is not None:
        raise ValueError(f"block_shape goes with FP8 weights; MXFP4 weights have a scale a 32 columns, got {block}")
    for name, w, scale in (("w13_scale", w13, w13_scale), ("w2_scale", w2, w2_scale)):
        if w.shape[2] % 16:
            raise ValueError(f"MXFP4 weights need K a multiple of 32, got {2 * w.shape[2]}")
        want = (*w.shape[:2], w.shape[2] // 16)
        if scale is None or tuple(scale.shape) != want or scale.dtype != torch.uint8 or scale.stride(2) != 1:
            got = None if scale is None else (tuple(scale.shape), scale.dtype)
            raise ValueError(f"{name} must be uint8 {want} with contiguous rows for MXFP4 weights, got {got}")


def fused_moe_triton(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                     topk_ids: torch.Tensor, config: dict | None = None, *, w13_scale: torch.Tensor | None = None,
                     w2_scale: torch.Tensor | None = None, block_shape: tuple[int, int] | None = None,
                     decode: bool | None = None,
                     decode_tiles: tuple[tuple[int, ...], tuple[int, ...]] | None = None,
                     w13_bias: torch.Tensor | None = None, w2_bias: torch.Tensor | None = None,
                     activation: str = "silu", swiglu_alpha: float = 1.702, swiglu_limit: float = 7.0,
                     ) -> torch.Tensor:
    """The MoE layer's output ``[n, H]`` in ``x``'s dtype for ``x`` [n, H], ``w13`` [E, 2I, H] (gate rows, then
    up rows), ``w2`` [E, H, I], ``topk_weights`` [n, top_k] and ``topk_ids`` [n, top_k] (``select_experts``).

    ``config``: the grouped GEMMs' tiles (``fused_moe_config.KEYS``), else the tuned file's or the default.
    ``decode``: force the decode kernels (True) or the grouped GEMMs (False); None picks by the batch size
    (``fused_moe_config.use_decode``). ``decode_tiles``: the decode kernels' tiles, gate/up
    ``(BLOCK_N, BLOCK_K, NUM_STAGES, num_warps)`` and down ``(..., picks)`` (picks a program sums, a divisor of
    top_k; omitted: all), else ``decode_config``'s.

    FP8 experts: ``w13``/``w2`` float8_e4m3fn with float32 scales, per output channel (``block_shape`` None:
    ``w13_scale`` [E, 2I], ``w2_scale`` [E, H]) or per ``block_shape = (bn, bk)`` block (``w13_scale``
    [E, 2 * cdiv(I, bn), cdiv(H, bk)]: the gate's blocks, then the up's; ``w2_scale`` [E, cdiv(H, bn),
    cdiv(I, bk)]). The grouped GEMMs quantize their activations per token (per token and ``bk`` columns with
    blocks) and multiply on the FP8 tensor cores; the decode kernels widen the weights in registers and keep
    the activations unquantized.

    gpt-oss's experts: ``w13_bias`` [E, 2I] (gate then up, as ``w13``'s rows) and ``w2_bias`` [E, H] added to
    each projection's float32 accumulator, and ``activation="swigluoai"`` (``moe_torch.expert_activation``),
    all in the kernels' epilogues.

    MXFP4 experts: ``w13`` uint8 [E, 2I, H/2] and ``w2`` uint8 [E, H, I/2] (two e2m1 values a byte) with uint8
    e8m0 scales ``w13_scale`` [E, 2I, H/32] and ``w2_scale`` [E, H, I/32] (``kernels/mxfp4.py``); both paths
    dequantize the weights in registers and keep the activations in ``x``'s dtype.
    """
    _check_moe_args(x, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale, block_shape)
    epilogue13 = moe_epilogue(w13_bias, (w13.shape[0], w13.shape[1]), activation, swiglu_alpha, swiglu_limit)
    epilogue2 = moe_epilogue(w2_bias, (w2.shape[0], w2.shape[1]))
    if x.stride(1) != 1:
        x = x.contiguous()
    n, hidden = x.shape
    num_experts, two_i, _ = w13.shape
    inter, top_k = two_i // 2, topk_ids.shape[1]
    fp8, mxfp4 = w13.dtype == torch.float8_e4m3fn, w13.dtype == torch.uint8
    out = torch.empty(n, hidden, dtype=x.dtype, device=x.device)  # [n, H]
    if n == 0:
        return out
    ids = topk_ids.to(torch.int32).contiguous().view(-1)  # [n * top_k]
    weights = topk_weights.to(torch.float32).contiguous().view(-1)  # [n * top_k]
    # MXFP4: one scale a row and 32 columns, addressed as FP8 blocks of 1 x 32
    s13 = _Scales(w13_scale, (1, 32) if mxfp4 else block_shape, inter, gated=True)
    s2 = _Scales(w2_scale, (1, 32) if mxfp4 else block_shape, hidden, gated=False)
    pdl = pdl_options(x)
    if decode is None:
        decode = use_decode(n, num_experts, inter, hidden, top_k, device_name(x.device) if x.is_cuda else None, fp8)
    act = torch.empty(n * top_k, inter, dtype=x.dtype, device=x.device)  # [n * top_k, I]
    if decode:
        tiles = decode_tiles or decode_config(n, num_experts, inter, hidden, top_k,
                                              device_name(x.device) if x.is_cuda else None, fp8=fp8)
        return fused_moe_decode(x, w13, w2, ids, weights, act, out, s13, s2, check_decode_tiles(tiles, top_k), pdl,
                                epilogue13, epilogue2)
    if config is None:
        config = get_config(n, num_experts, inter, top_k, device_name(x.device) if x.is_cuda else None, fp8=fp8)
    cfg = check_config(config)
    bm, bn, bk = cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_N"], cfg["BLOCK_SIZE_K"]
    if fp8 and block_shape is not None:
        bk = min(bk, block_shape[1])  # NOTE: a K tile must lie in one scale block
    if mxfp4:
        bk = max(bk, 32)  # NOTE: an MXFP4 K tile holds whole groups of 32 columns
    sorted_ids, expert_ids, post_pad = moe_align_block_size(ids.view(n, top_k), bm, num_experts)
    max_padded = sorted_ids.numel()
    num_m = triton.cdiv(max_padded, bm)
    common = dict(FP8=fp8, MXFP4=mxfp4, DOT_F32=x.device.type == "cpu" and (x.dtype != torch.float32 or fp8),
                  PRECISION="ieee" if x.dtype == torch.float32 else "tf32", BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                  GROUP_M=cfg["GROUP_SIZE_M"], NUM_STAGES=cfg["num_stages"], num_warps=cfg["num_warps"], **pdl)
    a1, a1_scale = _quantize(x, block_shape) if fp8 else (x, None)
    _moe_gemm_kernel[(num_m * triton.cdiv(inter, bn),)](
        a1, w13, act, a1_scale if fp8 else act, s13.tensor if fp8 or mxfp4 else act, weights, sorted_ids, expert_ids,
        post_pad, inter, hidden, n * top_k, max_padded, a1.stride(0), w13.stride(0), w13.stride(1), act.stride(0),
        *_act_scale_strides(a1_scale), *s13.strides, s13.up_row, A_ROW_DIV=top_k, GATED=True, MUL_WEIGHT=False,
        GROUP_N=s13.group_n, GROUP_K=s13.group_k if block_shape is not None else bk, **common, **epilogue13)
    a2, a2_scale = _quantize(act, block_shape) if fp8 else (act, None)
    picks = torch.empty(n, top_k, hidden, dtype=x.dtype, device=x.device)  # [n, top_k, H]
    _moe_gemm_kernel[(num_m * triton.cdiv(hidden, bn),)](
        a2, w2, picks, a2_scale if fp8 else act, s2.tensor if fp8 or mxfp4 else act, weights, sorted_ids, expert_ids,
        post_pad, hidden, inter, n * top_k, max_padded, a2.stride(0), w2.stride(0), w2.stride(1), hidden,
        *_act_scale_strides(a2_scale), *s2.strides, 0, A_ROW_DIV=1, GATED=False, MUL_WEIGHT=True,
        GROUP_N=s2.group_n, GROUP_K=s2.group_k if block_shape is not None else bk, **common, **epilogue2)
    return torch.sum(picks, dim=1, out=out)


def moe_epilogue(bias: torch.Tensor | None, shape: tuple[int, int], activation: str | None = None,
                 alpha: float = 1.702, limit: float = 7.0) -> dict:
    """The kernels' bias and activation arguments for one projection (``shape``: its weight's ``[E, rows]``):
    ``{}`` for no bias and SiLU, so the unbiased kernels compile as before. ValueError for a bias of another
    shape or an unknown activation."""
    if activation is not None and activation not in ACTIVATION_IDS:
        raise ValueError(f"activation must be one of {tuple(ACTIVATION_IDS)}, got {activation!r}")
    args = {}
    if bias is not None:
        if tuple(bias.shape) != tuple(shape) or bias.stride(1) != 1:
            raise ValueError(f"an expert bias must be a [E, rows] = {tuple(shape)} tensor with contiguous rows, got "
                             f"{tuple(bias.shape)}")
        args.update(bias_ptr=bias, stride_bias_e=bias.stride(0), HAS_BIAS=True)
    if activation not in (None, "silu"):
        args.update(ACTIVATION=ACTIVATION_IDS[activation], ALPHA=float(alpha), LIMIT=float(limit))
    return args


def _quantize(a: torch.Tensor, block: tuple[int, int] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 activations for the grouped GEMMs: per token and ``block[1]`` columns, or per token."""
    return quantize_fp8_per_group(a, block[1]) if block is not None else quantize_fp8_per_token(a)


def _act_scale_strides(scale: torch.Tensor | None) -> tuple[int, int]:
    """(row, K group) strides of an activation scale: 0 along K with one scale a row (or none)."""
    if scale is None:
        return 0, 0
    return scale.stride(0), scale.stride(1) if scale.shape[1] > 1 else 0
