"""Device memory that other processes can address: the CUDA driver's IPC calls over ctypes.

``IpcBuffer`` allocates with ``cuMemAlloc`` (outside PyTorch's caching allocator, so the handle
covers exactly this buffer) and exports a 64-byte ``cuIpcGetMemHandle`` handle; a peer process
maps it with ``open_ipc_handle`` and reads or writes it over NVLink / PCIe peer access. Every call
runs in the CUDA context current on the calling thread (PyTorch's primary context of the device).
"""

from __future__ import annotations

import ctypes
import functools

import torch

_P, _U, _SZ, _I = ctypes.c_uint64, ctypes.c_uint, ctypes.c_size_t, ctypes.c_int
HANDLE_BYTES = 64
_LAZY_ENABLE_PEER_ACCESS = 1


class IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_ubyte * HANDLE_BYTES)]


_SIGNATURES = {
    "cuCtxGetCurrent": [ctypes.POINTER(ctypes.c_void_p)],
    "cuMemAlloc_v2": [ctypes.POINTER(_P), _SZ],
    "cuMemFree_v2": [_P],
    "cuMemsetD8_v2": [_P, ctypes.c_ubyte, _SZ],
    "cuIpcGetMemHandle": [ctypes.POINTER(IpcHandle), _P],
    "cuIpcOpenMemHandle_v2": [ctypes.POINTER(_P), IpcHandle, _U],
    "cuIpcCloseMemHandle": [_P],
    "cuGetErrorString": [_I, ctypes.POINTER(ctypes.c_char_p)],
}


@functools.cache
def driver() -> ctypes.CDLL:
    """``libcuda.so.1`` with argument types set (loaded once per process)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise RuntimeError(f"cannot load the CUDA driver library libcuda.so.1: {e}") from e
    for name, args in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, _I
    return lib


def _check(result: int, what: str) -> None:
    if result != 0:
        msg = ctypes.c_char_p()
        driver().cuGetErrorString(result, ctypes.byref(msg))
        raise RuntimeError(f"{what} failed: CUDA driver error {result} ({(msg.value or b'?').decode()})")


def _require_context(device: torch.device) -> None:
    torch.cuda.set_device(device)
    torch.cuda.init()
    torch.empty(1, device=device)  # makes the primary context current on this thread
    ctx = ctypes.c_void_p()
    _check(driver().cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
    if not ctx.value:
        raise RuntimeError(f"no CUDA context is current on this thread for {device}")


class IpcBuffer:
    """``nbytes`` of zeroed device memory with an IPC handle other processes can open."""

    def __init__(self, nbytes: int, device: torch.device):
        if nbytes <= 0:
            raise ValueError(f"IpcBuffer needs a positive size, got {nbytes}")
        _require_context(device)
        lib, ptr = driver(), _P()
        _check(lib.cuMemAlloc_v2(ctypes.byref(ptr), nbytes), f"cuMemAlloc({nbytes})")
        self.ptr, self.nbytes = ptr.value, nbytes
        try:
            _check(lib.cuMemsetD8_v2(self.ptr, 0, nbytes), "cuMemsetD8")
            torch.cuda.synchronize(device)
            handle = IpcHandle()
            _check(lib.cuIpcGetMemHandle(ctypes.byref(handle), self.ptr), "cuIpcGetMemHandle")
            self.handle = ctypes.string_at(ctypes.addressof(handle), HANDLE_BYTES)  # may hold zero bytes
        except Exception:
            self.free()
            raise

    def free(self) -> None:
        if self.ptr:
            driver().cuMemFree_v2(self.ptr)
            self.ptr = 0


def open_ipc_handle(handle: bytes) -> int:
    """Map a peer's buffer into this process; returns its device address here."""
    if len(handle) != HANDLE_BYTES:
        raise ValueError(f"an IPC handle has {HANDLE_BYTES} bytes, got {len(handle)}")
    h = IpcHandle()
    ctypes.memmove(ctypes.addressof(h), handle, HANDLE_BYTES)
    ptr = _P()
    _check(driver().cuIpcOpenMemHandle_v2(ctypes.byref(ptr), h, _LAZY_ENABLE_PEER_ACCESS), "cuIpcOpenMemHandle")
    return ptr.value


def close_ipc_handle(ptr: int) -> None:
    driver().cuIpcCloseMemHandle(ptr)
