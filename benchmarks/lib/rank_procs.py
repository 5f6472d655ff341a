"""Run one function on N spawned processes (one per GPU rank) and collect what each returns.

For the GPU tests and benchmarks of the collectives (the engine's own workers live in
``minivllm/worker/tp_worker.py``). ``fn(rank, world, port, *args)`` must be a module-level function; ``port``
is a free TCP port for the ranks' rendezvous store.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import traceback

from minivllm.worker.tp_worker import free_port


def _entry(fn, rank: int, world: int, port: int, args: tuple, queue) -> None:
    try:
        result = fn(rank, world, port, *args)
    except Exception:  # noqa: BLE001 - reported to the parent
        result = traceback.format_exc()
    queue.put((rank, result))
    queue.close()
    queue.join_thread()
    os._exit(0)  # NOTE: as the engine's workers: no interpreter teardown of CUDA / NCCL state


def run_ranks(fn, world: int, *args, timeout: float = 120.0) -> dict[int, object]:
    """``{rank: fn's result}``; a rank that raised gives its traceback as a string."""
    port = free_port()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_entry, args=(fn, r, world, port, args, queue)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        return dict(queue.get(timeout=timeout) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
