"""How the kernel benchmarks time GPU work, in microseconds per call (CUDA only).

- :func:`time_in_graph`: ``calls`` launches captured in one CUDA graph, replayed; the mean over the replays
  (GPU time, the way the engine's decode graphs run).
- :func:`event_median_us`: the median of samples between two CUDA events, each sample ``reps`` calls
  launched eagerly from Python or replayed as one CUDA graph; a hook before each sample (flush L2, ...).
- :func:`do_bench_us`: Triton's ``do_bench`` (eager launches, CPU overhead included) or ``do_bench_cudagraph``
  (replayed graph), median.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch


def time_in_graph(fn, calls: int = 20, iters: int = 50) -> float:
    """Microseconds per ``fn()`` (``fn`` runs once eagerly on a side stream first: compiles, connects)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    del graph
    return 1000 * start.elapsed_time(end) / (iters * calls)


def event_median_us(fn, iters: int, *, reps: int = 1, graph: bool = False, warmup: int = 3,
                    before_sample: Callable[[], object] | None = None) -> float:
    """Median over ``iters`` samples of one ``fn()``'s time in microseconds.

    ``fn`` first runs ``warmup`` times eagerly (compiles, outside any capture). A sample is ``reps`` back-to-back
    calls between two CUDA events: launched from Python one by one, or (``graph``) one replay of a CUDA graph of
    them; its time is divided by ``reps``. The calls run once untimed before the first sample. ``before_sample()``,
    when given, runs before each sample's start event (e.g. flush L2, or queue a spin kernel so that the events
    time the kernels and not their launches).
    """
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(reps):
                fn()
        run = g.replay
    else:
        def run():
            for _ in range(reps):
                fn()
    run()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(iters):
        if before_sample is not None:
            before_sample()
        start.record()
        run()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / reps)
    return statistics.median(samples)


def do_bench_us(fn, cuda_graph: bool = False) -> float:
    """Median microseconds of ``fn()`` by ``triton.testing.do_bench`` (eager launches), or ``do_bench_cudagraph``
    (a replayed CUDA graph) with ``cuda_graph``. ``fn`` runs once first, outside any graph capture."""
    import triton.testing

    fn()  # compile outside any graph capture
    torch.cuda.synchronize()  # NOTE: do_bench_cudagraph runs fn on a new stream: inputs must be ready
    if cuda_graph:
        return triton.testing.do_bench_cudagraph(fn, return_mode="median") * 1e3
    return triton.testing.do_bench(fn, return_mode="median") * 1e3
