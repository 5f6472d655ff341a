"""Programmatic dependent launch (PDL, Hopper and later): a kernel's programs start while the one
before it on the stream finishes, instead of after it.

A decode step is ~500 small kernels (13 a layer at TP=2, most of them 2-15 us), and each one
normally starts only after its predecessor has fully drained and the launch of the next has gone
through the GPU's front end. With PDL (``launch_pdl=True``, kept in CUDA graphs as programmatic
edges) the next kernel's programs are launched as soon as every program of the running kernel has
called ``gdc_launch_dependents`` (or exited), and they block in ``gdc_wait`` until that kernel has
completed and its writes are visible.

NOTE: the invariant every kernel launched with :func:`pdl_options` keeps: ``pdl_wait`` is its first
statement, before any global load or store, in every program (early returns included). Then a
kernel sees everything written by every kernel before it on the stream (each predecessor itself
waited for its own predecessor before completing), and it cannot overwrite what a predecessor still
reads. Kernels launched without PDL (cuBLAS, NCCL, torch) keep the ordinary stream order.

On by default on GPUs of compute capability 9.0 and later for batches of at most 16 rows
(``MINIVLLM_PDL_MAX_ROWS``; ``MINIVLLM_PDL=0`` turns it off); CPU
tensors, the Triton interpreter and older GPUs never use it. Measured on 2 x H200 (2026-11-23,
``benchmarks/bench_pdl.py``): 36 layers of Qwen3-8B decode kernels at TP=2 shapes, 2771 -> 2586 us a
step at one row; the TP=2 engine 3.51 -> 3.43 ms/token.
"""

from __future__ import annotations

import contextvars
import functools
import os
from contextlib import contextmanager

import torch
import triton
import triton.language as tl

from minivllm.utils.env import env_int, env_switch

# NOTE: False inside ``pdl_for_rows`` of a batch larger than MINIVLLM_PDL_MAX_ROWS (per thread / task)
_ROWS_ALLOW = contextvars.ContextVar("minivllm_pdl_rows_allow", default=True)


def pdl_max_rows() -> int:
    """``MINIVLLM_PDL_MAX_ROWS``: the largest batch (rows or tokens) whose kernels launch with PDL (default 16).

    NOTE: 2 x H200, Qwen3-8B TP=2 decode (2026-11-23, ``profile_step.py --decode-rows``): 48 rows took 5.03 ms
    a step with PDL and 4.86 without (the custom all-reduce's in-engine cost 0.70 vs 0.46 ms), 240 rows 9.51
    vs 9.56; one row gains with it. The 256-request run: 14,815 tok/s with the limit at 16, 14,585 off. At TP=1
    too (H200, 2026-11-23, nano): 256 rows lost 0.5% on Qwen3-8B and 0.7% on one rank's shapes of it.
    """
    return env_int("MINIVLLM_PDL_MAX_ROWS", 16, what="a row count")


@contextmanager
def pdl_for_rows(rows: int):
    """Within the block, kernels launch with PDL only if ``rows <= pdl_max_rows()`` (and :func:`use_pdl`)."""
    token = _ROWS_ALLOW.set(rows <= pdl_max_rows())
    try:
        yield
    finally:
        _ROWS_ALLOW.reset(token)


@functools.cache
def _hopper_or_later(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0)


def use_pdl(t: torch.Tensor) -> bool:
    """Whether kernels working on ``t`` launch with PDL (a CUDA tensor on sm_90+, unless ``MINIVLLM_PDL=0`` or
    inside :func:`pdl_for_rows` of a batch over ``MINIVLLM_PDL_MAX_ROWS``)."""
    if (not t.is_cuda or os.environ.get("TRITON_INTERPRET") == "1" or not env_switch("MINIVLLM_PDL", True)
            or not _ROWS_ALLOW.get()):
        return False
    return _hopper_or_later(t.device.index if t.device.index is not None else torch.cuda.current_device())


def pdl_options(t: torch.Tensor) -> dict:
    """Keyword arguments for a launch of a kernel with a ``USE_PDL`` constexpr that calls :func:`pdl_wait`."""
    return {"USE_PDL": True, "launch_pdl": True} if use_pdl(t) else {"USE_PDL": False}


@triton.jit
def pdl_wait(USE_PDL: tl.constexpr):
    """Wait for the previous kernel on the stream (all its writes visible), then let the next one launch."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
