"""Tensor-parallel process groups: one ``TPGroup`` per engine, not torch.distributed's global default.

NOTE: a process can hold several tensor-parallel engines at once (each engine's rank 0 lives
in the engine's process), so the groups are standalone c10d backends (NCCL on CUDA, gloo on
the CPU) over their own TCPStore, never ``init_process_group``'s single default group. Layers
take the group that is *current* while the model is built (``tp_group_context``) and keep it;
``tp_rank()`` / ``tp_size()`` read that group (rank 0 of 1 outside any context).
"""

from __future__ import annotations

import os
import sys
import weakref
from contextlib import contextmanager
from datetime import timedelta
from urllib.parse import urlparse

import torch
import torch.distributed as dist

from minivllm.utils.env import env_switch
from minivllm.utils.tp_switches import (
    custom_all_reduce_enabled,
    decode_overlap_rows,
    decode_overlap_slices,
    nccl_comm_kind,
    overlap_min_rows,
)

# Collective timeout. NOTE: dead workers are detected by the executor's monitor long before
# this; the timeout only ends waits on a peer that is alive but stuck.
DEFAULT_TIMEOUT_S = float(os.environ.get("MINIVLLM_TP_TIMEOUT_S", "300"))

_OPS = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}
_current: TPGroup | None = None
_live: weakref.WeakValueDictionary[str, TPGroup] = weakref.WeakValueDictionary()


def _options(cls):
    """Collective options with ``asyncOp=False``, as ``dist.all_reduce(..., async_op=False)`` sets.

    NOTE: calling a backend directly defaults to ``asyncOp=True``, which (NCCL) runs the collective
    on an internal side stream with events, ``Work`` objects and the watchdog; ``False`` launches it
    on the current stream, the path graph capture is known to work with (nano-vLLM's). Whether this
    cures the TP + CUDA graphs stall is not yet checked on GPUs.
    """
    opts = cls()
    if hasattr(opts, "asyncOp"):
        opts.asyncOp = False
    return opts


class TPGroup:
    """This rank's handle on one engine's tensor-parallel group (rendezvous at ``tcp://host:port``)."""

    def __init__(self, device: torch.device, init_method: str, world_size: int, rank: int,
                 timeout_s: float | None = None):
        if not init_method:
            raise ValueError("tensor_parallel_size > 1 needs a rendezvous address (dist_init_method)")
        url = urlparse(init_method)
        timeout = timedelta(seconds=timeout_s or DEFAULT_TIMEOUT_S)
        self.rank, self.size, self.address, self.device = rank, world_size, init_method, device
        self._side_stream = None  # the stream of overlapped row-parallel sums, made on first use
        self.overlap_min_rows = overlap_min_rows()
        self.decode_overlap_slices, self.decode_overlap_rows = decode_overlap_slices(), decode_overlap_rows()
        self.num_overlapped_sums = 0  # slices summed inside row-parallel layers (tests check the path ran)
        self.is_nccl = device.type == "cuda"
        self.store = dist.TCPStore(url.hostname, url.port, world_size, rank == 0, timeout=timeout)
        store = dist.PrefixStore("minivllm_tp/", self.store)
        self.comm = None  # a pynccl communicator replaces the c10d backend's collectives on CUDA
        self.custom_ar = None  # the one-shot kernel for small sums, beside pynccl
        self.backend = None
        self.aborted = False
        # NOTE: a timing diagnostic only (wrong outputs): float sums return at once, to measure what the
        # all-reduces cost inside the engine
        self.skip_sums = env_switch("MINIVLLM_DEBUG_SKIP_TP_SUMS", False)
        if self.skip_sums and rank == 0:
            print("[minivllm] MINIVLLM_DEBUG_SKIP_TP_SUMS=1: tensor-parallel sums are skipped, outputs are wrong "
                  "(timing diagnostic)", file=sys.stderr, flush=True)
        _live[init_method] = self  # NOTE: before the NCCL init, so abort_group can end rank 0's wait for peers
        if self.is_nccl and nccl_comm_kind() == "pynccl":
            from minivllm.utils.pynccl import NcclCommunicator

            self.comm = NcclCommunicator(store, rank, world_size, device, stop=lambda: self.aborted)
            if custom_all_reduce_enabled():
                from minivllm.utils.custom_all_reduce import create_custom_all_reduce

                self.custom_ar = create_custom_all_reduce(
                    store, rank, world_size, device, lambda t: self.comm.all_reduce(t, "min"),
                    stop=lambda: self.aborted)
        elif self.is_nccl:
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            self.backend = dist.ProcessGroupNCCL(store, rank, world_size, opts)
            # NOTE: as torch's own NCCL factory does: the communicator exists before any forward
            # (and long before CUDA-graph capture), and abort() has one to abort.
            for name, args in (("_set_sequence_number_for_group", ()), ("eager_connect_single_device", (device,))):
                if hasattr(self.backend, name):
                    getattr(self.backend, name)(*args)
        else:
            self.backend = dist.ProcessGroupGloo(store, rank, world_size, timeout)

    def overlaps_row_sum(self, rows: int) -> bool:
        """Whether a row-parallel layer's output of ``rows`` rows is summed inside the layer, overlapping its
        matmul (``layers/overlapped_linear.py``); its consumer then must not sum it again."""
        return self.row_sum_plan(rows) is not None

    def row_sum_plan(self, rows: int) -> tuple[int, bool] | None:
        """``(slices, custom)`` for a row-parallel layer of ``rows`` rows that sums inside itself (``custom``: through
        :meth:`all_reduce`, the custom kernel on GPUs, else :meth:`sum_large`), or None (its consumer sums it).

        Prefill-sized inputs (``MINIVLLM_TP_OVERLAP_MIN_ROWS``) take NCCL, never inside a graph capture; decode-sized
        ones (``MINIVLLM_TP_DECODE_OVERLAP_SLICES``) take the custom kernel, captured graphs included (and gloo
        on the CPU). NOTE: a function of ``rows`` alone, so every rank and both the layer and its consumer agree.
        """
        if self.skip_sums:
            return None
        if 0 < self.overlap_min_rows <= rows:
            if self.is_nccl and torch.cuda.is_current_stream_capturing():
                return None
            from minivllm.layers.overlapped_linear import overlap_chunks

            return overlap_chunks(), False
        lo, hi = self.decode_overlap_rows
        if self.decode_overlap_slices > 1 and lo <= rows <= hi and (self.custom_ar is not None or not self.is_nccl):
            return self.decode_overlap_slices, True
        return None

    def side_stream(self) -> torch.cuda.Stream | None:
        """The stream overlapped sums run on (made on first use); None on the CPU."""
        if self._side_stream is None and self.is_nccl:
            self._side_stream = torch.cuda.Stream(self.device)
        return self._side_stream

    def sum_large(self, t: torch.Tensor) -> None:
        """A float sum of ``t`` in place on the current stream through NCCL (gloo on the CPU), never the
        custom kernel: for prefill sums issued on :meth:`side_stream`."""
        if self.comm is not None and not self.skip_sums:
            return self.comm.all_reduce(t)
        return self.all_reduce(t)

    def all_reduce(self, t: torch.Tensor, op: str = "sum") -> None:
        """In place, over all ranks (contiguous ``t``; fine inside a CUDA graph capture with NCCL)."""
        if self.skip_sums and op == "sum" and t.is_floating_point():
            return None
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
        if car is not None and not self.skip_sums and car.fits_add_rms_norm(x, residual, weight):
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
        """Make pending NCCL collectives return (a peer died); no-op on gloo.

        NOTE: gloo needs nothing: a dead peer closes its sockets and the pending collective
        raises. NCCL kernels would spin until the timeout instead.
        """
        self.aborted = True
        if self.custom_ar is not None:
            self.custom_ar.abort()  # NOTE: first: its kernels spin on flags NCCL's abort cannot reach
        if self.comm is not None:
            self.comm.abort()
        elif self.is_nccl and self.backend is not None:
            try:
                self.backend.abort()
            except Exception:  # noqa: BLE001 - best effort: the caller reports the dead worker anyway
                pass

    def shutdown(self) -> None:
        """Release the backend. NOTE: a broken gloo backend left to the interpreter's exit aborts the process."""
        _live.pop(self.address, None)
        car, self.custom_ar = getattr(self, "custom_ar", None), None
        if car is not None:
            try:
                summary = car.wait_summary()
            except Exception as exc:  # noqa: BLE001 - a diagnostic must not stop the shutdown
                summary = f"no wait summary ({type(exc).__name__}: {exc})"
            if summary:
                print(f"[custom all-reduce] {summary}", file=sys.stderr, flush=True)
            car.close()
        comm, self.comm = getattr(self, "comm", None), None
        if comm is not None:
            comm.abort()
        backend, self.backend, self.store = getattr(self, "backend", None), None, None
        if backend is not None:
            try:
                backend.shutdown()
            except Exception:  # noqa: BLE001 - already aborted or broken: nothing left to release
                pass


def abort_group(init_method: str, shutdown: bool = False) -> None:
    """Abort (and with ``shutdown``, release) this process's live group at ``init_method``, if any.

    For the executor: from its monitor thread when a worker died, and after a failed start
    (a ModelRunner that raised after joining its group leaves no handle to it).
    """
    group = _live.get(init_method)
    if group is not None:
        group.abort()
        if shutdown:
            group.shutdown()


def current_tp_group() -> TPGroup | None:
    return _current


@contextmanager
def tp_group_context(group: TPGroup | None):
    """Make ``group`` the one layers built inside this block use (None: no tensor parallelism)."""
    global _current
    prev, _current = _current, group
    try:
        yield group
    finally:
        _current = prev


def tp_rank() -> int:
    return _current.rank if _current is not None else 0


def tp_size() -> int:
    return _current.size if _current is not None else 1


def divide(numerator: int, denominator: int) -> int:
    if numerator % denominator:
        raise ValueError(f"{numerator} is not divisible by {denominator}")
    return numerator // denominator
