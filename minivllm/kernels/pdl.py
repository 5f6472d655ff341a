"""Programmatic dependent launch (PDL, Hopper and later): a kernel's programs start while the one
before it on the stream finishes, instead of after it.

A decode step is hundreds of small kernels (13 a layer at TP=2), most of them short enough that the
gaps between them count (``PYTHONPATH=. python benchmarks/engine/profile_step.py --decode-rows 1`` lists
them), and each one normally starts only after its predecessor has fully drained and the launch of the
next has gone through the GPU's front end. With PDL (``launch_pdl=True``, kept in CUDA graphs as programmatic
edges) the next kernel's programs are launched as soon as every program of the running kernel has
called ``gdc_launch_dependents`` (or exited), and they block in ``gdc_wait`` until that kernel has
completed and its writes are visible.

NOTE: the invariant every kernel launched with :func:`pdl_options` keeps: ``pdl_wait`` is its first
statement, before any global load or store, in every program (early returns included). Then a
kernel sees everything written by every kernel before it on the stream (each predecessor itself
waited for its own predecessor before completing), and it cannot overwrite what a predecessor still
reads. Kernels launched without PDL (cuBLAS, NCCL, torch) keep the ordinary stream order.

Kernels launched with :func:`pdl_options` use it on GPUs of compute capability 9.0 and later when their
leading tensor holds at most ``PDL_MAX_ROWS`` rows (a decode step of up to 16 sequences: a forward's
kernels all see the step's token count there, so one step never mixes the two launch modes); CPU tensors
(Triton's interpreter) and older GPUs never use it. Above 16 rows PDL lost throughput
(docs/performance-notes.md).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

PDL_MAX_ROWS = 16


@functools.cache
def _hopper_or_later(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0)


def use_pdl(t: torch.Tensor) -> bool:
    """Whether kernels working on ``t`` (``[rows, ...]``) launch with PDL: a CUDA tensor on sm_90+ with at most
    ``PDL_MAX_ROWS`` rows."""
    if not t.is_cuda or t.dim() == 0 or t.shape[0] > PDL_MAX_ROWS:
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
