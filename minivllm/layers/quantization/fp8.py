"""FP8 linear layers (vLLM's ``Fp8LinearMethod``): e4m3 weights with per-channel or block scales, activations
quantized per token at run time.

``create_weights`` gives a layer FP8 parameters shaped for this rank (a checkpoint stored in FP8);
``process_weights_after_loading`` quantizes the high-precision weights a layer loaded (online FP8, dummy
weights); ``apply`` runs the layer. On CUDA:
- per-channel scales: activations quantized per token, multiplied by ``torch._scaled_mm`` (cuBLASLt FP8, row
  and column scales in its epilogue); where the Triton GEMV takes the rows (decoding), it reads the FP8
  weights and scales its outputs, the activations unquantized;
- block scales: activations quantized per token and group of ``block[1]`` columns, multiplied by the Triton
  block GEMM (``kernels/fp8_block_gemm.py``).
The kernel that produces a layer's input (RMSNorm, SiLU-and-mul) quantizes it itself where
:meth:`Fp8LinearMethod.input_quant` asks; the layer then gets an :class:`Fp8Activation`. The CPU computes what
``fp8_linear_ref`` defines.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from minivllm.config.quantization import Fp8Config
from minivllm.kernels.torch_backend import (
    FP8_E4M3_MAX,
    fp8_linear_ref,
    quantize_fp8_ref,
    quantize_weight_fp8_ref,
)


class Fp8LinearMethod:
    """How a ``LinearBase`` holds and runs FP8 weights under ``config``."""

    def __init__(self, config: Fp8Config):
        self.config = config

    def scale_shape(self, rows: int, cols: int) -> tuple[int, ...]:
        if self.config.weight_block is None:
            return (rows,)
        b0, b1 = self.config.weight_block
        return (-(-rows // b0), -(-cols // b1))

    def create_weights(self, layer: nn.Module) -> None:
        """Give ``layer`` an FP8 ``weight`` and its ``weight_scale`` (for a checkpoint already in FP8)."""
        rows, cols = layer.weight.shape
        block = self.config.weight_block
        if block is not None and layer.tp_size > 1:
            shard = rows if layer.tp_dim == 0 else cols if layer.tp_dim == 1 else None
            unit = block[0] if layer.tp_dim == 0 else block[1]
            if shard is not None and shard % unit:
                raise ValueError(f"an FP8 block of {block} does not divide this rank's {shard} "
                                 f"{'rows' if layer.tp_dim == 0 else 'columns'} at tensor_parallel_size {layer.tp_size}")
        device = layer.weight.device
        layer.weight = nn.Parameter(torch.empty(rows, cols, dtype=torch.float8_e4m3fn, device=device),
                                    requires_grad=False)
        layer.weight.weight_loader = layer.weight_loader
        layer.weight_scale = nn.Parameter(torch.empty(self.scale_shape(rows, cols), dtype=torch.float32,
                                                      device=device), requires_grad=False)
        layer.weight_scale.weight_loader = lambda param, loaded, *shard: self._load_scale(layer, param, loaded, *shard)

    def _load_scale(self, layer: nn.Module, param: nn.Parameter, loaded: torch.Tensor, *shard) -> None:
        """This rank's part of a checkpoint scale, cut as the layer cuts its weight (a block's scale stands for
        ``block`` rows and columns of it)."""
        loaded = loaded.float()
        block = self.config.weight_block
        if block is None:
            loaded = loaded.reshape(-1)  # compressed-tensors stores [N, 1]
            if layer.tp_dim != 0:  # replicated, or a row-parallel layer: every rank has every output channel
                param.data.copy_(loaded)
                return
            layer.weight_loader(param.data.view(-1, 1), loaded.view(-1, 1), *shard)
            return
        b0, b1 = block
        # the scale is spread over the weight's rows (or columns), cut by the weight's own loader, and
        # gathered back; the spread starts from the scale loaded so far (q, k and v arrive one by one)
        if layer.tp_dim == 1:
            tmp = param.data.repeat_interleave(b1, 1)
            layer.weight_loader(tmp, loaded.repeat_interleave(b1, 1).to(tmp.device), *shard)
            param.data.copy_(tmp[:, ::b1])
        else:
            tmp = param.data.repeat_interleave(b0, 0)
            layer.weight_loader(tmp, loaded.repeat_interleave(b0, 0).to(tmp.device), *shard)
            param.data.copy_(tmp[::b0])

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Quantize a layer that loaded high-precision weights (nothing to do for a checkpoint in FP8)."""
        if layer.weight.dtype == torch.float8_e4m3fn:
            return
        w = layer.weight.data
        if self.config.weight_block is None and self._global_scale_needed(layer):
            # NOTE: a row-parallel rank holds a slice of each output channel: the channel's scale is the ranks'
            # largest, so that every rank stores what TP=1 stores
            amax = w.abs().amax(1, keepdim=True).float()  # [N, 1]
            layer.tp_group.all_reduce(amax, "max")
            w8, scale = quantize_fp8_ref(w, scale=(amax / FP8_E4M3_MAX).clamp(min=1e-12))
            scale = scale[:, 0]
        else:
            w8, scale = quantize_weight_fp8_ref(w, self.config.weight_block)
        layer.weight = nn.Parameter(w8, requires_grad=False)
        layer.weight_scale = nn.Parameter(scale.to(w8.device), requires_grad=False)

    def input_quant(self, layer: nn.Module, rows: int, device: torch.device) -> int | None:
        """How the kernel that produces this layer's input (RMSNorm, SiLU-and-mul) should hand it over: None in
        the activations' dtype, 0 quantized per token, ``g`` per token and group of ``g`` columns."""
        block = self.config.weight_block
        if device.type != "cuda":
            return None
        if block is not None:
            return block[1]
        from minivllm.kernels.gemv_config import gemv_takes

        if gemv_takes(rows, layer.weight.numel()) or self._global_scale_needed(layer):
            return None  # the GEMV reads unquantized rows; a TP row-parallel input needs the ranks' amax
        return 0

    @staticmethod
    def _global_scale_needed(layer: nn.Module) -> bool:
        return layer.tp_dim == 1 and layer.tp_size > 1

    def _row_scale(self, layer: nn.Module, x2: torch.Tensor) -> torch.Tensor | None:
        """Per-token scales over the whole row of a row-parallel layer's input at TP > 1: this rank holds a slice,
        so its amax is all-reduced over the ranks (one collective of M floats), and every rank quantizes as
        TP=1 does. None elsewhere (each row scales itself)."""
        if self.config.weight_block is not None or not self._global_scale_needed(layer):
            return None
        amax = x2.abs().amax(-1, keepdim=True).float()  # [M, 1]
        layer.tp_group.all_reduce(amax, "max")
        return (amax / FP8_E4M3_MAX).clamp(min=1e-12)

    def apply(self, layer: nn.Module, x: torch.Tensor | Fp8Activation, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ W^T + bias`` with the layer's FP8 weight; ``x`` may come quantized (:meth:`input_quant`).

        On the CPU a row-parallel layer at TP > 1 returns its partial sum in float64, and the all-reduce
        that sums the ranks rounds it to the model's dtype after: TP=N then gives TP=1's values.
        """
        block = self.config.weight_block
        if isinstance(x, Fp8Activation):
            return self._gemm(layer, x.x8, x.scale, x.dtype, bias)
        x2 = x.reshape(-1, x.shape[-1])
        if not x.is_cuda:
            out = torch.float64 if self._global_scale_needed(layer) else x.dtype
            y = fp8_linear_ref(x2, layer.weight, layer.weight_scale, block, bias, self._row_scale(layer, x2), out)
            return y.view(*x.shape[:-1], -1)
        from minivllm.kernels.gemv_config import use_gemv

        if block is None and use_gemv(x2, layer.weight):  # decoding few rows reads the weights: FP8 halves the bytes
            from minivllm.kernels.gemv import gemv

            return gemv(x2, layer.weight, bias, w_scale=layer.weight_scale).view(*x.shape[:-1], -1)
        if block is None:
            from minivllm.kernels.fp8_quant import quantize_fp8_per_token

            x8, xs = quantize_fp8_per_token(x2.contiguous(), scale=self._row_scale(layer, x2))
        else:
            from minivllm.kernels.fp8_block_gemm import quantize_fp8_per_group

            x8, xs = quantize_fp8_per_group(x2.contiguous(), block[1])
        return self._gemm(layer, x8, xs, x.dtype, bias).view(*x.shape[:-1], -1)

    def _gemm(self, layer: nn.Module, x8: torch.Tensor, xs: torch.Tensor, dtype: torch.dtype,
              bias: torch.Tensor | None) -> torch.Tensor:
        """CUDA: FP8 activations ([M, K]) times the FP8 weight: per-channel scales on cuBLASLt (row and column
        scales in its epilogue), block scales on the Triton block GEMM."""
        block = self.config.weight_block
        if block is None:
            return fp8_scaled_mm(x8, xs, layer.weight, layer.weight_scale, bias, dtype)
        from minivllm.kernels.fp8_block_gemm import fp8_block_gemm

        return fp8_block_gemm(x8, xs, layer.weight, layer.weight_scale, block, dtype, bias)


def fp8_scaled_mm(x8: torch.Tensor, x_scale: torch.Tensor, w8: torch.Tensor, w_scale: torch.Tensor,
                  bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """cuBLASLt FP8: ``x8`` [M, K] with per-token scales [M, 1] times ``w8`` [N, K] with per-channel scales [N]."""
    return torch._scaled_mm(x8, w8.t(), scale_a=x_scale, scale_b=w_scale.view(1, -1), bias=bias, out_dtype=dtype)


class Fp8Activation(NamedTuple):
    """A linear layer's input already quantized by the kernel that produced it (RMSNorm, SiLU-and-mul)."""

    x8: torch.Tensor  # [M, K] float8_e4m3fn
    scale: torch.Tensor  # [M, 1] per token, or [M, ceil(K / group)] per token and group, float32
    dtype: torch.dtype  # the unquantized activations' dtype: the layer's output dtype
