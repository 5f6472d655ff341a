"""Can copy engines hide the tensor-parallel prefill sums? (2 GPUs of one host, one process; an experiment.)

At TP=2 each row-parallel layer of a 16k-token prefill step leaves a [rows, hidden] partial on each GPU
(128 MB for Qwen3-8B) that must be summed. NCCL's kernels take SMs from concurrent matmuls, so
overlapping them with the next slice's matmul hid little (eighth session: 1.85 -> 1.83 s of prefill).
Peer copies run on the copy engines, which use no SMs. This measures, on GPUs 0 and 1:

- ``copy``: a peer copy of the partial's size one way, then both ways at once (GB/s);
- ``ce_sum``: a copy-engine all-reduce of the partials: each GPU sends the half of the rows the other
  owns, adds the half it receives to its own, and sends its summed half back (checked against the sum);
- ``gemm``: the row-parallel matmul that makes the partials (x [rows, K] @ w [hidden, K]^T), in ``--chunks``
  row slices on each GPU's compute stream;
- ``overlap``: the same matmuls with each slice's ``ce_sum`` on side streams while the next slice multiplies.
  ``hidden %`` = (gemm + ce_sum - overlap) / ce_sum: 100% means the sums cost nothing.

    python3 benchmarks/bench_ce_overlap.py [--rows 16384] [--hidden 4096] [--k 6144 2048] [--chunks 1 4 8]

Compare ``ce_sum`` with NCCL at the same size: ``bench_all_reduce.py --nccl-mb 128``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch


def timed(fn, devices, iters: int) -> float:
    """Median milliseconds of ``fn()`` (host wall time, every device synchronised before and after)."""
    fn()
    times = []
    for _ in range(iters):
        for d in devices:
            torch.cuda.synchronize(d)
        t = time.perf_counter()
        fn()
        for d in devices:
            torch.cuda.synchronize(d)
        times.append(1000 * (time.perf_counter() - t))
    return statistics.median(times)


class CopyEngineSum:
    """Sums two GPUs' [rows, hidden] partials in place with peer copies (copy engines) and one add on each.

    NOTE: torch runs a cross-device ``copy_`` on the source device's current stream and makes the
    destination's current stream wait for it, so ``run`` must be called with the side streams current on
    both devices."""

    def __init__(self, rows: int, hidden: int, dtype: torch.dtype):
        self.recv = [torch.empty(rows, hidden, dtype=dtype, device=d) for d in (0, 1)]  # the other's rows

    def run(self, y0: torch.Tensor, y1: torch.Tensor) -> None:
        """``y0`` (GPU 0) and ``y1`` (GPU 1), both [n, hidden], each become ``y0 + y1``. GPU 0 sums the first
        n // 2 rows, GPU 1 the others."""
        n = y0.shape[0]
        h = n // 2
        r0, r1 = self.recv[0][:h], self.recv[1][: n - h]
        r0.copy_(y1[:h], non_blocking=True)  # GPU 1 -> 0: the rows GPU 0 sums
        r1.copy_(y0[h:], non_blocking=True)  # GPU 0 -> 1: the rows GPU 1 sums
        with torch.cuda.device(0):
            y0[:h].add_(r0)
        with torch.cuda.device(1):
            y1[h:].add_(r1)
        y1[:h].copy_(y0[:h], non_blocking=True)  # the summed rows back
        y0[h:].copy_(y1[h:], non_blocking=True)


def pipeline(x, w, out, slices, summer: CopyEngineSum, side, do_gemm: bool = True, do_sum: bool = True) -> None:
    """Per row slice: each GPU's ``out[d][slice] = x[d][slice] @ w[d]^T`` on its compute stream, then (on the
    side streams, once both are done) the copy-engine sum of the slice, while the next slice multiplies."""
    for lo, hi in slices:
        ready = []
        for d in (0, 1):
            with torch.cuda.device(d):
                if do_gemm:
                    torch.matmul(x[d][lo:hi], w[d].t(), out=out[d][lo:hi])
                ev = torch.cuda.Event()
                ev.record(torch.cuda.current_stream(d))
                ready.append(ev)
        if do_sum:
            for d in (0, 1):
                side[d].wait_event(ready[0])
                side[d].wait_event(ready[1])
            with torch.cuda.stream(side[0]), torch.cuda.stream(side[1]):
                summer.run(out[0][lo:hi], out[1][lo:hi])
    for d in (0, 1):  # the compute streams wait for the last sums
        torch.cuda.current_stream(d).wait_stream(side[d])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=16384)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--k", type=int, nargs="+", default=[6144, 2048], help="matmul inner sizes (down_proj, o_proj)")
    p.add_argument("--chunks", type=int, nargs="+", default=[1, 4, 8])
    p.add_argument("--iters", type=int, default=10)
    args = p.parse_args(argv)
    if args.rows < 2 or args.hidden < 1 or args.iters < 1 or min(args.k) < 1 or min(args.chunks) < 1:
        p.error("--rows must be >= 2, and --hidden, --k, --chunks and --iters >= 1")
    if max(args.chunks) > args.rows // 2:
        p.error(f"--chunks must be at most --rows / 2 ({args.rows // 2}): each slice is split between the GPUs")
    if torch.cuda.device_count() < 2:
        print("bench_ce_overlap.py needs 2 CUDA GPUs; nothing to do on this machine.")
        return 0
    dtype, devs = torch.bfloat16, [torch.device("cuda", 0), torch.device("cuda", 1)]
    rows, hidden = args.rows, args.hidden
    side = [torch.cuda.Stream(device=d) for d in devs]
    nbytes = rows * hidden * 2
    print(f"# {torch.cuda.get_device_name(0)} x 2, peer access {torch.cuda.can_device_access_peer(0, 1)}; "
          f"partial [{rows}, {hidden}] bf16 = {nbytes / 2**20:.0f} MiB; median ms of {args.iters}")

    a = [torch.randn(rows, hidden, dtype=dtype, device=d) for d in devs]
    b = [torch.empty_like(t) for t in a]
    one_way = timed(lambda: b[1].copy_(a[0], non_blocking=True), devs, args.iters)

    def both_ways():
        with torch.cuda.stream(side[0]), torch.cuda.stream(side[1]):
            b[1].copy_(a[0], non_blocking=True)
            b[0].copy_(a[1], non_blocking=True)

    two_way = timed(both_ways, devs, args.iters)
    print(f"copy one way {one_way:.3f} ms ({nbytes / one_way / 1e6:.0f} GB/s); both ways {two_way:.3f} ms "
          f"({nbytes / two_way / 1e6:.0f} GB/s each way)")

    summer = CopyEngineSum(rows, hidden, dtype)
    y = [t.clone() for t in a]
    want = (a[0].float() + a[1].to(devs[0]).float()).to(dtype)
    with torch.cuda.stream(side[0]), torch.cuda.stream(side[1]):
        summer.run(y[0], y[1])
    for d in devs:
        torch.cuda.synchronize(d)
    ok = torch.equal(y[0], want) and torch.equal(y[1].to(devs[0]), want)
    print(f"ce_sum result equals the sum on both GPUs: {ok}")
    if not ok:
        return 1

    print(f"{'K':>6} {'chunks':>6} | {'gemm ms':>8} {'ce_sum ms':>9} {'overlap ms':>10} {'hidden %':>8}")
    for k in args.k:
        x = [torch.randn(rows, k, dtype=dtype, device=d) for d in devs]
        w = [torch.randn(hidden, k, dtype=dtype, device=d) / k**0.5 for d in devs]
        out = [torch.zeros(rows, hidden, dtype=dtype, device=d) for d in devs]
        for chunks in args.chunks:
            bounds = [rows * i // chunks for i in range(chunks + 1)]
            slices = list(zip(bounds[:-1], bounds[1:]))

            run = [x, w, out, slices, summer, side]
            t_gemm = timed(lambda r=run: pipeline(*r, do_sum=False), devs, args.iters)
            t_sum = timed(lambda r=run: pipeline(*r, do_gemm=False), devs, args.iters)
            t_both = timed(lambda r=run: pipeline(*r), devs, args.iters)
            hidden_pct = 100 * (t_gemm + t_sum - t_both) / t_sum
            print(f"{k:>6} {chunks:>6} | {t_gemm:>8.3f} {t_sum:>9.3f} {t_both:>10.3f} {hidden_pct:>7.0f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
