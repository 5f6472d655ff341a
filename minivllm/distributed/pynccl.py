"""A minimal NCCL communicator over ctypes: collectives on the caller's current CUDA stream.

Why not ``ProcessGroupNCCL``: its collectives bring ``Work`` objects, a watchdog thread and
(called directly) a side stream; captured in CUDA graphs, its collectives did not finish
(docs/performance-notes.md).
Here each collective is one ``nccl*`` call on ``torch.cuda.current_stream()``, which a capture
records like any kernel (the approach of vLLM's pynccl and SGLang), and the same communicator
serves eager steps and graph replays.

The library is the ``libnccl.so.2`` PyTorch already loaded (dlopen finds it by soname), or the
file ``MINIVLLM_NCCL_SO`` names (``minivllm.envs``).
"""

from __future__ import annotations

import ctypes
import functools
import time

import torch

_SUCCESS = 0
_DTYPES = {torch.int8: 0, torch.uint8: 1, torch.int32: 2, torch.int64: 4, torch.float16: 6,
           torch.float32: 7, torch.float64: 8, torch.bfloat16: 9}
_OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3}


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]


_P, _I, _SZ = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
_SIGNATURES = {
    "ncclGetVersion": [ctypes.POINTER(_I)],
    "ncclGetUniqueId": [ctypes.POINTER(UniqueId)],
    "ncclCommInitRank": [ctypes.POINTER(_P), _I, UniqueId, _I],
    "ncclAllReduce": [_P, _P, _SZ, _I, _I, _P, _P],
    "ncclBroadcast": [_P, _P, _SZ, _I, _I, _P, _P],
    "ncclSend": [_P, _SZ, _I, _I, _P, _P],
    "ncclRecv": [_P, _SZ, _I, _I, _P, _P],
    "ncclGroupStart": [],
    "ncclGroupEnd": [],
    "ncclCommAbort": [_P],
    "ncclCommDestroy": [_P],
}


@functools.cache
def load_library(path: str = "libnccl.so.2") -> ctypes.CDLL:
    """The NCCL shared library at ``path`` with argument types set (loaded once per process)."""
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise RuntimeError(f"cannot load the NCCL library {path!r} (set MINIVLLM_NCCL_SO to its path): {e}") from e
    for name, args in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, _I
    lib.ncclGetErrorString.argtypes, lib.ncclGetErrorString.restype = [_I], ctypes.c_char_p
    return lib


def _check(lib, result: int, what: str) -> None:
    if result != _SUCCESS:
        raise RuntimeError(f"{what} failed: NCCL error {result} ({lib.ncclGetErrorString(result).decode()})")


def nccl_version(path: str = "libnccl.so.2") -> int:
    """E.g. 22703 for NCCL 2.27.3."""
    lib = load_library(path)
    v = _I()
    _check(lib, lib.ncclGetVersion(ctypes.byref(v)), "ncclGetVersion")
    return v.value


class NcclCommunicator:
    """One rank's NCCL communicator; the unique id travels through ``store`` (a c10d Store).

    ``stop()`` returning True, or ``timeout_s``, ends rank 0's wait for the other ranks (one of them died).
    """

    def __init__(self, store, rank: int, world_size: int, device: torch.device, library: str = "libnccl.so.2",
                 timeout_s: float = 300.0, stop=lambda: False):
        self.lib = load_library(library)
        self.rank, self.size, self.device = rank, world_size, device
        # NOTE: ncclCommInitRank blocks with no timeout until every rank calls it, and nothing can
        # abort it: a store barrier (which has a timeout) first makes sure every rank got this far
        store.add("pynccl_arrived", 1)
        uid = UniqueId()
        if rank == 0:
            _wait_count(store, "pynccl_arrived", world_size, timeout_s, stop)
            _check(self.lib, self.lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
            store.set("pynccl_unique_id", bytes(uid.internal))
        else:
            ctypes.memmove(uid.internal, store.get("pynccl_unique_id"), 128)
        self.comm = _P()
        self.alive = True
        with torch.cuda.device(device):
            _check(self.lib, self.lib.ncclCommInitRank(ctypes.byref(self.comm), world_size, uid, rank),
                   "ncclCommInitRank")
            # NOTE: one eager collective, so NCCL sets up its connections now and not during a graph capture
            warm = torch.ones(1, device=device)
            self.all_reduce(warm)
            torch.cuda.synchronize(device)
        if int(warm.item()) != world_size:
            raise RuntimeError(f"NCCL warm-up all-reduce gave {warm.item()}, expected {world_size}")

    def _stream(self) -> ctypes.c_void_p:
        if not self.alive:
            raise RuntimeError("the NCCL communicator was aborted (a tensor-parallel peer failed)")
        return _P(torch.cuda.current_stream(self.device).cuda_stream)

    @staticmethod
    def _dtype(t: torch.Tensor) -> int:
        if t.dtype not in _DTYPES:
            raise TypeError(f"NCCL collectives do not support {t.dtype}")
        if not t.is_contiguous():
            raise ValueError("NCCL collectives need a contiguous tensor")
        return _DTYPES[t.dtype]

    def all_reduce(self, t: torch.Tensor, op: str = "sum") -> None:
        """In place over all ranks, on the current stream (graph-capturable)."""
        ptr = _P(t.data_ptr())
        _check(self.lib, self.lib.ncclAllReduce(ptr, ptr, t.numel(), self._dtype(t), _OPS[op], self.comm,
                                                self._stream()), "ncclAllReduce")

    def broadcast(self, t: torch.Tensor, src: int = 0) -> None:
        """In place: every rank's ``t`` becomes rank ``src``'s."""
        ptr = _P(t.data_ptr())
        _check(self.lib, self.lib.ncclBroadcast(ptr, ptr, t.numel(), self._dtype(t), src, self.comm,
                                                self._stream()), "ncclBroadcast")

    def gather(self, t: torch.Tensor, dst: int = 0) -> list[torch.Tensor] | None:
        """Every rank's ``t`` (same shape everywhere) on rank ``dst`` (grouped send/recv); None elsewhere."""
        dtype, stream, lib = self._dtype(t), self._stream(), self.lib
        if self.rank != dst:
            _check(lib, lib.ncclSend(_P(t.data_ptr()), t.numel(), dtype, dst, self.comm, stream), "ncclSend")
            return None
        parts = [t if r == dst else torch.empty_like(t) for r in range(self.size)]
        _check(lib, lib.ncclGroupStart(), "ncclGroupStart")
        try:
            for r, part in enumerate(parts):
                if r != dst:
                    _check(lib, lib.ncclRecv(_P(part.data_ptr()), t.numel(), dtype, r, self.comm, stream), "ncclRecv")
        finally:
            _check(lib, lib.ncclGroupEnd(), "ncclGroupEnd")
        return parts

    def abort(self) -> None:
        """Make this rank's pending NCCL kernels return and free the communicator (local: needs no peer).

        Callable from another thread (the executor's monitor, when a peer died); also the normal
        shutdown. Not ``ncclCommDestroy``, which can wait for peers that already exited.
        """
        if self.alive:
            self.alive = False
            self.lib.ncclCommAbort(self.comm)


def _wait_count(store, key: str, target: int, timeout_s: float, stop) -> None:
    """Block until the store counter ``key`` reaches ``target``, ``stop()`` is True, or ``timeout_s`` passed."""
    deadline = time.monotonic() + timeout_s
    while store.add(key, 0) < target:
        if stop():
            raise RuntimeError("tensor-parallel start aborted while waiting for the other ranks")
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {store.add(key, 0)} of {target} tensor-parallel ranks reached NCCL init")
        time.sleep(0.01)
