"""The runner's LoRA side (vLLM's ``LRUCacheWorkerLoRAManager``): the model's LoRA layers, the adapters loaded
in host memory (an LRU of ``max_cpu_loras``), the device slots the scheduler fills (``SchedulerOutput.lora_loads``)
and each step's per-token slot mapping."""

from __future__ import annotations

import re
from collections import OrderedDict

import numpy as np
import torch
from torch import nn

from minivllm.config import Config
from minivllm.layers.linear import LinearBase
from minivllm.lora.checkpoint import check_adapter
from minivllm.lora.layers import LoRALinear, LoRAState
from minivllm.lora.request import LoRARequest
from minivllm.lora.weights import load_adapter_weights

#: the names of the linear layers that take adapters: attention's and a dense MLP's of every decoder layer
_LORA_LAYER = re.compile(r"model\.layers\.\d+\.(self_attn\.(qkv_proj|o_proj)|mlp\.(gate_up_proj|down_proj))")

#: one adapter as this rank's LoRA layers take it: {layer name: [(a, b) or None per output slice]}
HostAdapter = dict[str, list[tuple[torch.Tensor, torch.Tensor] | None]]


class LoRAModelManager:
    """Gives ``model``'s LoRA-capable layers ``max_loras`` slots each and keeps them filled.

    ``load_slots`` writes the adapters the scheduler assigned to slots (from the host LRU, read from disk on a
    miss); ``set_token_slots`` points the layers at the step's per-token slots. ``max_num_tokens`` bounds a
    step's tokens (the static buffer CUDA graphs read).
    """

    def __init__(self, model: nn.Module, config: Config, device: torch.device, dtype: torch.dtype,
                 max_num_tokens: int):
        lc = config.lora_config
        self.arch, self.max_lora_rank = config.model_config.arch, lc.max_lora_rank
        self.max_cpu_loras = lc.max_cpu_loras
        self.device, self.dtype = device, dtype
        self.state = LoRAState()
        self.layers: dict[str, LoRALinear] = {}
        for name, module in model.named_modules():
            if _LORA_LAYER.fullmatch(name) and isinstance(module, LinearBase):
                module.lora = self.layers[name] = LoRALinear(module, lc.max_loras, lc.max_lora_rank, self.state,
                                                             device, dtype)
        if not self.layers:
            raise ValueError(f"enable_lora: {self.arch.architecture} has no layers that take LoRA adapters")
        self.host: OrderedDict[LoRARequest, HostAdapter] = OrderedDict()  # least recently used first
        self.token_slot_buf = torch.full((max_num_tokens,), -1, dtype=torch.int64, device=device)  # [tokens]

    @property
    def graph_safe(self) -> bool:
        """Whether CUDA graphs can capture the LoRA ops: the Triton kernels can, the torch reference (which reads
        its slots on the host) cannot."""
        from minivllm.lora.ops import uses_triton

        return uses_triton(self.device)

    def load_slots(self, loads: tuple[tuple[int, LoRARequest], ...]) -> None:
        """Write each ``(slot, adapter)`` into the layers' slots (the adapter it replaces is no longer used)."""
        for slot, lora in loads:
            weights = self.host_adapter(lora)
            for name, layer in self.layers.items():
                layer.set_slot(slot, weights.get(name, [None] * layer.num_slices))

    def host_adapter(self, lora: LoRARequest) -> HostAdapter:
        """The adapter as this rank's layers take it, from the host LRU or read (and checked) from its folder."""
        weights = self.host.get(lora)
        if weights is not None:
            self.host.move_to_end(lora)
            return weights
        adapter = check_adapter(lora, self.arch, self.max_lora_rank)
        weights = {}
        for name, slices in load_adapter_weights(adapter).items():
            layer = self.layers.get(name)
            if layer is None:
                raise ValueError(f"LoRA adapter {lora.lora_name!r}: the model has no LoRA layer {name}")
            parts: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * layer.num_slices
            for index, (a, b) in slices.items():
                a, b = layer.shard(index, a, b)
                parts[index] = (a.to(self.dtype).contiguous(), b.to(self.dtype).contiguous())
            weights[name] = parts
        self.host[lora] = weights
        while len(self.host) > self.max_cpu_loras:
            self.host.popitem(last=False)
        return weights

    def set_token_slots(self, token_slots: np.ndarray | None, num_tokens: int, graph: bool = False) -> None:
        """Point the layers at this step's per-token slots (``[num_tokens]`` int64, -1: the base model; None: no
        token has an adapter). ``graph``: a CUDA graph replays the step, reading the static buffer (padding rows
        get -1)."""
        buf = self.token_slot_buf
        if graph:
            buf.fill_(-1)
        if token_slots is not None:
            src = torch.from_numpy(token_slots)
            buf[:num_tokens].copy_(src.pin_memory() if self.device.type == "cuda" else src, non_blocking=True)
        if graph:
            self.state.reset(buf)
        else:
            self.state.reset(buf[:num_tokens] if token_slots is not None else None)
