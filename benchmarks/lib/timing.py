"""Time GPU work the way the engine runs it: ``calls`` launches captured in one CUDA graph, replayed."""

from __future__ import annotations

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
