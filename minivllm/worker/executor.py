"""Executors run the model runner(s) for the engine: in the engine's process (``UniProcExecutor``), or one process
per tensor-parallel rank (``MultiProcExecutor``, ``worker/tp_executor.py``). Both implement ``Executor``."""

from __future__ import annotations

from typing import Protocol

from minivllm.config import Config
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.worker.model_runner import ModelRunner
from minivllm.worker.step_handle import Forward, StepHandle


class Executor(Protocol):
    """What the engine calls. A step is started, then finished: ``start_step`` queues the forward of every
    rank; ``finish_step`` samples it (with the grammar masks of its constrained rows, filled in between) and
    returns a handle whose ``result()`` waits for the tokens. The next step starts only after this one is
    finished: its forward reads these tokens on the device."""

    num_kvcache_blocks: int  # over every KV cache group
    kv_cache_groups: list[tuple[int | None, int]]  # each group's (sliding_window, num_blocks)

    def start_step(self, out: SchedulerOutput) -> Forward: ...

    def finish_step(self, forward: Forward, grammar=None) -> StepHandle: ...

    def close(self) -> None: ...


class UniProcExecutor:
    """Tensor parallel size 1: the model runner lives in the engine's process."""

    def __init__(self, config: Config):
        from minivllm.worker.cpu_threads import set_cpu_threads

        set_cpu_threads(config)
        self.runner: ModelRunner | None = ModelRunner(config, rank=0)
        self.num_kvcache_blocks = self.runner.num_kvcache_blocks
        self.kv_cache_groups = self.runner.kv_cache_groups

    def start_step(self, out: SchedulerOutput) -> Forward:
        return self.runner.start_step(out)

    def finish_step(self, forward: Forward, grammar=None) -> StepHandle:
        return self.runner.finish_step(forward, grammar)

    def close(self) -> None:
        self.runner = None


def create_executor(config: Config) -> Executor:
    """The executor for ``config``'s tensor-parallel size."""
    if config.parallel_config.tensor_parallel_size == 1:
        return UniProcExecutor(config)
    from minivllm.worker.tp_executor import MultiProcExecutor

    return MultiProcExecutor(config)
