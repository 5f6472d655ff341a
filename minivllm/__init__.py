"""minivllm: a small, fast LLM inference engine in the nano-vLLM design.

``LLM`` is imported on first use, so the pure-Python parts (``minivllm.core``, ``minivllm.config``) load
without torch.
"""

from minivllm.beam_search import BeamSearchParams
from minivllm.lora.request import LoRARequest
from minivllm.sampling_params import SamplingParams
from minivllm.structured_outputs_params import StructuredOutputsParams

__all__ = ["LLM", "BeamSearchParams", "LoRARequest", "SamplingParams", "StructuredOutputsParams"]
__version__ = "0.2.0"


def __getattr__(name: str):
    if name == "LLM":
        from minivllm.llm import LLM

        return LLM
    raise AttributeError(f"module 'minivllm' has no attribute {name!r}")
