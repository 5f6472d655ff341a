"""Loading a checked PEFT adapter's tensors (``minivllm.lora.checkpoint``) for the model's LoRA layers."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from minivllm.lora.checkpoint import ATTENTION_MODULES, PEFTAdapter

#: PEFT module name -> (the model's layer under ``model.layers.N``, its output slice)
MODULE_TO_LAYER = {
    "q_proj": ("self_attn.qkv_proj", 0), "k_proj": ("self_attn.qkv_proj", 1), "v_proj": ("self_attn.qkv_proj", 2),
    "o_proj": ("self_attn.o_proj", 0),
    "gate_proj": ("mlp.gate_up_proj", 0), "up_proj": ("mlp.gate_up_proj", 1), "down_proj": ("mlp.down_proj", 0),
}


def load_adapter_weights(adapter: PEFTAdapter) -> dict[str, dict[int, tuple[torch.Tensor, torch.Tensor]]]:
    """``{layer name: {slice: (A [r, in], B [out, r])}}`` in float32 on the host, full (unsharded) sizes, the
    adapter's scaling folded into B. Layer names are the model's (``model.layers.3.self_attn.qkv_proj``)."""
    tensors = load_file(adapter.weights_path, device="cpu")
    prefix = "base_model.model.model.layers"
    out: dict[str, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}
    for m in adapter.modules:
        key = f"{prefix}.{m.layer}.{'self_attn' if m.module in ATTENTION_MODULES else 'mlp'}"
        a = tensors[f"{key}.{m.module}.lora_A.weight"].float()  # [r, in]
        b = tensors[f"{key}.{m.module}.lora_B.weight"].float() * adapter.scaling  # [out, r]
        layer, index = MODULE_TO_LAYER[m.module]
        out.setdefault(f"model.layers.{m.layer}.{layer}", {})[index] = (a, b)
    return out
