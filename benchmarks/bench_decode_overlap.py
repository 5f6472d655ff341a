"""Can a decode step's row-parallel sums hide behind their own matmul? (2 GPUs, one process per rank.)

    PYTHONPATH=. python benchmarks/bench_decode_overlap.py [--rows 48 112 240] [--slices 2 3 4]

At TP=2 a decode step's 72 all-reduces cost ~1 ms a step more than one rank's compute alone
(docs/benchmarks.md, eleventh session). Each follows a row-parallel matmul (o_proj: K = 2048,
down_proj: K = 6144 at Qwen3-8B's TP=2 shapes; N = 4096) whose ~64-128 output tiles leave SMs idle at
these row counts. Here the rows are cut into slices: the matmul of slice i + 1 runs on the main stream
while the one-shot custom all-reduce (the engine's, ``utils/custom_all_reduce.py``) sums slice i on a
side stream, in the same CUDA graph: the engine's own ``overlapped_row_parallel_linear``, as decode graphs run
it with ``MINIVLLM_TP_DECODE_OVERLAP_SLICES``.

Per row count and layer: the matmul alone, the all-reduce alone, the two in sequence (what the engine
does now) and the sliced overlap, in microseconds per layer (a CUDA graph of ``--calls`` layers,
replayed ``--iters`` times), PDL as the engine uses it. ``same`` says every rank's overlapped result
equals its sequential one bit for bit (the sums are elementwise, so slicing must not change a bit).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_all_reduce import _connect, rank_results  # noqa: E402
from graph_timing import time_in_graph  # noqa: E402

LAYERS = {"o_proj": 2048, "down_proj": 6144}  # K of Qwen3-8B's row-parallel layers at TP=2
N = 4096  # hidden size


class _SlicedGroup:
    """What ``overlapped_row_parallel_linear`` (the engine's path) asks of a ``TPGroup``: ``slices`` slices, each
    summed by the custom all-reduce ``car`` on ``side``."""

    def __init__(self, car, side: torch.cuda.Stream, slices: int):
        self.car, self.side, self.slices, self.num_overlapped_sums = car, side, slices, 0

    def row_sum_plan(self, rows: int) -> tuple[int, bool]:
        return self.slices, True

    def all_reduce(self, t: torch.Tensor) -> None:
        self.car.all_reduce(t)

    def side_stream(self) -> torch.cuda.Stream:
        return self.side


def worker(rank: int, world: int, port: int, args: argparse.Namespace) -> list[dict]:
    from minivllm.kernels.pdl import pdl_for_rows
    from minivllm.layers.overlapped_linear import overlapped_row_parallel_linear
    from minivllm.utils.custom_all_reduce import create_custom_all_reduce

    dev, store, comm = _connect(rank, world, port)
    car = create_custom_all_reduce(store, rank, world, dev, lambda t: comm.all_reduce(t, "min"))
    if car is None:
        raise RuntimeError("custom all-reduce setup failed (see the warning above)")
    side = torch.cuda.Stream(dev)
    g = torch.Generator(device=dev).manual_seed(rank)
    rows = []
    for m in args.rows:
        for name, k in LAYERS.items():
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16, generator=g)  # [m, K] this rank's input
            w = torch.randn(N, k, device=dev, dtype=torch.bfloat16, generator=g) / k**0.5  # [N, K] its shard
            y = torch.empty(m, N, device=dev, dtype=torch.bfloat16)

            def gemm(x=x, w=w, y=y):
                torch.matmul(x, w.t(), out=y)

            def seq(x=x, w=w, y=y):
                torch.matmul(x, w.t(), out=y)
                car.all_reduce(y)

            with pdl_for_rows(m):
                seq()
                want = y.clone()
                row = {"rows": m, "layer": name, "gemm_us": time_in_graph(gemm, args.calls, args.iters),
                       "all_reduce_us": time_in_graph(lambda y=y: car.all_reduce(y), args.calls, args.iters),
                       "sequential_us": time_in_graph(seq, args.calls, args.iters), "overlapped_us": {}, "same": True}
                for s in args.slices:
                    group = _SlicedGroup(car, side, s)
                    got = overlapped_row_parallel_linear(x, w, None, group)
                    torch.cuda.synchronize(dev)
                    row["same"] &= bool(torch.equal(got, want))
                    row["overlapped_us"][s] = time_in_graph(
                        lambda x=x, w=w, group=group: overlapped_row_parallel_linear(x, w, None, group),
                        args.calls, args.iters)
            rows.append(row)
    car.close()
    comm.abort()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[48, 112, 240])
    ap.add_argument("--slices", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--calls", type=int, default=20, help="layers per CUDA graph")
    ap.add_argument("--iters", type=int, default=30, help="graph replays timed")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    args.world = 2
    if torch.cuda.device_count() < 2:
        print("bench_decode_overlap.py needs 2 CUDA GPUs; nothing to do on this machine.")
        return
    results = rank_results(worker, args)
    print(f"row-parallel matmul + custom all-reduce over 2 x {torch.cuda.get_device_name(0)}, bf16, N = {N}; "
          f"us per layer (CUDA graph of {args.calls}, {args.iters} replays; rank 0)")
    print(f"{'rows':>5} {'layer':<10}{'GEMM':>8}{'sum':>8}{'both':>8}" + "".join(f"{f'{s} slices':>10}" for s in args.slices)
          + f"{'same':>6}")
    for i, r in enumerate(results[0]):
        same = all(results[k][i]["same"] for k in results)
        print(f"{r['rows']:>5} {r['layer']:<10}{r['gemm_us']:>8.2f}{r['all_reduce_us']:>8.2f}{r['sequential_us']:>8.2f}"
              + "".join(f"{r['overlapped_us'][s]:>10.2f}" for s in args.slices) + f"{str(same):>6}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"rows": results[0], "by_rank": results}, f, indent=1)


if __name__ == "__main__":
    main()
