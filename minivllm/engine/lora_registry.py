"""The engine's known LoRA adapters (vLLM's ``add_lora`` / ``remove_lora`` / ``list_loras``): each checked once,
when it is added or first named by a request, before anything is queued."""

from __future__ import annotations

from minivllm.config import Config
from minivllm.lora.checkpoint import PEFTAdapter, check_adapter
from minivllm.lora.request import LoRARequest


class LoRARegistry:
    """Adapters by ``lora_int_id``. One id names one folder: a request that gives a known id with another name
    or path is refused (remove the adapter first)."""

    def __init__(self, config: Config):
        self.enabled = config.lora_config.enable_lora
        self.max_lora_rank = config.lora_config.max_lora_rank
        self.arch = config.model_config.arch
        self.adapters: dict[int, PEFTAdapter] = {}

    def resolve(self, lora_request, required: bool = False) -> LoRARequest | None:
        """The adapter a request runs with (None: the base model, unless ``required``), checked and registered on
        first use; ValueError naming ``lora_request`` or what is wrong with its folder."""
        if lora_request is None and required:
            raise ValueError("lora_request must be a LoRARequest, got None")
        if lora_request is None:
            return None
        if not isinstance(lora_request, LoRARequest):
            raise ValueError(f"lora_request must be a LoRARequest or None, got {type(lora_request).__name__}")
        if not self.enabled:
            raise ValueError(f"lora_request ({lora_request.lora_name!r}) was given, but LoRA is not enabled: start "
                             f"the engine with enable_lora=True (--enable-lora)")
        known = self.adapters.get(lora_request.lora_int_id)
        if known is not None:
            if known.request != lora_request:
                raise ValueError(f"lora_request: lora_int_id {lora_request.lora_int_id} already names adapter "
                                 f"{known.request.lora_name!r} at {known.request.lora_path}; remove it first or use "
                                 f"another id")
            return known.request
        self.adapters[lora_request.lora_int_id] = check_adapter(lora_request, self.arch, self.max_lora_rank)
        return lora_request

    def remove(self, lora_int_id: int) -> bool:
        """Forget an adapter; False if it was unknown."""
        return self.adapters.pop(lora_int_id, None) is not None

    def list(self) -> list[LoRARequest]:
        """The known adapters, in the order they were added."""
        return [a.request for a in self.adapters.values()]
