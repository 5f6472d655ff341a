"""Does an L2 prefetch of a weight, run while latency-bound kernels hold the GPU, speed up its GEMM?

    PYTHONPATH=. python benchmarks/bench_prefetch.py [--rows 1 16 48 128] [--windows-us 0 5 10]
        [--modes line bulk load] [--mb 16 32] [--programs 16 64]

Each timed call, captured 20 times in a CUDA graph and replayed, is what sits between two GEMMs of
a decode step: a ``window`` (a one-program kernel spinning for the given microseconds, standing in
for an all-reduce + RMSNorm), then ``linear(x, w)`` (the engine's routing: the Triton GEMV up to its
row limit, cuBLAS above) on the next of enough weight copies (> 200 MB) that L2 cannot keep them. With
a prefetch, a side-stream branch forks at the call's start and prefetches the first ``mb`` MB of that
weight while the window runs. The table shows the GEMM's share: the call's time minus the window's alone.
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gemv import MODELS, shapes  # noqa: E402
from graph_timing import time_in_graph  # noqa: E402
from l2_prefetch import l2_prefetch  # noqa: E402

from minivllm.layers.linear import linear  # noqa: E402


@triton.jit
def _spin_kernel(cycles):
    start = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
    now = start
    while now - start < cycles:
        now = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64, is_pure=False,
                                        pack=1)


def spin(us: float, mhz: float) -> None:
    if us > 0:
        _spin_kernel[(1,)](int(us * mhz), num_warps=1)


def make_call(ws: list[torch.Tensor], x: torch.Tensor, side: torch.cuda.Stream, mhz: float):
    """One call between two GEMMs: the window (with a forked prefetch of the next weight), then the GEMM."""
    state = {"i": 0}

    def call(window: float, variant=None):
        state["i"] += 1
        w = ws[state["i"] % len(ws)]
        if variant:
            mode, mb, programs = variant
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                l2_prefetch(w, mb << 20, mode, programs)
        spin(window, mhz)
        out = linear(x, w, None)
        if variant:
            torch.cuda.current_stream().wait_stream(side)
        return out

    return call


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16, 48, 128])
    ap.add_argument("--windows-us", type=float, nargs="+", default=[0, 5, 10])
    ap.add_argument("--modes", nargs="+", default=["line", "bulk", "load"])
    ap.add_argument("--mb", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--programs", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--model", default="8b", choices=list(MODELS))
    ap.add_argument("--tps", type=int, nargs="+", default=[2, 1])
    args = ap.parse_args()
    mhz = torch.cuda.get_device_properties(0).clock_rate / 1e3  # NOTE: the SM clock (kHz -> MHz)
    variants = [(m, mb, p) for m in args.modes for mb in args.mb for p in args.programs]
    names = [f"{m}/{mb}M/{p}" for m, mb, p in variants]
    print(f"L2 prefetch before a GEMM on {torch.cuda.get_device_name(0)} (SM clock {mhz:.0f} MHz), bf16: "
          "the GEMM's microseconds after a window of latency-bound work")
    print(f"{'shape':<16}{'M':>4}{'window':>7}{'alone':>8}{'none':>8}" + "".join(f"{n:>14}" for n in names))
    side = torch.cuda.Stream()
    for tp in args.tps:
        for name, n, k in shapes(*MODELS[args.model], tp):
            copies = max(2, -(-200 * 2**20 // (n * k * 2)))
            ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for _ in range(copies)]
            for m in args.rows:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                call = make_call(ws, x, side, mhz)
                alone = time_in_graph(partial(call, 0))
                for window in args.windows_us:
                    base = time_in_graph(partial(spin, window, mhz)) if window > 0 else 0.0
                    cells = [time_in_graph(partial(call, window)) - base]
                    for v in variants:
                        cells.append(time_in_graph(partial(call, window, v)) - base)
                    print(f"{name + f' tp{tp}':<16}{m:>4}{window:>7.0f}{alone:>8.2f}"
                          + "".join(f"{c:>8.2f}" if i == 0 else f"{c:>14.2f}" for i, c in enumerate(cells)),
                          flush=True)
            del ws


if __name__ == "__main__":
    main()
