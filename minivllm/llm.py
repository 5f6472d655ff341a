"""The public offline entry point (vLLM / nano-vLLM API)."""

from minivllm.engine.llm_engine import LLMEngine


class LLM(LLMEngine):
    """``LLM(path, **engine_kwargs).generate(prompts, SamplingParams(...))``.

    ``path`` is a local Hugging Face checkpoint folder. Use it as a context manager, or call
    ``close()``, to release its worker processes and memory early. ``data_parallel_size=N`` (N > 1) gives a
    :class:`~minivllm.scale_out.data_parallel.DataParallelLLM` instead: N replicas of this engine on Ray, with
    the same ``generate`` and ``chat``.
    """

    def __new__(cls, model: str | None = None, **kwargs):
        if kwargs.get("data_parallel_size", 1) not in (1, None) and cls is LLM:
            from minivllm.scale_out.data_parallel import DataParallelLLM

            return DataParallelLLM(model, **kwargs)
        return super().__new__(cls)
