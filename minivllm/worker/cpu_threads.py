"""How many torch threads a model on the CPU uses.

torch's default (one per core) makes the small matmuls of a small model slower, not faster, and much
slower when the machine has any other load (threads spin waiting for each other). So unless the user
chose (``cpu_threads``, or ``OMP_NUM_THREADS``), a model under a billion parameters gets one thread and a
larger one half the cores.
"""

from __future__ import annotations

import os

import torch

from minivllm.config import Config

SMALL_MODEL_PARAMS = 1_000_000_000


def approx_params(config: Config) -> int:
    """Parameters of the model, from its shapes (every expert of a mixture of experts counted)."""
    return config.model_config.arch.num_params()


def cpu_threads(config: Config) -> int | None:
    """The thread count to set for ``config`` on the CPU, or None to leave torch's as it is."""
    if config.device_config.device != "cpu":
        return None
    if config.device_config.cpu_threads is not None:
        return config.device_config.cpu_threads
    if config.envs.omp_num_threads_set:
        return None
    if approx_params(config) < SMALL_MODEL_PARAMS:
        return 1
    return max(1, (os.cpu_count() or 2) // 2)


def set_cpu_threads(config: Config) -> None:
    """Apply :func:`cpu_threads` to this process."""
    n = cpu_threads(config)
    if n is not None and n != torch.get_num_threads():
        torch.set_num_threads(n)
