"""RMSNorm, optionally fused with the residual add."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """RMSNorm; ``fused=True`` runs one Triton kernel (add + norm), the torch code is the reference."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, fused: bool = False):
        super().__init__()
        self.eps = eps
        self.fused = fused
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x.to(dtype) * self.weight

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """``x + residual`` is normalised and also returned as the new residual (HF order of ops).

        NOTE: the fused path writes in place into ``x`` and ``residual`` (both are activations
        this layer owns); without a residual it writes a new tensor, since ``x`` becomes the residual.
        """
        if self.fused:
            from minivllm.kernels.fused_norm import fused_add_rms_norm, rms_norm

            if residual is None:
                return rms_norm(x, self.weight, self.eps)
            return fused_add_rms_norm(x, residual, self.weight, self.eps, inplace=True)
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x
