"""The markers of a thinking model's reasoning (vLLM's ``--reasoning-config``), for ``thinking_token_budget``
(``minivllm.engine.thinking_budget``)."""

from __future__ import annotations

from dataclasses import dataclass

from minivllm.config.fields import json_config


@dataclass(frozen=True)
class ReasoningConfig:
    """``reasoning_start_str`` and ``reasoning_end_str``: the text that opens and closes the model's reasoning
    (``<think>`` and ``</think>`` for Qwen3); the engine tokenizes them. Either empty: no budget can apply."""

    reasoning_start_str: str = ""
    reasoning_end_str: str = ""

    def __post_init__(self) -> None:
        for name in ("reasoning_start_str", "reasoning_end_str"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"reasoning_config.{name} must be a string, got {getattr(self, name)!r}")

    @classmethod
    def of(cls, value: ReasoningConfig | dict | str) -> ReasoningConfig:
        """From a config, a dict or its JSON text (the flag's value)."""
        return json_config(cls, value, "reasoning_config")

    @property
    def enabled(self) -> bool:
        return bool(self.reasoning_start_str and self.reasoning_end_str)
