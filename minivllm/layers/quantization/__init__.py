"""Quantized linear layers: which layers, how their weights are stored, and how they run."""

from __future__ import annotations

import logging

from torch import nn

from minivllm.config.quantization import Fp8Config, fp8_config
from minivllm.layers.quantization.fp8 import Fp8LinearMethod

__all__ = ["Fp8Config", "Fp8LinearMethod", "apply_quantization", "fp8_config", "process_weights_after_loading"]

logger = logging.getLogger(__name__)


def apply_quantization(model: nn.Module, config: Fp8Config | None, checkpoint_weights: bool) -> None:
    """Give every linear layer of the decoder (not the embedding, the LM head or a MoE router) ``config``'s FP8
    method, with FP8 parameters to load into when the weights come from an FP8 checkpoint (``checkpoint_weights``).

    The experts of a mixture of experts stay in the model's dtype (one line in the log says so, at any TP size)."""
    if config is None:
        return
    from minivllm.layers.fused_moe import FusedMoE
    from minivllm.layers.linear import LinearBase

    method = Fp8LinearMethod(config)
    moe = []
    for module in model.modules():
        if isinstance(module, LinearBase) and module.quantizable:
            module.quant_method = method
            if config.from_checkpoint and checkpoint_weights:
                method.create_weights(module)
        if isinstance(module, FusedMoE):
            moe.append(module)
    if moe and moe[0].tp_rank == 0:  # NOTE: each tensor-parallel rank builds its model: one line, rank 0's
        logger.warning("FP8: the experts of the %d mixture-of-experts layers stay in the model's dtype (FP8 experts "
                       "are not supported yet); attention and dense layers run in FP8", len(moe))


def process_weights_after_loading(model: nn.Module) -> None:
    """Quantize the layers that loaded high-precision weights (online FP8, dummy weights)."""
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if method is not None:
            method.process_weights_after_loading(module)
