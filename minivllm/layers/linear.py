"""Linear layers that shard their weights across tensor-parallel ranks.

Each parameter carries a ``weight_loader(param, full_checkpoint_tensor[, shard_id])`` that
copies this rank's slice of the full (unsharded) checkpoint tensor into it.
"""

from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F
from torch import nn

from minivllm.distributed.group import TPGroup, divide, rank_and_size

_HAS_TRITON = importlib.util.find_spec("triton") is not None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear``, or the Triton GEMV for the few-row inputs of decoding on GPUs (``kernels/gemv.py``)."""
    if _HAS_TRITON and x.is_cuda:
        from minivllm.kernels.gemv import gemv  # here: triton is an optional dependency
        from minivllm.kernels.gemv_config import use_gemv

        if use_gemv(x, weight):
            return gemv(x, weight, bias)
    return F.linear(x, weight, bias)


class LinearBase(nn.Module):
    """A linear layer whose weight may be this rank's slice along ``tp_dim`` (None: replicated)."""

    def __init__(self, input_size: int, output_size: int, bias: bool, tp_dim: int | None,
                 tp_group: TPGroup | None = None):
        super().__init__()
        self.tp_group, self.tp_dim = tp_group, tp_dim
        self.tp_rank, self.tp_size = rank_and_size(tp_group)
        self.weight = nn.Parameter(torch.empty(output_size, input_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        self.quant_method = None  # set once, before loading, by ``quantization.apply_quantization``
        self.quantizable = True
        self.lora = None  # its LoRA slots (``minivllm.lora.layers.LoRALinear``) when the engine serves adapters
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        if self.tp_dim is not None and self.tp_size > 1:
            shard = param.shape[self.tp_dim]
            loaded = loaded.narrow(self.tp_dim, self.tp_rank * shard, shard)
        param.data.copy_(loaded)

    def input_quant(self, x: torch.Tensor) -> int | None:
        """How the kernel producing this layer's input ``x`` ([rows, ...]) should hand it over: None as it is, else
        quantized to FP8 (0: per row; ``g``: per row and ``g`` columns), see ``Fp8LinearMethod.input_quant``."""
        if self.quant_method is None:
            return None
        return self.quant_method.input_quant(self, x.shape[0], x.device)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W^T + b`` on this rank's weight (FP8 through its quantization method), plus each token's LoRA
        delta when the layer has LoRA slots (before any all-reduce: a row-parallel delta is a partial sum too)."""
        if self.quant_method is not None:
            return self.quant_method.apply(self, x, self.bias)
        y = linear(x, self.weight, self.bias)
        if self.lora is not None:
            self.lora.apply(x, y)
        return y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x)


class ReplicatedLinear(LinearBase):
    """The whole weight on every rank. ``quantizable=False``: kept in the model's dtype under FP8 (a router)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False, quantizable: bool = True):
        super().__init__(input_size, output_size, bias, tp_dim=None)
        self.quantizable = quantizable


class ColumnParallelLinear(LinearBase):
    """Output features split across ranks; no communication."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False, tp_group: TPGroup | None = None):
        super().__init__(input_size, divide(output_size, rank_and_size(tp_group)[1]), bias, 0, tp_group)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs in one matmul (gate and up); each shard split per rank."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False,
                 tp_group: TPGroup | None = None):
        self.output_sizes = output_sizes
        super().__init__(input_size, sum(output_sizes), bias, tp_group)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: int) -> None:
        offset = divide(sum(self.output_sizes[:shard_id]), self.tp_size)
        size = divide(self.output_sizes[shard_id], self.tp_size)
        loaded = loaded.narrow(0, self.tp_rank * size, size)
        param.data.narrow(0, offset, size).copy_(loaded)


class QKVParallelLinear(ColumnParallelLinear):
    """Fused q/k/v projection with GQA head splitting.

    Query heads split evenly across ranks. KV heads split too when there are at least as many
    as ranks; otherwise each KV head is replicated on ``tp_size / num_kv_heads`` ranks.
    """

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool = False,
                 tp_group: TPGroup | None = None):
        size = rank_and_size(tp_group)[1]
        self.head_dim = head_dim
        self.num_heads = divide(num_heads, size)
        if num_kv_heads >= size:
            self.num_kv_heads = divide(num_kv_heads, size)
        else:
            divide(size, num_kv_heads)
            self.num_kv_heads = 1
        self.num_kv_replicas = max(1, size // num_kv_heads)
        out = (self.num_heads + 2 * self.num_kv_heads) * head_dim
        LinearBase.__init__(self, hidden_size, out, bias, 0, tp_group)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str) -> None:
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        if shard_id == "q":
            offset, size, start = 0, q_size, self.tp_rank * q_size
        else:
            offset = q_size if shard_id == "k" else q_size + kv_size
            size, start = kv_size, (self.tp_rank // self.num_kv_replicas) * kv_size
        param.data.narrow(0, offset, size).copy_(loaded.narrow(0, start, size))


class RowParallelLinear(LinearBase):
    """Input features split across ranks; partial outputs summed with an all-reduce (``reduce_results=False``:
    left to the consumer, an RMSNorm with a ``reduce_group``)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False, reduce_results: bool = True,
                 tp_group: TPGroup | None = None):
        super().__init__(divide(input_size, rank_and_size(tp_group)[1]), output_size, bias, 1, tp_group)
        self.reduce_results = reduce_results

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        if param.dim() == 1:  # bias: added once, on rank 0
            param.data.copy_(loaded if self.tp_rank == 0 else torch.zeros_like(loaded))
            return
        super().weight_loader(param, loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.matmul(x)
        if self.tp_size > 1 and self.reduce_results:
            self.tp_group.all_reduce(y)
            y = y.to(x.dtype)  # an FP8 layer's partial sums come in float64 on the CPU
        return y
