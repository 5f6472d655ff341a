"""Architecture name (``config.architectures[0]``) -> model class."""

from __future__ import annotations

from torch import nn

from minivllm.models.gemma3 import Gemma3ForCausalLM, Gemma3ForConditionalGeneration
from minivllm.models.gpt_oss import GptOssForCausalLM
from minivllm.models.mistral import MistralForCausalLM
from minivllm.models.mixtral import MixtralForCausalLM
from minivllm.models.olmoe import OlmoeForCausalLM
from minivllm.models.qwen3 import LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM
from minivllm.models.qwen3_moe import Qwen3MoeForCausalLM

MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": MistralForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
    "MixtralForCausalLM": MixtralForCausalLM,
    "OlmoeForCausalLM": OlmoeForCausalLM,
    "Gemma3ForCausalLM": Gemma3ForCausalLM,
    "Gemma3ForConditionalGeneration": Gemma3ForConditionalGeneration,
    "GptOssForCausalLM": GptOssForCausalLM,
}


def get_model_class(architecture: str) -> type[nn.Module]:
    try:
        return MODEL_REGISTRY[architecture]
    except KeyError:
        raise ValueError(
            f"unsupported architecture {architecture!r}; supported: {', '.join(sorted(MODEL_REGISTRY))}") from None
