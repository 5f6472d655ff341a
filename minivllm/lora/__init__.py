"""Multi-LoRA serving: adapters of one base model applied per row of a batch.

Only ``LoRARequest`` (pure Python) is exported here, so that ``minivllm.core`` and ``minivllm.config`` may name it
without importing torch; the checkpoint reader, the layers and the slot manager live in their own modules.
"""

from minivllm.lora.request import LoRARequest

__all__ = ["LoRARequest"]
