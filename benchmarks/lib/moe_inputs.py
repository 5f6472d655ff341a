"""Inputs of one MoE layer for the fused MoE benchmark and tuning scripts (CUDA): the shipped models' shapes,
random bf16, FP8 or MXFP4 experts, activations and a routing from random router logits (near-uniform expert loads, as a
trained router's are on average)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# name -> (E, top_k, hidden, moe intermediate size) at TP=1
MODELS = {
    "qwen3-30b-a3b": (128, 8, 2048, 768),
    "mixtral-8x7b": (8, 2, 4096, 14336),
    "olmoe-1b-7b": (64, 8, 2048, 1024),
    "gpt-oss-20b": (32, 4, 2880, 2880),  # MXFP4 experts (--mxfp4)
    "gpt-oss-120b": (128, 4, 2880, 2880),
}
FP8_BLOCK = (128, 128)  # Qwen3-30B-A3B-FP8's weight_block_size


@dataclass
class MoeShape:
    """One MoE layer's shape on one tensor-parallel rank (each rank holds ``inter / tp`` of every expert)."""

    num_experts: int
    top_k: int
    hidden: int
    inter: int

    @classmethod
    def of(cls, model: str, tp: int = 1) -> MoeShape:
        e, k, h, i = MODELS[model]
        return cls(e, k, h, i // tp)

    def flops(self, m: int) -> float:
        """Multiply-adds times two of ``m`` tokens: gate/up (2I x H) and down (H x I) per pick."""
        return 2.0 * m * self.top_k * 3 * self.hidden * self.inter


def make_weights(shape: MoeShape, fp8: str | None, seed: int = 0,
                 mxfp4: bool = False) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """``(w13 [E, 2I, H], w2 [E, H, I], kwargs)``: bf16, or e4m3 (``fp8`` "block": 128 x 128 block scales,
    "channel": per output channel), or packed MXFP4 (``mxfp4``: uint8 ``[E, N, K/2]``), with the
    ``fused_moe_triton`` keyword arguments of their scales."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    e, h, i = shape.num_experts, shape.hidden, shape.inter
    w13 = torch.randn(e, 2 * i, h, device="cuda", generator=g, dtype=torch.bfloat16) / h**0.5
    w2 = torch.randn(e, h, i, device="cuda", generator=g, dtype=torch.bfloat16) / i**0.5
    if mxfp4:
        from minivllm.kernels.mxfp4 import quantize_mxfp4

        packed = []
        for w in (w13, w2):  # one expert at a time: the quantizer's temporaries are several times the weights
            parts = [quantize_mxfp4(w[j]) for j in range(e)]
            packed.append((torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])))
        (b13, s13), (b2, s2) = packed
        return b13, b2, {"w13_scale": s13, "w2_scale": s2}
    if fp8 is None:
        return w13, w2, {}
    from minivllm.kernels.moe_fp8_weights import quantize_moe_weights_fp8

    block = FP8_BLOCK if fp8 == "block" else None
    q13, s13, q2, s2 = quantize_moe_weights_fp8(w13, w2, block)
    return q13, q2, {"w13_scale": s13, "w2_scale": s2, "block_shape": block}


def make_tokens(shape: MoeShape, m: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x [m, H] bf16, topk_weights [m, k], topk_ids [m, k])`` from random router logits."""
    from minivllm.kernels.moe_topk import select_experts_triton

    g = torch.Generator(device="cuda").manual_seed(seed + m)
    x = torch.randn(m, shape.hidden, device="cuda", generator=g, dtype=torch.bfloat16)
    logits = torch.randn(m, shape.num_experts, device="cuda", generator=g)
    weights, ids = select_experts_triton(logits, shape.top_k, True)
    return x, weights, ids


def weight_bytes_read(shape: MoeShape, ids: torch.Tensor, fp8: bool, mxfp4: bool = False) -> float:
    """The expert weight bytes a step must read at least: every expert some token picked, once (MXFP4: half a
    byte a weight and a byte of scale a 32)."""
    used = ids.unique().numel()
    return used * 3 * shape.hidden * shape.inter * ((0.5 + 1 / 32) if mxfp4 else 1 if fp8 else 2)
