"""A row-parallel matmul whose all-reduce overlaps it, chunk by chunk (prefill-sized inputs).

A prefill step of Qwen3-8B at TP=2 sums 73 outputs of 16k x 4096 bf16 (128 MB) through NCCL, ~0.46 ms
each on 2 x H200 (~20% of the step), while the GPU's tensor cores wait. Here the rows are cut into
``chunks`` slices: the matmul of slice i + 1 runs on the current stream while NCCL sums slice i on a
side stream, so only the last slice's sum is exposed. Sums are elementwise, so the result is the
one of the whole-tensor all-reduce.

``MINIVLLM_TP_OVERLAP_MIN_ROWS`` (``utils.tp_switches.overlap_min_rows``; 0, the default: off) is the
fewest rows that take this path and ``MINIVLLM_TP_OVERLAP_CHUNKS`` (default 4) the slice count. Both
ranks decide from the row count alone, so they always agree. Never inside a CUDA graph capture.

Decode-sized inputs take the same slicing with ``MINIVLLM_TP_DECODE_OVERLAP_SLICES`` (off by default; not yet
measured on GPUs): the one-shot custom all-reduce sums each slice on the side stream, in captured decode
graphs too (``TPGroup.row_sum_plan``).

NOTE: off by default because it hid little: 2 x H200, Qwen3-8B TP=2, 256 requests (2026-11-23): the
9 prefill steps took 1.83 s against 1.85 (4 slices; 1.87 with 8), 14,848 tok/s against 14,753 - within
run-to-run noise. NCCL's kernels likely take SMs from the concurrent GEMMs (not measured).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minivllm.utils.env import env_int


def overlap_chunks() -> int:
    """``MINIVLLM_TP_OVERLAP_CHUNKS``: slices of an overlapped row-parallel matmul (default 4)."""
    return env_int("MINIVLLM_TP_OVERLAP_CHUNKS", 4, minimum=1, what="a slice count")


def chunk_bounds(rows: int, chunks: int) -> list[tuple[int, int]]:
    """``chunks`` contiguous row ranges covering ``rows`` (sizes differ by at most one; none empty)."""
    chunks = max(1, min(chunks, rows))
    base, extra = divmod(rows, chunks)
    bounds, lo = [], 0
    for i in range(chunks):
        hi = lo + base + (i < extra)
        bounds.append((lo, hi))
        lo = hi
    return bounds


def overlapped_row_parallel_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                                   group) -> torch.Tensor:
    """``all_reduce(F.linear(x, weight, bias))`` for 2-D ``x`` [M, K] over ``group`` (a ``TPGroup``, whose
    ``row_sum_plan`` gives the slices and the sum), the sums of each slice overlapping the next slice's matmul
    (in order, on the CPU)."""
    slices, custom = group.row_sum_plan(x.shape[0])
    sum_slice = group.all_reduce if custom else group.sum_large
    y = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)  # [M, N]
    bounds = chunk_bounds(x.shape[0], slices)
    group.num_overlapped_sums += len(bounds)
    side = group.side_stream()
    if side is None:  # CPU: the same slicing, one after the other
        for lo, hi in bounds:
            y[lo:hi] = F.linear(x[lo:hi], weight, bias)
            sum_slice(y[lo:hi])
        return y
    main = torch.cuda.current_stream(x.device)
    for lo, hi in bounds:
        torch.matmul(x[lo:hi], weight.t(), out=y[lo:hi])  # [hi - lo, N]
        if bias is not None:
            y[lo:hi] += bias
        done = torch.cuda.Event()
        done.record(main)
        side.wait_event(done)
        with torch.cuda.stream(side):
            sum_slice(y[lo:hi])
    # NOTE: y (allocated on main) is only used by the side stream before this wait, so main's
    # caching allocator may reuse it afterwards without record_stream
    main.wait_stream(side)
    return y
