"""FP8 experts of a mixture-of-experts layer (vLLM's ``Fp8MoEMethod``): the stacked ``w13_weight`` and
``w2_weight`` of a ``FusedMoE`` in e4m3, with ``w13_weight_scale`` and ``w2_weight_scale`` in the layout
``fused_moe_triton`` reads (``kernels/moe_fp8_weights.py``).

``create_weights`` gives a layer FP8 parameters for a checkpoint stored in FP8 (Qwen3-30B-A3B-FP8: one
``weight_scale_inv`` per 128 x 128 block of each expert projection); ``process_weights_after_loading``
quantizes the high-precision experts a layer loaded (online FP8: one scale per output channel). The router is
not the layer's: it stays in the model's dtype.
"""

from __future__ import annotations

import torch
from torch import nn

from minivllm.config.quantization import Fp8Config
from minivllm.kernels.moe_fp8_weights import quantize_moe_weights_fp8, quantize_weights_fp8


class Fp8MoEMethod:
    """How a ``FusedMoE`` holds FP8 experts under ``config`` (the layer's forward passes its scales to the
    kernels)."""

    def __init__(self, config: Fp8Config):
        self.config = config

    def create_weights(self, layer: nn.Module) -> None:
        """Replace ``layer``'s expert weights by FP8 ones, and give it scale parameters to load into, shaped for
        this rank: a rank holds whole blocks of each expert's intermediate dimension (else a ValueError)."""
        num_experts, rows13, hidden = layer.w13_weight.shape
        inter = rows13 // 2
        block = self.config.weight_block
        if block is not None and layer.tp_size > 1 and (inter % block[0] or inter % block[1]):
            raise ValueError(f"an FP8 block of {block} does not divide this rank's {inter} intermediate channels of "
                             f"each expert at tensor_parallel_size {layer.tp_size}")
        if block is None:
            s13, s2 = (num_experts, 2 * inter), (num_experts, hidden)
        else:
            b0, b1 = block
            s13 = (num_experts, 2 * -(-inter // b0), -(-hidden // b1))
            s2 = (num_experts, -(-hidden // b0), -(-inter // b1))
        device = layer.w13_weight.device
        for name, shape, scale_shape in (("w13", (num_experts, rows13, hidden), s13),
                                         ("w2", (num_experts, hidden, inter), s2)):
            weight = nn.Parameter(torch.empty(shape, dtype=torch.float8_e4m3fn, device=device), requires_grad=False)
            weight.weight_loader = layer.weight_loader
            scale = nn.Parameter(torch.empty(scale_shape, dtype=torch.float32, device=device), requires_grad=False)
            scale.weight_loader = lambda param, loaded, expert_id, shard: self._load_scale(
                layer, param, loaded, expert_id, shard)
            setattr(layer, f"{name}_weight", weight)
            setattr(layer, f"{name}_weight_scale", scale)
        layer.block_shape = block

    def _load_scale(self, layer: nn.Module, param: nn.Parameter, loaded: torch.Tensor, expert_id: int,
                    shard: str) -> None:
        """This rank's part of one expert projection's checkpoint scale, cut as ``FusedMoE.weight_loader`` cuts
        the weight: gate and up by rows (their channels or row blocks), down by columns (its K blocks; per
        channel, every rank has every output channel of down)."""
        layer.check_expert_shard(expert_id, shard)
        loaded = loaded.float()
        inter, rank = layer.intermediate_size_per_rank, layer.tp_rank
        block = self.config.weight_block
        dst = param.data[expert_id]
        if block is None:
            loaded = loaded.reshape(-1)  # compressed-tensors stores [N, 1]
            if shard == "down":
                dst.copy_(loaded)
            else:
                dst.narrow(0, 0 if shard == "gate" else inter, inter).copy_(loaded.narrow(0, rank * inter, inter))
            return
        b0, b1 = block
        if shard == "down":
            cols = -(-inter // b1)
            dst.copy_(loaded.narrow(1, rank * inter // b1, cols))  # NOTE: inter % b1 == 0 at TP > 1
            return
        rows = -(-inter // b0)
        dst.narrow(0, 0 if shard == "gate" else rows, rows).copy_(loaded.narrow(0, rank * inter // b0, rows))

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Quantize experts loaded in high precision (nothing to do for a checkpoint in FP8).

        Per output channel, every rank stores what TP=1 stores: a rank holds whole rows of ``w13`` (each gate
        and up channel over all of ``H``), but of ``w2`` only its K-slice of each output channel, whose scale
        is then the ranks' largest (one all-reduce of ``[E, H]``)."""
        if layer.w13_weight.dtype == torch.float8_e4m3fn:
            return
        w13, w2 = layer.w13_weight.data, layer.w2_weight.data
        block = self.config.weight_block
        w13_8, w13_s, w2_8, w2_s = quantize_moe_weights_fp8(w13, w2, block)
        if block is None and layer.tp_size > 1:
            amax = w2.abs().amax(2).float()  # [E, H]: this rank's part of each output channel
            layer.tp_group.all_reduce(amax, "max")
            w2_8, w2_s = quantize_weights_fp8(w2, None, amax)
        for name, weight, scale in (("w13", w13_8, w13_s), ("w2", w2_8, w2_s)):
            setattr(layer, f"{name}_weight", nn.Parameter(weight, requires_grad=False))
            setattr(layer, f"{name}_weight_scale", nn.Parameter(scale.to(weight.device), requires_grad=False))
        layer.block_shape = block
