"""Executors: run the model runner(s) for the engine. One process, or one per tensor-parallel rank."""

from __future__ import annotations

from dataclasses import dataclass

from minivllm.config import Config
from minivllm.core.scheduler_output import SchedulerOutput


@dataclass
class SampledTokens:
    """Host-side sampler results for the rows sampled in one step (batch order)."""

    token_ids: list[int]
    logprobs: list[float] | None = None  # logprob of each sampled token
    top_ids: list[list[int]] | None = None  # [rows][k] top alternatives
    top_logprobs: list[list[float]] | None = None
    num_top: list[int] | None = None  # how many alternatives each row asked for (None: no logprobs)
    # (seq_id, first prompt token, [{target: Logprob, alt: Logprob, ...}, ...]) of the rows with prompt logprobs
    prompt_logprobs: list[tuple[int, int, list[dict]]] | None = None

    def logprobs_of(self, row: int) -> dict[int, float] | None:
        """``{sampled_id: logprob, alt_id: logprob, ...}`` for a row that asked for logprobs, else None."""
        if self.logprobs is None or self.num_top is None or self.num_top[row] is None:
            return None
        d = {self.token_ids[row]: self.logprobs[row]}
        for tid, lp in zip(self.top_ids[row][: self.num_top[row]], self.top_logprobs[row][: self.num_top[row]]):
            d.setdefault(tid, lp)
        return d


class UniProcExecutor:
    """Tensor parallel size 1: the model runner lives in the engine's process."""

    def __init__(self, config: Config):
        from minivllm.worker.cpu_threads import set_cpu_threads
        from minivllm.worker.model_runner import ModelRunner

        set_cpu_threads(config)
        self.runner = ModelRunner(config, rank=0)
        self.num_kvcache_blocks = self.runner.num_kvcache_blocks

    def launch(self, out: SchedulerOutput):
        """Start one step; returns a handle whose ``result()`` gives its ``SampledTokens``."""
        return self.runner.launch(out)

    def start_step(self, out: SchedulerOutput):
        """Queue one step's forward only (``ModelRunner.start_step``); ``finish_step`` samples it."""
        return self.runner.start_step(out)

    def finish_step(self, fwd, grammar=None):
        """Sample a started step with its grammar masks; returns its handle (as ``launch``)."""
        return self.runner.finish_step(fwd, grammar)

    def run(self, out: SchedulerOutput) -> SampledTokens:
        return self.launch(out).result()

    def close(self) -> None:
        self.runner = None


def create_executor(config: Config):
    """The executor for ``config``'s tensor-parallel size."""
    if config.parallel_config.tensor_parallel_size == 1:
        return UniProcExecutor(config)
    from minivllm.worker.tp_executor import MultiProcExecutor

    return MultiProcExecutor(config)
