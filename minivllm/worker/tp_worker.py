"""Tensor-parallel worker processes (ranks 1..N-1) and the channel rank 0 talks to them through.

A message (``ExecuteStep`` or ``Shutdown``) is pickled into a shared-memory block after an 8-byte length
header; rank 0 releases a worker's ``wakeup`` semaphore, the worker reads the message, releases ``ack``
(rank 0 may then overwrite it) and handles it.
"""

from __future__ import annotations

import os
import pickle
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.shared_memory import SharedMemory

import torch

from minivllm.config import Config
from minivllm.core.kv_cache_spec import kv_cache_groups
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.distributed.group import TPGroup

HEADER = struct.Struct("<Q")


@dataclass(frozen=True)
class ExecuteStep:
    """Run one step (``ModelRunner.execute_step``): every rank applies the same scheduler output to its batch."""

    out: SchedulerOutput


@dataclass(frozen=True)
class Shutdown:
    """Leave the loop, release the graphs and the group, and exit."""


WorkerMessage = ExecuteStep | Shutdown
_POLL_S = 0.5  # how often a waiting worker checks that its parent is alive


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shm_size(config: Config) -> int:
    """Bound on one pickled step: its new token ids, and per row a few scalars and its new block ids; at most
    every sequence new to the runner, with its whole block table (in each KV cache group) and parameters."""
    sc, arch = config.scheduler_config, config.model_config.arch
    groups = kv_cache_groups([arch.sliding_window_of(i) for i in range(arch.num_hidden_layers)],
                             hybrid=not config.cache_config.disable_hybrid_kv_cache_manager)
    max_blocks = len(groups) * -(-config.model_config.max_model_len // config.cache_config.kvcache_block_size)
    rows = min(sc.max_num_seqs, sc.max_num_batched_tokens)
    return 2 * (65536 + 16 * sc.max_num_batched_tokens + rows * (16 * max_blocks + 2048))


def _watch_parent(parent_pid: int) -> None:
    """Worker thread: exit the worker if the engine process dies (even mid-collective)."""
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os._exit(1)


def dump_stacks_if_stalled(interval_s: float | None) -> None:
    """Debugging aid (``MINIVLLM_HANG_DUMP_S``): print this process's stacks every ``interval_s`` seconds."""
    if interval_s:
        import faulthandler

        faulthandler.dump_traceback_later(interval_s, repeat=True)


def new_group(config: Config, device: torch.device, rank: int, init_method: str, stop=lambda: False) -> TPGroup:
    """Rank ``rank``'s group of the engine whose rendezvous is ``init_method``."""
    return TPGroup(device, init_method, config.parallel_config.tensor_parallel_size, rank,
                   timeout_s=config.envs.tp_timeout_s, nccl_library=config.envs.nccl_library,
                   custom_all_reduce=not config.parallel_config.disable_custom_all_reduce, stop=stop)


def worker_main(config: Config, rank: int, init_method: str, shm_name: str, wakeup, ack, ready,
                 parent_pid: int) -> None:
    """Entry point of rank ``rank`` (>= 1): build a ModelRunner, then handle messages until ``Shutdown``."""
    if config.device_config.device == "cpu":
        torch.set_num_threads(1)
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    dump_stacks_if_stalled(config.envs.hang_dump_s)
    from minivllm.worker.model_runner import ModelRunner, device_for_rank

    shm = SharedMemory(name=shm_name)
    ready.release()  # imports done; the engine now starts rank 0, which opens the rendezvous
    device = device_for_rank(config, rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    group = new_group(config, device, rank, init_method)
    runner = None
    try:
        runner = ModelRunner(config, rank, group)
        while True:
            while not wakeup.acquire(timeout=_POLL_S):
                if os.getppid() != parent_pid:
                    return
            (n,) = HEADER.unpack_from(shm.buf, 0)
            msg: WorkerMessage = pickle.loads(shm.buf[HEADER.size:HEADER.size + n])
            ack.release()  # NOTE: rank 0 may now write the next message over this one
            match msg:
                case ExecuteStep(out=out):
                    runner.execute_step(out)
                case Shutdown():
                    break
                case _:
                    raise RuntimeError(f"tensor-parallel worker rank {rank}: unknown message {msg!r}")
    finally:
        if runner is not None:
            runner.release_graphs()
        group.shutdown()
        shm.close()
    # a clean exit skips the interpreter's teardown of CUDA and NCCL state, which can stall
    # (the engine would then wait its exit timeout and terminate the worker)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
