"""Tensor-parallel worker processes (ranks 1..N-1) and the channel rank 0 talks to them through.

A command is ``(method, args)`` pickled into a shared-memory block after an 8-byte length header;
rank 0 releases a worker's ``wakeup`` semaphore, the worker reads the command, releases ``ack``
(rank 0 may then overwrite it) and runs ``ModelRunner.<method>(*args)``.
"""

from __future__ import annotations

import os
import pickle
import socket
import struct
import sys
import threading
import time
from multiprocessing.shared_memory import SharedMemory

import torch

from minivllm.config import Config

HEADER = struct.Struct("<Q")
_POLL_S = 0.5  # how often a waiting worker checks that its parent is alive


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shm_size(config: Config) -> int:
    """Bound on one pickled step: 3 int64 per token, a block-table row and a few scalars per sequence
    (a sampled row's temperature among them)."""
    max_blocks = -(-config.max_model_len // config.kvcache_block_size)
    rows = min(config.max_num_seqs, config.max_num_batched_tokens)
    return 2 * (65536 + 32 * config.max_num_batched_tokens + rows * (4 * max_blocks + 20))


def _watch_parent(parent_pid: int) -> None:
    """Worker thread: exit the worker if the engine process dies (even mid-collective)."""
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os._exit(1)


def dump_stacks_if_stalled() -> None:
    """Debugging aid: with ``MINIVLLM_HANG_DUMP_S=N``, print this process's stacks every N seconds."""
    if os.environ.get("MINIVLLM_HANG_DUMP_S"):
        import faulthandler

        faulthandler.dump_traceback_later(float(os.environ["MINIVLLM_HANG_DUMP_S"]), repeat=True)


class _Timing:
    """``MINIVLLM_WORKER_TIMING=1``: every 200 steps a worker prints how long it waited for commands
    and how long it took to run them (its host side; a worker slower than the GPU step delays every
    rank at the step's first all-reduce)."""

    def __init__(self, rank: int):
        self.rank, self.n, self.wait, self.run = rank, 0, 0.0, 0.0

    def add(self, method: str, wait: float, run: float) -> None:
        if method != "execute_step":
            return
        self.n, self.wait, self.run = self.n + 1, self.wait + wait, self.run + run
        if self.n == 200:
            print(f"[worker rank {self.rank}] per step: waited {1000 * self.wait / self.n:.3f} ms for the command, "
                  f"ran it in {1000 * self.run / self.n:.3f} ms", file=sys.stderr, flush=True)
            self.n, self.wait, self.run = 0, 0.0, 0.0


def worker_main(config: Config, rank: int, init_method: str, shm_name: str, wakeup, ack, ready,
                 parent_pid: int) -> None:
    """Entry point of rank ``rank`` (>= 1): build a ModelRunner, then run commands until "exit"."""
    if config.device == "cpu":
        torch.set_num_threads(1)
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    dump_stacks_if_stalled()
    from minivllm.engine.model_runner import ModelRunner

    shm = SharedMemory(name=shm_name)
    ready.release()  # NOTE: imports done; the engine now starts rank 0, which opens the rendezvous
    runner = ModelRunner(config, rank, dist_init_method=init_method)
    timing = _Timing(rank) if os.environ.get("MINIVLLM_WORKER_TIMING") else None
    try:
        while True:
            t0 = time.perf_counter()
            while not wakeup.acquire(timeout=_POLL_S):
                if os.getppid() != parent_pid:
                    return
            t1 = time.perf_counter()
            (n,) = HEADER.unpack_from(shm.buf, 0)
            method, args = pickle.loads(shm.buf[HEADER.size:HEADER.size + n])
            ack.release()  # NOTE: rank 0 may now write the next command over this one
            if method == "exit":
                return
            getattr(runner, method)(*args)
            if timing is not None:
                timing.add(method, t1 - t0, time.perf_counter() - t1)
    finally:
        runner.shutdown()
        shm.close()
    # NOTE: a clean exit skips the interpreter's teardown of CUDA and NCCL state, which can stall
    # (the engine would then wait its exit timeout and terminate the worker)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
