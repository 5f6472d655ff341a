"""Tensor-parallel rank and world size of this process (1 rank when torch.distributed is off).

Also the process-group lifecycle the model runners use: ``init_distributed`` (NCCL on CUDA,
gloo on the CPU), ``abort_distributed`` (from a monitor thread, when a peer died) and
``destroy_distributed``.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

# Collective timeout. NOTE: dead workers are detected by the executor's monitor long before
# this; the timeout only ends waits on a peer that is alive but stuck.
DEFAULT_TIMEOUT_S = float(os.environ.get("MINIVLLM_TP_TIMEOUT_S", "300"))


def tp_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def tp_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def divide(numerator: int, denominator: int) -> int:
    if numerator % denominator:
        raise ValueError(f"{numerator} is not divisible by {denominator}")
    return numerator // denominator


def init_distributed(device: torch.device, init_method: str, world_size: int, rank: int,
                     timeout_s: float | None = None) -> None:
    """Join the tensor-parallel process group: NCCL for CUDA devices (set the device first), gloo on the CPU."""
    if init_method is None:
        raise ValueError("tensor_parallel_size > 1 needs a rendezvous address (dist_init_method)")
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=init_method, world_size=world_size, rank=rank,
                            timeout=timedelta(seconds=timeout_s or DEFAULT_TIMEOUT_S))


def abort_distributed() -> None:
    """Make pending NCCL collectives of this process return (a peer died). No-op for gloo.

    NOTE: gloo needs nothing: a dead peer closes its sockets and the pending collective raises.
    NCCL kernels would spin until the timeout instead, so the communicators are aborted.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_backend() != "nccl":
        return
    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    try:
        if abort is not None:
            abort()
        else:  # older torch
            dist.distributed_c10d._get_default_group()._get_backend(torch.device("cuda")).abort()
    except Exception:  # noqa: BLE001 - best effort: the caller reports the dead worker either way
        pass


def destroy_distributed() -> None:
    """Leave the process group (idempotent; safe after a peer died or after an abort)."""
    if dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - the group may already be aborted or broken
            pass
