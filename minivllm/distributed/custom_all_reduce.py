"""Tensor-parallel all-reduce for small messages: the one-shot kernel over CUDA-IPC buffers.

A decode step of a TP model all-reduces two small activations per layer (8 KB per token for
Qwen3-8B), messages on which NCCL's all-reduce spends far longer than their bytes take
(``benchmarks/kernels/all_reduce.py`` times both). ``CustomAllReduce`` sums them with one
Triton kernel (``kernels/one_shot_all_reduce.py``) that reads the peers' exchange buffers
directly. ``TPGroup.all_reduce`` uses it for sum-reductions of at most ``max_bytes`` and NCCL for
everything else; both run on the current stream, so CUDA graphs capture either.

``create_custom_all_reduce`` sets it up on every rank or on none: the ranks agree (through the
group's store and one NCCL all-reduce) that buffers were allocated, mapped and gave the right sum.
"""

from __future__ import annotations

import logging
import threading
import time

import torch

from minivllm.kernels.one_shot_all_reduce import one_shot_all_reduce, one_shot_all_reduce_add_rms_norm

log = logging.getLogger(__name__)
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MAX_NORM_DIM = 8192  # the fused norm keeps a row in one program's registers
DEFAULT_CAPACITY = 8 << 20  # bytes in each slot of a rank's data buffer (2 halves x world slots)
DEFAULT_PROGRAMS = 64


#: the most rows the fused all-reduce + add + RMSNorm kernel takes; larger sums run the all-reduce and
#: ``fused_add_rms_norm`` as two kernels (fused at every size was faster for one request but lost
#: throughput on the nano workload: docs/performance-notes.md)
FUSED_NORM_MAX_ROWS = 16


def default_max_bytes(world: int) -> int:
    """Largest message sent through the one-shot kernel: 8 MiB at 2 ranks, 2 MiB beyond.

    One-shot makes every rank send its whole input to ``world - 1`` peers, so NCCL's ring wins sooner as
    the world grows: at 2 ranks the one-shot kernel led at every size its buffer holds, at 4 ranks only up to
    about the 2 MiB limit (docs/performance-notes.md; ``benchmarks/kernels/all_reduce.py --world N``).
    """
    return DEFAULT_CAPACITY if world <= 2 else 2 << 20


class CustomAllReduce:
    """One rank's handle on the exchange buffers of a group; ``all_reduce`` works in place."""

    def __init__(self, rank: int, world: int, data_ptrs: list[int], flag_ptrs: list[int], device: torch.device,
                 capacity_bytes: int, max_bytes: int, programs: int = DEFAULT_PROGRAMS, block: int = 2048,
                 num_warps: int = 8, on_close=None):
        """``data_ptrs[r]``: rank r's ``2 * world * capacity_bytes`` data buffer at this process's address;
        ``flag_ptrs[r]``: its ``programs * world`` int32 flags (zeroed before any rank's first call)."""
        if len(data_ptrs) != world or len(flag_ptrs) != world:
            raise ValueError(f"need one data and one flag buffer per rank ({world}), got "
                             f"{len(data_ptrs)} and {len(flag_ptrs)}")
        self.rank, self.world, self.device = rank, world, torch.device(device)
        self.capacity, self.max_bytes = capacity_bytes, min(max_bytes, capacity_bytes)
        # on a GPU the abort flag is pinned host memory, which the device reads at its host address
        self.abort_flag = torch.zeros(1, dtype=torch.int32, pin_memory=self.device.type == "cuda")
        self.ptrs = torch.tensor(data_ptrs + flag_ptrs + [self.abort_flag.data_ptr()], dtype=torch.int64,
                                 device=self.device)  # [2W + 1]
        self.counters = torch.zeros(programs, dtype=torch.int32, device=self.device)  # [programs]
        self.block, self.num_warps = block, num_warps
        self.max_norm_rows = FUSED_NORM_MAX_ROWS
        self._on_close = on_close

    def fits(self, t: torch.Tensor) -> bool:
        """Whether ``t`` goes through the one-shot kernel (else the caller uses NCCL)."""
        return (self.ptrs is not None and t.dtype in DTYPES and t.device == self.device and t.is_contiguous()
                and 0 < t.numel() * t.element_size() <= self.max_bytes)

    def all_reduce(self, t: torch.Tensor) -> None:
        """Sum ``t`` over the ranks, in place, on the current stream (every rank must call it in the same order)."""
        if not self.fits(t):
            raise ValueError(f"custom all-reduce takes a contiguous {DTYPES} tensor on {self.device} of at most "
                             f"{self.max_bytes} bytes; got {t.dtype}, {t.numel() * t.element_size()} bytes on {t.device}")
        one_shot_all_reduce(t, t, self.ptrs, self.counters, self.capacity // t.element_size(), self.rank, self.world,
                            self.block, self.num_warps)

    def fits_add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> bool:
        """Whether ``all_reduce_add_rms_norm`` takes these: ``fits(x)``, ``x`` and ``residual`` contiguous
        ``[M, D]`` alike, ``weight`` ``[D]``, ``D <= MAX_NORM_DIM`` (a row in one program's registers),
        ``M <= max_norm_rows``."""
        return (self.fits(x) and x.dim() == 2 and x.shape[1] <= MAX_NORM_DIM and residual.shape == x.shape
                and x.shape[0] <= self.max_norm_rows
                and residual.dtype == x.dtype and residual.device == x.device and residual.is_contiguous()
                and weight.shape == (x.shape[1],) and weight.is_contiguous() and weight.device == x.device)

    def all_reduce_add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                                eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """One kernel for a row-parallel layer's sum and the next RMSNorm, in place: ``residual += sum_ranks(x)``
        (the sum rounded to x's dtype first, as ``all_reduce`` then ``fused_add_rms_norm`` would), ``x =
        rms_norm(residual) * weight``; returns ``(x, residual)``."""
        if not self.fits_add_rms_norm(x, residual, weight):
            raise ValueError(f"all_reduce_add_rms_norm takes contiguous [M <= {self.max_norm_rows}, D <= {MAX_NORM_DIM}] "
                             f"x and residual of "
                             f"one {DTYPES} dtype on {self.device}, at most {self.max_bytes} bytes, and a [D] "
                             f"weight; got {tuple(x.shape)} {x.dtype}, {tuple(residual.shape)} {residual.dtype}, "
                             f"{tuple(weight.shape)}")
        one_shot_all_reduce_add_rms_norm(x, residual, weight, eps, self.ptrs, self.counters,
                                         self.capacity // x.element_size(), self.rank, self.world)
        return x, residual

    def abort(self) -> None:
        """End every wait of running and future kernels (a peer died); results are garbage from then on."""
        self.abort_flag.fill_(1)

    def close(self) -> None:
        self.abort()
        self.ptrs = None
        if self._on_close is not None:
            fn, self._on_close = self._on_close, None
            fn()


def _gather(store, key: str, value: bytes, rank: int, world: int, timeout_s: float, stop) -> list[bytes]:
    """Every rank's ``value`` (through the store); ``stop()`` True or ``timeout_s`` ends the wait."""
    keys = [f"custom_ar/{key}/{r}" for r in range(world)]
    store.set(keys[rank], value)
    deadline = time.monotonic() + timeout_s
    while not store.check(keys):
        if stop() or time.monotonic() > deadline:
            raise RuntimeError(f"tensor-parallel ranks did not all reach the custom all-reduce setup ({key})")
        time.sleep(0.01)
    return [store.get(k) for k in keys]


def create_custom_all_reduce(store, rank: int, world: int, device: torch.device, nccl_min, timeout_s: float = 300.0,
                             stop=lambda: False, capacity_bytes: int | None = None, check_timeout_s: float = 30.0,
                             tag: str = "", **kernel) -> CustomAllReduce | None:
    """Exchange buffers over CUDA IPC; every rank returns a ``CustomAllReduce`` or every rank None.

    ``nccl_min(t)`` all-reduces an int tensor with MIN over the group (the ranks' verdict); ``timeout_s``
    and ``stop()`` bound the waits for the peers; ``tag`` keeps the store keys of several instances over
    one store apart; ``kernel``: ``programs``, ``block``, ``num_warps`` of ``CustomAllReduce``.
    """
    from minivllm.distributed.cuda_ipc import IpcBuffer, close_ipc_handle, open_ipc_handle

    capacity_bytes = capacity_bytes or (DEFAULT_CAPACITY if world <= 2 else DEFAULT_CAPACITY // 2)
    kernel.setdefault("programs", DEFAULT_PROGRAMS)
    programs = kernel["programs"]
    own: list[IpcBuffer] = []
    try:
        own = [IpcBuffer(2 * world * capacity_bytes, device), IpcBuffer(programs * world * 4, device)]
        payload = own[0].handle + own[1].handle
    except Exception as e:  # noqa: BLE001 - reported to the peers, then NCCL does the work
        payload = b"fail: " + str(e).encode()
    handles = _gather(store, f"handles{tag}", payload, rank, world, timeout_s, stop)
    opened: list[int] = []

    def release() -> None:
        for ptr in opened:
            close_ipc_handle(ptr)
        for buf in own:
            buf.free()

    failed = [r for r, h in enumerate(handles) if h.startswith(b"fail")]
    if failed:
        log.warning("custom all-reduce off (rank %d: %s); NCCL does every all-reduce", failed[0],
                    handles[failed[0]].decode(errors="replace"))
        release()
        return None
    data, flags = [], []
    try:
        for r, h in enumerate(handles):
            if r == rank:
                data.append(own[0].ptr)
                flags.append(own[1].ptr)
            else:
                for addrs, part in ((data, h[:64]), (flags, h[64:])):
                    opened.append(open_ipc_handle(part))
                    addrs.append(opened[-1])
        status = b"ok"
    except Exception as e:  # noqa: BLE001
        status = b"fail: " + str(e).encode()
    statuses = _gather(store, f"opened{tag}", status, rank, world, timeout_s, stop)
    if any(s != b"ok" for s in statuses):
        log.warning("custom all-reduce off (peer buffers not mapped: %s); NCCL does every all-reduce",
                    next(s for s in statuses if s != b"ok").decode(errors="replace"))
        release()
        return None
    car = CustomAllReduce(rank, world, data, flags, device, capacity_bytes, default_max_bytes(world),
                          on_close=release, **kernel)
    # the first sum, under a watchdog that aborts its waits: a wrong sum or a stall on any rank turns it off
    x = torch.full((4096,), float(rank + 1), device=device, dtype=torch.bfloat16)
    timer = threading.Timer(check_timeout_s, car.abort)
    timer.start()
    try:
        car.all_reduce(x)
        torch.cuda.synchronize(device)
        passed = bool((x == world * (world + 1) // 2).all()) and not car.abort_flag.item()
    except Exception as e:  # noqa: BLE001 - e.g. the kernel does not compile here: NCCL does the work
        log.warning("custom all-reduce check raised on rank %d: %s", rank, e)
        passed = False
    finally:
        timer.cancel()
    ok = torch.tensor([int(passed)], device=device, dtype=torch.int32)
    nccl_min(ok)
    if ok.item() != 1:
        log.warning("custom all-reduce off (its check failed on some rank); NCCL does every all-reduce")
        car.close()
        return None
    return car
