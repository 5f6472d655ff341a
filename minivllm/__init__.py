"""minivllm: a small, fast LLM inference engine in the nano-vLLM design."""

from minivllm.llm import LLM
from minivllm.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams"]
__version__ = "0.1.0"
