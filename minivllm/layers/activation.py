"""SiLU-and-multiply for the gated MLP."""

import torch
import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    """``silu(gate) * up``; ``fused=True`` runs one Triton kernel."""

    def __init__(self, fused: bool = False):
        super().__init__()
        self.fused = fused

    def forward(self, x: torch.Tensor, quant: int | None = None):  # [n, 2 * d] -> [n, d]
        """``quant`` (the down projection's ``input_quant``): the fused path returns ``[n, d]`` quantized to FP8
        in the same kernel, as an ``Fp8Activation`` (0: one scale per row, ``g``: per ``g`` columns)."""
        if self.fused and quant is not None:
            from minivllm.kernels.fused_quant import silu_and_mul_fp8
            from minivllm.layers.quantization.fp8 import Fp8Activation

            return Fp8Activation(*silu_and_mul_fp8(x, quant or None), x.dtype)
        if self.fused:
            from minivllm.kernels.fused_act import silu_and_mul

            return silu_and_mul(x)
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up


class GeluAndMul(nn.Module):
    """``gelu(gate) * up`` (Gemma's MLP); ``approximate``: "tanh" (``gelu_pytorch_tanh``) or "none" (erf)."""

    def __init__(self, approximate: str = "tanh"):
        super().__init__()
        if approximate not in ("tanh", "none"):
            raise ValueError(f"approximate must be 'tanh' or 'none', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [n, 2 * d] -> [n, d]
        gate, up = x.chunk(2, dim=-1)
        return F.gelu(gate, approximate=self.approximate) * up
