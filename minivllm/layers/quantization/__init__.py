"""Quantized linear layers: which layers, how their weights are stored, and how they run."""

from __future__ import annotations

from torch import nn

from minivllm.config.quantization import Fp8Config, Mxfp4Config, fp8_config
from minivllm.layers.quantization.fp8 import Fp8LinearMethod
from minivllm.layers.quantization.fp8_moe import Fp8MoEMethod
from minivllm.layers.quantization.mxfp4_moe import Mxfp4MoEMethod

__all__ = ["Fp8Config", "Fp8LinearMethod", "Fp8MoEMethod", "Mxfp4Config", "Mxfp4MoEMethod", "apply_mxfp4",
           "apply_quantization", "fp8_config", "process_weights_after_loading"]


def apply_quantization(model: nn.Module, config: Fp8Config | None, checkpoint_weights: bool) -> None:
    """Give every linear layer of the decoder (not the embedding, the LM head or a MoE router) and the experts of
    every mixture-of-experts layer ``config``'s FP8 method, with FP8 parameters to load into when the weights come
    from an FP8 checkpoint (``checkpoint_weights``)."""
    if config is None:
        return
    from minivllm.layers.fused_moe import FusedMoE
    from minivllm.layers.linear import LinearBase

    linear, experts = Fp8LinearMethod(config), Fp8MoEMethod(config)
    for module in model.modules():
        method = linear if isinstance(module, LinearBase) and module.quantizable else (
            experts if isinstance(module, FusedMoE) else None)
        if method is None:
            continue
        module.quant_method = method
        if config.from_checkpoint and checkpoint_weights:
            method.create_weights(module)


def apply_mxfp4(model: nn.Module, config: Mxfp4Config | None, checkpoint_weights: bool) -> None:
    """Give the experts of every mixture-of-experts layer ``config``'s MXFP4 method, with packed parameters to
    load into when the weights come from the checkpoint (``checkpoint_weights``; dummy weights are quantized
    after, or get random codes where the model packed its experts when built). ValueError for a model without
    one: an MXFP4 checkpoint quantizes experts only."""
    if config is None:
        return
    from minivllm.layers.fused_moe import FusedMoE

    layers = [m for m in model.modules() if isinstance(m, FusedMoE)]
    if not layers:
        raise ValueError(f"an mxfp4 checkpoint quantizes mixture-of-experts experts, and {type(model).__name__} "
                         "has none")
    method = Mxfp4MoEMethod(config)
    method.dummy = not checkpoint_weights
    for layer in layers:
        layer.quant_method = method
        if checkpoint_weights:
            method.create_weights(layer)
        else:
            method.check_layer(layer)


def process_weights_after_loading(model: nn.Module) -> None:
    """Quantize the layers that loaded high-precision weights (online FP8, dummy weights)."""
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if method is not None:
            method.process_weights_after_loading(module)
