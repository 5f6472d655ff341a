"""FP8 (e4m3) expert weights in the layout ``fused_moe_triton`` reads, from bf16/fp16/fp32 ones (online
``quantization="fp8"`` for MoE layers, and the tests' and benchmarks' FP8 experts).

Each expert's gate, up and down weights are quantized apart, as ``quantize_weight_fp8_ref`` does one linear
weight: one scale per output channel, or per ``block`` of weight rows x columns (Qwen3-30B-A3B-FP8: 128 x 128).
The gate's and up's scales are stacked along the rows, the gate's first, the way the checkpoints' separate
``gate_proj`` / ``up_proj`` scales stack (so a gate block never holds up rows, even when ``I`` is not a
multiple of the block).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minivllm.kernels.torch_backend import FP8_E4M3_MAX


def quantize_weights_fp8(w: torch.Tensor, block: tuple[int, int] | None,
                         amax: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``w`` [E, N, K] -> ``(w8 [E, N, K] float8_e4m3fn, scale float32)``: ``scale`` [E, N] per output channel
    (``block`` None), or [E, cdiv(N, b0), cdiv(K, b1)] per block; ``w ~ w8 * scale``. ``amax`` [E, N] (per
    channel only): each channel's largest magnitude, given (a tensor-parallel rank holding a K-slice of it)."""
    if w.dim() != 3:
        raise ValueError(f"quantize_weights_fp8 needs w [E, N, K], got {tuple(w.shape)}")
    if amax is not None and block is not None:
        raise ValueError("quantize_weights_fp8: amax goes with per-channel scales (block None) only")
    e, n, k = w.shape
    b0, b1 = block if block is not None else (1, k)
    n0, n1 = -(-n // b0), -(-k // b1)
    padded = F.pad(w.float(), (0, n1 * b1 - k, 0, n0 * b0 - n)).view(e, n0, b0, n1, b1)  # [E, n0, b0, n1, b1]
    if amax is None:
        amax = padded.abs().amax(dim=(2, 4))  # [E, n0, n1]
    scale = (amax.float().view(e, n0, n1) / FP8_E4M3_MAX).clamp(min=1e-12)  # [E, n0, n1]
    # NOTE: as quantize_weight_fp8_ref: times the reciprocal per channel, a division per block
    wide = scale[:, :, None, :, None]
    q = (padded * (1.0 / wide) if block is None else padded / wide).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX)
    q = q.view(e, n0 * b0, n1 * b1)[:, :n, :k].to(torch.float8_e4m3fn)  # [E, N, K]
    return q, scale[:, :, 0] if block is None else scale


def quantize_moe_weights_fp8(w13: torch.Tensor, w2: torch.Tensor, block: tuple[int, int] | None,
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(w13_8, w13_scale, w2_8, w2_scale)`` for ``w13`` [E, 2I, H] (gate rows, then up rows) and ``w2``
    [E, H, I]: the gate and up halves quantized apart, their scales stacked (the gate's first)."""
    inter = w13.shape[1] // 2
    gate, gate_s = quantize_weights_fp8(w13[:, :inter], block)
    up, up_s = quantize_weights_fp8(w13[:, inter:], block)
    down, down_s = quantize_weights_fp8(w2, block)
    return torch.cat([gate, up], 1), torch.cat([gate_s, up_s], 1), down, down_s
