"""The environment variables minivllm reads: a few operational settings, read once when an engine starts.

Every user choice is a ``Config`` field with a CLI flag; the environment only holds what belongs to the
machine or to debugging a stuck process. ``read_envs()`` is called by ``Config.create`` and the result
travels with the config (to tensor-parallel workers too), so nothing reads ``os.environ`` afterwards.

| variable | meaning |
| --- | --- |
| ``MINIVLLM_NCCL_SO`` | the NCCL library to load (default ``libnccl.so.2``, the one PyTorch loaded) |
| ``MINIVLLM_TP_TIMEOUT_S`` | how long a tensor-parallel rank waits for a stuck peer (default 300 s) |
| ``MINIVLLM_HANG_DUMP_S`` | every N seconds, each tensor-parallel process prints its Python stacks |
| ``MINIVLLM_API_KEY`` | the server's API keys, comma-separated (as vLLM reads ``VLLM_API_KEY``; ``--api-key`` adds more) |
| ``TRITON_INTERPRET`` | Triton's own: ``1`` runs Triton kernels in its interpreter (how the CPU runs them) |
| ``OMP_NUM_THREADS`` | torch's: a set value keeps the engine from choosing the CPU thread count |

One variable is set rather than read: Ray's ``RAY_COLOR_PREFIX`` (:func:`plain_ray_log_prefixes`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Envs:
    """A snapshot of the environment variables above."""

    nccl_library: str = "libnccl.so.2"
    tp_timeout_s: float = 300.0
    hang_dump_s: float | None = None
    triton_interpret: bool = False
    omp_num_threads_set: bool = False
    api_keys: tuple[str, ...] = ()


def _positive_float(name: str, text: str | None) -> float | None:
    if text is None or text == "":
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"{name} must be a number of seconds > 0, not {text!r}")
    return value


def read_envs() -> Envs:
    """Read the variables now; a malformed value is a ValueError naming the variable."""
    env = os.environ
    timeout = _positive_float("MINIVLLM_TP_TIMEOUT_S", env.get("MINIVLLM_TP_TIMEOUT_S"))
    return Envs(
        nccl_library=env.get("MINIVLLM_NCCL_SO") or "libnccl.so.2",
        tp_timeout_s=timeout if timeout is not None else 300.0,
        hang_dump_s=_positive_float("MINIVLLM_HANG_DUMP_S", env.get("MINIVLLM_HANG_DUMP_S")),
        triton_interpret=env.get("TRITON_INTERPRET") == "1",
        omp_num_threads_set=bool(env.get("OMP_NUM_THREADS")),
        api_keys=tuple(k.strip() for k in (env.get("MINIVLLM_API_KEY") or "").split(",") if k.strip()),
    )


def plain_ray_log_prefixes(on_a_terminal: bool) -> None:
    """Ray prints each log line it forwards from its processes after a ``(ProxyActor pid=...)`` prefix in ANSI
    colours, whether or not the output is a terminal; ``RAY_COLOR_PREFIX=0``, which Ray reads in this process (the
    driver) as it prints, leaves them out. Set it where the output is not a terminal (a log file), unless the user
    set it."""
    if not on_a_terminal:
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
