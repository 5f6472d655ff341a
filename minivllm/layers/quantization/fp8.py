"""FP8 linear layers (vLLM's ``Fp8LinearMethod``): e4m3 weights with per-channel or block scales, activations
quantized per token at run time.

``create_weights`` gives a layer FP8 parameters shaped for this rank (a checkpoint stored in FP8);
``process_weights_after_loading`` quantizes the high-precision weights a layer loaded (online FP8, dummy
weights); ``apply`` runs the layer. On CUDA with per-channel scales, activations are quantized by one Triton
kernel and multiplied by ``torch._scaled_mm`` (cuBLASLt FP8, row and column scales in its epilogue); up to 16
rows (decoding), the Triton GEMV reads the FP8 weights and scales its outputs, the activations unquantized.
Elsewhere -- the CPU, and block scales for now -- the layer computes what ``fp8_linear_ref`` defines: the
CPU in float32, a GPU with block scales by dequantizing the weight to the activations' dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minivllm.config.quantization import Fp8Config
from minivllm.kernels.reference import dequantize_weight_fp8_ref, fp8_linear_ref, quantize_weight_fp8_ref


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
        # NOTE: the scale is spread over the weight's rows (or columns), cut by the weight's own loader, and
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
        w8, scale = quantize_weight_fp8_ref(layer.weight.data, self.config.weight_block)
        layer.weight = nn.Parameter(w8, requires_grad=False)
        layer.weight_scale = nn.Parameter(scale.to(w8.device), requires_grad=False)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ W^T + bias`` with the layer's FP8 weight."""
        block = self.config.weight_block
        if not x.is_cuda:
            return fp8_linear_ref(x, layer.weight, layer.weight_scale, block, bias)
        if block is not None:
            return F.linear(x, dequantize_weight_fp8_ref(layer.weight, layer.weight_scale, block, x.dtype), bias)
        from minivllm.kernels.gemv import gemv
        from minivllm.kernels.gemv_config import use_gemv

        x2 = x.reshape(-1, x.shape[-1])
        if use_gemv(x2, layer.weight):  # NOTE: decoding few rows reads the weights: FP8 halves the bytes
            return gemv(x2, layer.weight, bias, w_scale=layer.weight_scale).view(*x.shape[:-1], -1)
        return fp8_scaled_mm(x, layer.weight, layer.weight_scale, bias)


def fp8_scaled_mm(x: torch.Tensor, w8: torch.Tensor, w_scale: torch.Tensor,
                  bias: torch.Tensor | None) -> torch.Tensor:
    """CUDA: per-token FP8 activations (one Triton kernel) times per-channel FP8 weights on cuBLASLt."""
    from minivllm.kernels.fp8_quant import quantize_fp8_per_token

    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    q, s = quantize_fp8_per_token(x2.contiguous())
    y = torch._scaled_mm(q, w8.t(), scale_a=s, scale_b=w_scale.view(1, -1), bias=bias, out_dtype=x.dtype)
    return y.view(*shape[:-1], w8.shape[0])
