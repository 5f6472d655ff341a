"""Environment switches of the tensor-parallel paths (no torch import): which NCCL path, CUDA graphs, the
custom all-reduce, the fused all-reduce + norm, the overlapped row-parallel sums (prefill and decode)."""

from __future__ import annotations

import os

from minivllm.utils.env import env_int, env_switch


def nccl_comm_kind() -> str:
    """Which NCCL path GPU groups use: ``pynccl`` (ctypes, current stream) or ``c10d`` (ProcessGroupNCCL).

    ``MINIVLLM_TP_COMM`` picks one; pynccl is the default since it ran TP=2 with CUDA graphs on 2 H200s
    (2026-11-22; c10d collectives captured in graphs did not finish there).
    """
    kind = os.environ.get("MINIVLLM_TP_COMM", "pynccl")
    if kind not in ("pynccl", "c10d"):
        raise ValueError(f"MINIVLLM_TP_COMM must be 'pynccl' or 'c10d', not {kind!r}")
    return kind


def tp_cuda_graphs_enabled() -> bool:
    """CUDA graphs with tensor parallelism: on with the pynccl path, off with c10d (stalled on 2 H200s).

    ``MINIVLLM_TP_CUDA_GRAPHS=1`` / ``0`` forces them on / off (to debug the NCCL-in-graph path).
    """
    forced = os.environ.get("MINIVLLM_TP_CUDA_GRAPHS")
    return forced == "1" if forced in ("0", "1") else nccl_comm_kind() == "pynccl"


def custom_all_reduce_enabled() -> bool:
    """The one-shot all-reduce kernel for small sums on GPUs (pynccl path); ``MINIVLLM_CUSTOM_AR=0`` turns it off."""
    return env_switch("MINIVLLM_CUSTOM_AR", True)


def fused_all_reduce_norm_enabled() -> bool:
    """Tensor-parallel models sum a row-parallel layer's output inside the next RMSNorm (one kernel with the
    custom all-reduce, for up to ``MINIVLLM_FUSED_AR_NORM_MAX_ROWS`` rows); ``MINIVLLM_FUSED_AR_NORM=0`` turns
    it off. 2 x H200, Qwen3-8B TP=2 (2026-11-23, with PDL): one request 3.43 -> 3.34 ms/token."""
    return env_switch("MINIVLLM_FUSED_AR_NORM", True)


def overlap_min_rows() -> int:
    """``MINIVLLM_TP_OVERLAP_MIN_ROWS``: the fewest rows whose row-parallel sum overlaps the matmul in slices
    (``layers/overlapped_linear.py``; 0, the default: never)."""
    return env_int("MINIVLLM_TP_OVERLAP_MIN_ROWS", 0, what="a row count")


def decode_overlap_slices() -> int:
    """``MINIVLLM_TP_DECODE_OVERLAP_SLICES`` (0, the default: off): row-parallel layers of
    ``MINIVLLM_TP_DECODE_OVERLAP_MIN_ROWS`` (17) to ``MINIVLLM_TP_DECODE_OVERLAP_MAX_ROWS`` (256) rows, decode
    graphs included, sum their output in this many slices with the custom all-reduce on a side stream, each
    under the next slice's matmul. Experimental: measured on no GPU yet (``benchmarks/bench_decode_overlap.py``)."""
    return env_int("MINIVLLM_TP_DECODE_OVERLAP_SLICES", 0, what="a slice count")


def decode_overlap_rows() -> tuple[int, int]:
    """``(MINIVLLM_TP_DECODE_OVERLAP_MIN_ROWS, MINIVLLM_TP_DECODE_OVERLAP_MAX_ROWS)``: the row counts the decode
    overlap takes (defaults 17 and 256: batches above the fused all-reduce + norm, up to the largest decode graph)."""
    lo = env_int("MINIVLLM_TP_DECODE_OVERLAP_MIN_ROWS", 17, minimum=1, what="a row count")
    hi = env_int("MINIVLLM_TP_DECODE_OVERLAP_MAX_ROWS", 256, minimum=1, what="a row count")
    if lo > hi:
        raise ValueError(f"MINIVLLM_TP_DECODE_OVERLAP_MIN_ROWS ({lo}) is above MINIVLLM_TP_DECODE_OVERLAP_MAX_ROWS ({hi})")
    return lo, hi
