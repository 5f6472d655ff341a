"""All-reduce latency on the GPUs of one host: NCCL (pynccl) vs the one-shot custom kernel.

    PYTHONPATH=. python benchmarks/kernels/all_reduce.py --world 2

One process per GPU. Each size is checked first (custom == the float32 sum of every rank's input,
the same bits on every rank, for every kernel configuration in ``--configs``), then timed as a
CUDA graph of ``--calls`` in-place all-reduces replayed ``--iters`` times (what a decode step's
graph does): microseconds per all-reduce.

    PYTHONPATH=. python benchmarks/kernels/all_reduce.py --world 2 --fused-norm [--rows 1 8 64 256]
    PYTHONPATH=. python benchmarks/kernels/all_reduce.py --world 2 --nccl-mb 16 32 64 128

``--fused-norm``: a row-parallel layer's sum followed by the residual add + RMSNorm of [M, 4096] bf16
rows, as two kernels (the custom all-reduce, then ``fused_add_rms_norm``) against the one fused
kernel at each tile height in ``--tile-rows`` (0: the kernel's default); the fused results are
checked bit-equal to the two-kernel path first. ``--nccl-mb``: NCCL alone at prefill sizes (the
NCCL_* environment, e.g. ``NCCL_PROTO=Simple``, is printed with the table).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import timedelta

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from rank_procs import run_ranks  # noqa: E402
from timing import time_in_graph  # noqa: E402

SIZES_KB = [8, 32, 128, 512, 1024, 2048, 4096, 8192]


def _connect(rank: int, world: int, port: int):
    """This rank's GPU, the group's TCP store and a pynccl communicator over it."""
    import torch.distributed as dist

    from minivllm.distributed.pynccl import NcclCommunicator

    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=timedelta(seconds=120))
    return dev, store, NcclCommunicator(store, rank, world, dev)


def worker(rank: int, world: int, port: int, args: argparse.Namespace) -> list[dict]:
    from minivllm.distributed.custom_all_reduce import create_custom_all_reduce

    dev, store, comm = _connect(rank, world, port)
    cars = []
    for i, cfg in enumerate(args.configs):
        programs, block, warps = (int(v) for v in cfg.split("x"))
        cars.append(create_custom_all_reduce(store, rank, world, dev, lambda t: comm.all_reduce(t, "min"),
                                             tag=str(i), programs=programs, block=block, num_warps=warps))
        if cars[-1] is None:
            raise RuntimeError(f"custom all-reduce setup failed for {cfg} (see the warning above)")
    rows = []
    for kb in args.sizes_kb:
        n = kb * 1024 // 2
        if n * 2 > min(c.capacity for c in cars):
            break
        for c in cars:
            c.max_bytes = max(c.max_bytes, n * 2)  # NOTE: also times sizes past the engine's switch-over
        inputs = [torch.randn(n, device=dev, generator=torch.Generator(dev).manual_seed(kb * 10 + r))
                  .to(torch.bfloat16) for r in range(world)]
        want = torch.stack([t.float() for t in inputs]).sum(0).to(torch.bfloat16)
        exact = True
        for c in cars:
            x = inputs[rank].clone()
            c.all_reduce(x)
            torch.cuda.synchronize()
            exact &= bool(torch.equal(x, want))
        y = inputs[rank].clone()
        comm.all_reduce(y)
        torch.cuda.synchronize()
        nccl_err = (y.float() - want.float()).abs().max().item()
        z = torch.zeros(n, device=dev, dtype=torch.bfloat16)
        t_nccl = time_in_graph(lambda z=z: comm.all_reduce(z), args.calls, args.iters)
        t_custom = [time_in_graph(lambda c=c, z=z: c.all_reduce(z), args.calls, args.iters) for c in cars]
        rows.append({"kb": kb, "nccl_us": t_nccl, "custom_us": t_custom, "custom_exact": exact,
                     "nccl_max_err": nccl_err})
    for c in cars:
        c.close()
    comm.abort()
    return rows


def nccl_worker(rank: int, world: int, port: int, args: argparse.Namespace) -> list[dict]:
    """NCCL alone at prefill sizes (past the custom kernel's buffers): us per call and the bus bandwidth."""
    dev, _, comm = _connect(rank, world, port)
    rows = []
    for mb in args.nccl_mb:
        n = mb * (1 << 20) // 2
        z = torch.full((n,), 1.0, device=dev, dtype=torch.bfloat16)
        us = time_in_graph(lambda z=z: comm.all_reduce(z), 4, 10)
        # NOTE: nccl-tests' bus bandwidth: bytes x 2 (world - 1) / world / time
        rows.append({"mb": mb, "nccl_us": us, "busbw_gb_s": n * 2 * 2 * (world - 1) / world / us / 1e3})
    comm.abort()
    return rows


def rank_results(worker, args: argparse.Namespace) -> dict:
    """Run ``worker`` on every rank: ``{rank: result}``, or exit with every rank's traceback if any raised."""
    results = run_ranks(worker, args.world, args, timeout=args.timeout)
    if any(isinstance(r, str) for r in results.values()):
        raise SystemExit(f"failed: {results}")
    return results


def main_nccl(args: argparse.Namespace) -> None:
    results = rank_results(nccl_worker, args)
    env = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
    print(f"NCCL all-reduce of bf16 over {args.world} x {torch.cuda.get_device_name(0)} (CUDA graph of 4, 10 replays; {env})")
    print(f"{'MB':>6}{'us':>10}{'busbw GB/s':>12}")
    for r in results[0]:
        print(f"{r['mb']:>6}{r['nccl_us']:>10.1f}{r['busbw_gb_s']:>12.1f}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"world": args.world, "env": env, "rows": results[0], "by_rank": results}, f, indent=1)


def fused_norm_worker(rank: int, world: int, port: int, args: argparse.Namespace) -> list[dict]:
    from minivllm.distributed.custom_all_reduce import create_custom_all_reduce
    from minivllm.kernels.fused_norm import fused_add_rms_norm
    from minivllm.kernels.one_shot_all_reduce import norm_tile_rows, one_shot_all_reduce_add_rms_norm

    dev, store, comm = _connect(rank, world, port)
    car = create_custom_all_reduce(store, rank, world, dev, lambda t: comm.all_reduce(t, "min"))
    if car is None:
        raise RuntimeError("custom all-reduce setup failed (see the warning above)")
    d, eps = args.dim, 1e-6
    w = (1 + 0.1 * torch.randn(d, device=dev, generator=torch.Generator(dev).manual_seed(1))).to(torch.bfloat16)
    def measure(m: int) -> dict:
        car.max_bytes = max(car.max_bytes, m * d * 2)

        def gen(seed: int) -> torch.Tensor:
            return torch.randn(m, d, device=dev, generator=torch.Generator(dev).manual_seed(seed)).to(torch.bfloat16)

        x0, r0 = gen(100 * m + rank), gen(100 * m + 50)
        x, r = x0.clone(), r0.clone()
        car.all_reduce(x)
        want = fused_add_rms_norm(x, r, w, eps)
        tiles = [t or norm_tile_rows(m, d, car.counters.numel()) for t in args.tile_rows]
        exact = True
        for t in tiles:
            x, r = x0.clone(), r0.clone()
            one_shot_all_reduce_add_rms_norm(x, r, w, eps, car.ptrs, car.counters, car.capacity // 2, rank, world,
                                             rows=t)
            torch.cuda.synchronize()
            exact &= bool(torch.equal(x, want[0]) and torch.equal(r, want[1]))
        z, zr = torch.zeros(m, d, device=dev, dtype=torch.bfloat16), torch.zeros(m, d, device=dev, dtype=torch.bfloat16)

        def two_kernels():
            car.all_reduce(z)
            fused_add_rms_norm(z, zr, w, eps, inplace=True)

        def fused(t: int):
            one_shot_all_reduce_add_rms_norm(z, zr, w, eps, car.ptrs, car.counters, car.capacity // 2, rank, world,
                                             rows=t)

        t_two = time_in_graph(two_kernels, args.calls, args.iters)
        t_fused = [time_in_graph(lambda t=t: fused(t), args.calls, args.iters) for t in tiles]
        return {"m": m, "two_kernels_us": t_two, "fused_us": t_fused, "tiles": tiles, "exact": exact}

    rows = [measure(m) for m in args.rows if m * d * 2 <= car.capacity]
    car.close()
    comm.abort()
    return rows


def main_fused_norm(args: argparse.Namespace) -> None:
    results = rank_results(fused_norm_worker, args)
    rows = results[0]
    print(f"all-reduce + add + RMSNorm of [M, {args.dim}] bf16 over {args.world} x {torch.cuda.get_device_name(0)}"
          f" (CUDA graph of {args.calls}, {args.iters} replays)")
    print(f"{'M':>6}{'2 kernels us':>14}" + "".join(f"{'fused t=' + str(t or 'auto'):>14}" for t in args.tile_rows)
          + f"{'exact':>7}")
    for i, r in enumerate(rows):
        exact = all(results[k][i]["exact"] for k in results)
        print(f"{r['m']:>6}{r['two_kernels_us']:>14.2f}" + "".join(f"{t:>14.2f}" for t in r["fused_us"])
              + f"{str(exact):>7}   (auto = {r['tiles'][args.tile_rows.index(0)] if 0 in args.tile_rows else '-'})")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"world": args.world, "dim": args.dim, "rows": rows, "by_rank": results}, f, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--sizes-kb", type=int, nargs="+", default=SIZES_KB)
    ap.add_argument("--configs", nargs="+", default=["64x2048x8"],
                    help="custom kernel configurations PROGRAMSxBLOCKxWARPS (the first is the engine's)")
    ap.add_argument("--calls", type=int, default=20, help="all-reduces per CUDA graph")
    ap.add_argument("--iters", type=int, default=50, help="graph replays timed")
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--fused-norm", action="store_true", help="time the all-reduce + add + RMSNorm kernel instead")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64, 128, 256, 512])
    ap.add_argument("--tile-rows", type=int, nargs="+", default=[0, 1, 2, 4, 8])
    ap.add_argument("--dim", type=int, default=4096)
    ap.add_argument("--nccl-mb", type=int, nargs="+", default=None,
                    help="time NCCL alone at these sizes in MiB (prefill all-reduces), nothing else")
    args = ap.parse_args()
    if args.nccl_mb:
        return main_nccl(args)
    if args.fused_norm:
        return main_fused_norm(args)
    results = rank_results(worker, args)
    rows = results[0]
    print(f"all-reduce of bf16 over {args.world} x {torch.cuda.get_device_name(0)} (CUDA graph of {args.calls}, "
          f"{args.iters} replays)")
    print(f"{'KB':>6}{'NCCL us':>10}" + "".join(f"{c:>12}" for c in args.configs)
          + f"{'best x':>8}{'exact':>7}{'NCCL err':>10}")
    for i, r in enumerate(rows):
        exact = all(results[k][i]["custom_exact"] for k in results)  # every rank, every configuration
        print(f"{r['kb']:>6}{r['nccl_us']:>10.2f}" + "".join(f"{t:>12.2f}" for t in r["custom_us"])
              + f"{r['nccl_us'] / min(r['custom_us']):>7.2f}x{str(exact):>7}{r['nccl_max_err']:>10.3g}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"world": args.world, "rows": rows, "by_rank": results}, f, indent=1)


if __name__ == "__main__":
    main()
