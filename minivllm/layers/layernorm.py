"""RMSNorm, optionally fused with the residual add."""

from __future__ import annotations

import torch
from torch import nn

from minivllm.distributed.group import TPGroup


class RMSNorm(nn.Module):
    """RMSNorm; ``fused=True`` runs one Triton kernel (add + norm), the torch code is the reference.

    ``reduce_group`` (tensor parallel): an ``x`` given with a residual is a row-parallel layer's partial
    output, summed over this group's ranks here first (with the add and norm in one kernel where the
    custom all-reduce takes it).
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, fused: bool = False,
                 reduce_group: TPGroup | None = None):
        super().__init__()
        self.eps = eps
        self.fused = fused
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.tp_group = reduce_group

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x.to(dtype) * self.weight

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, quant: int | None = None):
        """``x + residual`` is normalised and also returned as the new residual (HF order of ops).

        ``quant`` (the consuming FP8 layer's ``input_quant``): the fused path returns the normalised rows
        quantized to FP8 in the same kernel, as an ``Fp8Activation`` (0: one scale per row, ``g``: per ``g``
        columns). NOTE: the fused path writes in place into ``x`` and ``residual`` (both are activations
        this layer owns); without a residual it writes a new tensor, since ``x`` becomes the residual.
        """
        if self.tp_group is not None and residual is not None:
            if not self.fused:
                self.tp_group.all_reduce(x)
                x = x.to(residual.dtype)  # an FP8 layer's partial sums come in float64 on the CPU
            elif (done := self.tp_group.all_reduce_add_rms_norm(x, residual, self.weight, self.eps)) is not None:
                return done
        if self.fused and quant is not None:
            return self._forward_fp8(x, residual, quant)
        if self.fused:
            from minivllm.kernels.fused_norm import fused_add_rms_norm, rms_norm

            if residual is None:
                return rms_norm(x, self.weight, self.eps)
            return fused_add_rms_norm(x, residual, self.weight, self.eps, inplace=True)
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x

    def _forward_fp8(self, x: torch.Tensor, residual: torch.Tensor | None, quant: int):
        from minivllm.kernels.fused_quant import fused_add_rms_norm_fp8, rms_norm_fp8
        from minivllm.layers.quantization.fp8 import Fp8Activation

        group = quant or None
        if residual is None:
            x8, scale = rms_norm_fp8(x, self.weight, self.eps, group)
            return Fp8Activation(x8, scale, x.dtype)
        x8, scale, residual = fused_add_rms_norm_fp8(x, residual, self.weight, self.eps, group)
        return Fp8Activation(x8, scale, x.dtype), residual


class ShardedRMSNorm(RMSNorm):
    """RMSNorm over a whole projection's output whose columns are split across tensor-parallel ranks (OLMoE's
    q_norm and k_norm, over all heads at once): this rank holds slice ``shard`` of ``num_shards`` equal ones.

    The sum of squares is all-reduced over ``tp_group`` and divided by ``replicas`` (how many ranks hold each
    slice: a KV head replicated over ranks), so every rank normalises by the whole row's mean square.
    """

    def __init__(self, full_size: int, eps: float, tp_group: TPGroup | None = None, num_shards: int = 1,
                 shard: int = 0, replicas: int = 1):
        super().__init__(full_size // num_shards, eps)
        self.full_size, self.shard, self.replicas = full_size, shard, replicas
        self.group = tp_group
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        size = param.shape[0]
        param.data.copy_(loaded.narrow(0, self.shard * size, size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [n, full_size / num_shards]
        if self.group is None:
            return self._norm(x)
        dtype = x.dtype
        x = x.float()
        sum_sq = x.pow(2).sum(-1, keepdim=True)  # [n, 1]
        self.group.all_reduce(sum_sq)
        x = x * torch.rsqrt(sum_sq / (self.replicas * self.full_size) + self.eps)
        return x.to(dtype) * self.weight


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm: ``normalise(x) * (1 + weight)`` in float32, rounded to x's dtype once at the end (the
    checkpoint stores ``weight`` as an offset from one).

    With a ``residual``, ``x + residual`` (in x's dtype) is normalised and also returned as the new residual.
    ``fused=True`` runs the Triton RMSNorm with the weight ``1 + weight`` in float32; that kernel rounds the
    normalised row to x's dtype before the multiply, so half-precision results may differ from the torch code
    in the last bit.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, fused: bool = False):
        super().__init__()
        self.eps, self.fused = eps, fused
        self.weight = nn.Parameter(torch.zeros(hidden_size), requires_grad=False)
        self._scale: torch.Tensor | None = None

    def scale(self) -> torch.Tensor:
        """``1 + weight`` in float32 [hidden], the weight the fused kernels take. NOTE: computed at the first
        call and kept, so the weights must be loaded by then (the engine's first forward comes after loading)."""
        if self._scale is None:
            self._scale = 1.0 + self.weight.float()
        return self._scale

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * (1.0 + self.weight.float())).to(x.dtype)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """``x`` [..., hidden] -> normalised; with ``residual``, (normalised ``x + residual``, ``x + residual``).
        NOTE: the fused path with a residual writes in place into ``x`` and ``residual``."""
        if self.fused:
            from minivllm.kernels.fused_norm import fused_add_rms_norm, rms_norm

            if residual is None:
                return rms_norm(x, self.scale(), self.eps)
            return fused_add_rms_norm(x, residual, self.scale(), self.eps, inplace=True)
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x
