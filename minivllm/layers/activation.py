"""SiLU-and-multiply for the gated MLP."""

import torch
import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    """``silu(gate) * up``; ``fused=True`` runs one Triton kernel."""

    def __init__(self, fused: bool = False):
        super().__init__()
        self.fused = fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [n, 2 * d] -> [n, d]
        if self.fused:
            from minivllm.kernels.fused_act import silu_and_mul

            return silu_and_mul(x)
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
