"""All-reduce latency on the GPUs of one host: NCCL (pynccl) vs the one-shot custom kernel.

    PYTHONPATH=. python benchmarks/bench_all_reduce.py --world 2

One process per GPU. Each size is checked first (custom == the float32 sum of every rank's input,
the same bits on every rank), then timed as a CUDA graph of ``--calls`` in-place all-reduces
replayed ``--iters`` times (what a decode step's graph does): microseconds per all-reduce.
"""

from __future__ import annotations

import argparse
import json
from datetime import timedelta

import torch

from minivllm.utils.rank_procs import run_ranks

SIZES_KB = [8, 32, 128, 512, 1024, 2048, 4096, 8192]


def _time_graph(fn, x: torch.Tensor, calls: int, iters: int) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(x)  # compile / connect outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn(x)
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


def worker(rank: int, world: int, port: int, args: argparse.Namespace) -> list[dict]:
    import torch.distributed as dist

    from minivllm.utils.custom_all_reduce import create_custom_all_reduce
    from minivllm.utils.pynccl import NcclCommunicator

    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=timedelta(seconds=120))
    comm = NcclCommunicator(store, rank, world, dev)
    car = create_custom_all_reduce(store, rank, world, dev, lambda t: comm.all_reduce(t, "min"))
    if car is None:
        raise RuntimeError("custom all-reduce setup failed (see the warning above)")
    rows = []
    for kb in args.sizes_kb:
        n = kb * 1024 // 2
        if n * 2 > car.max_bytes:
            car.max_bytes = n * 2  # NOTE: the benchmark also times sizes past the engine's switch-over
        if n * 2 > car.capacity:
            break
        inputs = [torch.randn(n, device=dev, generator=torch.Generator(dev).manual_seed(kb * 10 + r))
                  .to(torch.bfloat16) for r in range(world)]
        want = torch.stack([t.float() for t in inputs]).sum(0).to(torch.bfloat16)
        x = inputs[rank].clone()
        car.all_reduce(x)
        y = inputs[rank].clone()
        comm.all_reduce(y)
        torch.cuda.synchronize()
        exact = bool(torch.equal(x, want))
        nccl_err = (y.float() - want.float()).abs().max().item()
        z = torch.zeros(n, device=dev, dtype=torch.bfloat16)
        t_nccl = _time_graph(comm.all_reduce, z, args.calls, args.iters)
        t_custom = _time_graph(car.all_reduce, z, args.calls, args.iters)
        rows.append({"kb": kb, "nccl_us": t_nccl, "custom_us": t_custom, "custom_exact": exact,
                     "nccl_max_err": nccl_err})
    car.close()
    comm.abort()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--sizes-kb", type=int, nargs="+", default=SIZES_KB)
    ap.add_argument("--calls", type=int, default=20, help="all-reduces per CUDA graph")
    ap.add_argument("--iters", type=int, default=50, help="graph replays timed")
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    results = run_ranks(worker, args.world, args, timeout=args.timeout)
    rows = results[0]
    if isinstance(rows, str) or any(isinstance(r, str) for r in results.values()):
        raise SystemExit(f"failed: {results}")
    print(f"all-reduce of bf16 over {args.world} x {torch.cuda.get_device_name(0)} (CUDA graph of {args.calls}, "
          f"{args.iters} replays)")
    print(f"{'KB':>6}{'NCCL us':>10}{'custom us':>11}{'speedup':>9}{'custom exact':>14}{'NCCL max err':>14}")
    for i, r in enumerate(rows):
        exact = all(results[k][i]["custom_exact"] for k in results)  # every rank got the exact sum
        print(f"{r['kb']:>6}{r['nccl_us']:>10.2f}{r['custom_us']:>11.2f}{r['nccl_us'] / r['custom_us']:>8.2f}x"
              f"{str(exact):>14}{r['nccl_max_err']:>14.3g}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"world": args.world, "rows": rows, "by_rank": results}, f, indent=1)


if __name__ == "__main__":
    main()
