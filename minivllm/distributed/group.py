"""The tensor-parallel group of one engine: NCCL on GPUs (a ctypes communicator plus the one-shot custom
all-reduce), gloo on the CPU. Layers get the group as an argument; there is no process-wide default group.

NOTE: a process can hold several tensor-parallel engines at once (each engine's rank 0 lives in the engine's
process), so every group is standalone over its own TCPStore, never ``init_process_group``'s default one.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from urllib.parse import urlparse

import torch
import torch.distributed as dist

_OPS = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}


def _options(cls):
    """gloo collective options with ``asyncOp=False`` (calling a backend directly defaults to True)."""
    opts = cls()
    if hasattr(opts, "asyncOp"):
        opts.asyncOp = False
    return opts


class TPGroup:
    """This rank's handle on one engine's tensor-parallel group (rendezvous at ``init_method``, tcp://host:port).

    ``timeout_s`` bounds every wait for a peer; ``stop()`` returning True ends a wait at start-up early (the
    engine saw a worker die). ``custom_all_reduce``: sum small activations with the one-shot kernel over CUDA
    IPC buffers (GPUs only; NCCL otherwise).
    """

    def __init__(self, device: torch.device, init_method: str, world_size: int, rank: int, *,
                 timeout_s: float = 300.0, nccl_library: str = "libnccl.so.2", custom_all_reduce: bool = True,
                 stop: Callable[[], bool] = lambda: False):
        if not init_method:
            raise ValueError("tensor_parallel_size > 1 needs a rendezvous address")
        url = urlparse(init_method)
        self.rank, self.size, self.device, self.timeout_s = rank, world_size, device, timeout_s
        self.aborted = False
        self.comm = None  # the NCCL communicator (GPUs)
        self.custom_ar = None  # the one-shot kernel for small sums, beside NCCL
        self.backend = None  # gloo (CPU)
        self.store = dist.TCPStore(url.hostname, url.port, world_size, rank == 0, timeout=timedelta(seconds=timeout_s))
        store = dist.PrefixStore("minivllm_tp/", self.store)
        should_stop = lambda: self.aborted or stop()  # noqa: E731
        try:
            if device.type == "cuda":
                from minivllm.distributed.pynccl import NcclCommunicator

                self.comm = NcclCommunicator(store, rank, world_size, device, nccl_library, timeout_s, should_stop)
                if custom_all_reduce:
                    from minivllm.distributed.custom_all_reduce import create_custom_all_reduce

                    self.custom_ar = create_custom_all_reduce(
                        store, rank, world_size, device, lambda t: self.comm.all_reduce(t, "min"), timeout_s,
                        stop=should_stop)
            else:
                self.backend = dist.ProcessGroupGloo(store, rank, world_size, timedelta(seconds=timeout_s))
        except BaseException:
            self.shutdown()
            raise

    def all_reduce(self, t: torch.Tensor, op: str = "sum") -> None:
        """In place, over all ranks (contiguous ``t``; fine inside a CUDA graph capture)."""
        if self.custom_ar is not None and op == "sum" and self.custom_ar.fits(t):
            return self.custom_ar.all_reduce(t)
        if self.comm is not None:
            return self.comm.all_reduce(t, op)
        opts = _options(dist.AllreduceOptions)
        opts.reduceOp = _OPS[op]
        self.backend.allreduce([t], opts).wait()

    def all_reduce_add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                                eps: float) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Sum ``x`` over the ranks, and where the custom kernel takes the tensors also the residual add and
        RMSNorm in the same launch: ``(x, residual)`` if it did all three, None if it only summed ``x``."""
        car = self.custom_ar
        if car is not None and car.fits_add_rms_norm(x, residual, weight):
            return car.all_reduce_add_rms_norm(x, residual, weight, eps)
        self.all_reduce(x)
        return None

    def broadcast(self, t: torch.Tensor, src: int = 0) -> None:
        """In place: every rank's ``t`` becomes rank ``src``'s (stream-ordered with NCCL)."""
        if self.comm is not None:
            return self.comm.broadcast(t, src)
        opts = _options(dist.BroadcastOptions)
        opts.rootRank = src
        self.backend.broadcast([t], opts).wait()

    def gather(self, t: torch.Tensor, dst: int = 0) -> list[torch.Tensor] | None:
        """Every rank's ``t`` (same shape everywhere) on rank ``dst``; None on the others."""
        if self.comm is not None:
            return self.comm.gather(t, dst)
        opts = _options(dist.GatherOptions)
        opts.rootRank = dst
        parts = [torch.empty_like(t) for _ in range(self.size)] if self.rank == dst else None
        self.backend.gather([parts] if parts is not None else [], [t], opts).wait()
        return parts

    def abort(self) -> None:
        """Make pending collectives return (a peer died); callable from another thread.

        Gloo needs nothing: a dead peer closes its sockets and the pending collective raises. NCCL
        kernels, and the custom all-reduce's, would spin until the timeout instead.
        """
        self.aborted = True
        if self.custom_ar is not None:
            self.custom_ar.abort()  # NOTE: first: its kernels spin on flags NCCL's abort cannot reach
        if self.comm is not None:
            self.comm.abort()

    def shutdown(self) -> None:
        """Release the communicators. A broken gloo backend left to the interpreter's exit aborts the process."""
        car, self.custom_ar = self.custom_ar, None
        if car is not None:
            car.close()
        comm, self.comm = self.comm, None
        if comm is not None:
            comm.abort()
        backend, self.backend, self.store = self.backend, None, None
        if backend is not None:
            try:
                backend.shutdown()
            except Exception:  # noqa: BLE001 - already aborted or broken: nothing left to release
                pass


def rank_and_size(group: TPGroup | None) -> tuple[int, int]:
    """``(rank, world size)`` of a group; ``(0, 1)`` without tensor parallelism."""
    return (group.rank, group.size) if group is not None else (0, 1)


def divide(numerator: int, denominator: int) -> int:
    if numerator % denominator:
        raise ValueError(f"{numerator} is not divisible by {denominator}")
    return numerator // denominator
