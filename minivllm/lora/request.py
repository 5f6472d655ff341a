"""``LoRARequest``: which adapter a request runs with (vLLM's name and fields)."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    """A LoRA adapter by name, id and folder: ``LoRARequest("sql", 1, "/adapters/sql")``.

    ``lora_int_id`` (>= 1) identifies the adapter inside the engine: requests with the same id share its slot
    and their prefix-cache entries; one id always names the same folder. ``lora_path`` is a PEFT folder
    (``adapter_config.json`` and ``adapter_model.safetensors``).
    """

    lora_name: str
    lora_int_id: int
    lora_path: str

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError(f"lora_name must be a non-empty string, got {self.lora_name!r}")
        if not isinstance(self.lora_int_id, int) or isinstance(self.lora_int_id, bool) or self.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be an integer >= 1, got {self.lora_int_id!r}")
        if isinstance(self.lora_path, os.PathLike):
            object.__setattr__(self, "lora_path", os.fspath(self.lora_path))
        if not isinstance(self.lora_path, str) or not self.lora_path:
            raise ValueError(f"lora_path must be a non-empty path, got {self.lora_path!r}")

    @property
    def adapter_id(self) -> int:
        """``lora_int_id`` (vLLM's alias)."""
        return self.lora_int_id

    @property
    def name(self) -> str:
        """``lora_name`` (vLLM's alias)."""
        return self.lora_name

    @property
    def path(self) -> str:
        """``lora_path`` (vLLM's alias)."""
        return self.lora_path
