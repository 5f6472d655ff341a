"""The LoRA sub-config: whether adapters are served, how many at once on the device and in host memory."""

from __future__ import annotations

from dataclasses import dataclass

from minivllm.config.fields import arg, at_least, check_types


@dataclass
class LoRAConfig:
    """Multi-LoRA serving (vLLM's flags). ``max_loras`` adapters sit in slots on the device at once (a step
    mixes rows of at most that many adapters and of the base model); ``max_cpu_loras`` loaded adapters are kept
    in host memory (least recently used dropped first); a rank above ``max_lora_rank`` is refused."""

    enable_lora: bool = arg(False, "serve LoRA adapters of the base model, each request with its own (or none)")
    max_loras: int = arg(1, "adapters on the device at once: the most distinct adapters in one step")
    max_lora_rank: int = arg(16, "the largest adapter rank accepted (the device slots are this wide)")
    max_cpu_loras: int | None = arg(None, "loaded adapters kept in host memory (default: max_loras)")

    def __post_init__(self) -> None:
        check_types(self)
        at_least("max_loras", self.max_loras, 1)
        at_least("max_lora_rank", self.max_lora_rank, 1)
        if self.max_cpu_loras is None:
            self.max_cpu_loras = self.max_loras
        elif self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras})")
