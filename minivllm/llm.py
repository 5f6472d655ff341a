"""The public offline entry point (vLLM / nano-vLLM API)."""

from minivllm.engine.llm_engine import LLMEngine


class LLM(LLMEngine):
    """``LLM(path, **engine_kwargs).generate(prompts, SamplingParams(...))``.

    ``path`` is a local Hugging Face checkpoint folder. Use it as a context manager, or call
    ``close()``, to release its worker processes and memory early.
    """
