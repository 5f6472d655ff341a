"""The Triton GEMV against cuBLAS (``F.linear``) at the decode shapes of Qwen3-8B and -32B, bf16.

    PYTHONPATH=. python benchmarks/bench_gemv.py [--rows 1] [--configs 32x256x4x4 32x256x4x4x2 ...]

Each shape is timed as a CUDA graph of 20 calls cycling over enough weight copies (> 200 MB)
that L2 cannot hold them; TB/s counts the weight bytes read. Configurations are
``BLOCK_NxBLOCK_KxSTAGESxWARPS`` (default: the kernel's default config). NOTE: the kernel only
runs in the engine for weights of at least ``MIN_WEIGHT_NUMEL`` elements; smaller shapes here are
measured to see where that bound should sit.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from graph_timing import time_in_graph  # noqa: E402

from minivllm.kernels.gemv import gemv, gemv_config  # noqa: E402


def shapes(hidden: int, heads: int, kv_heads: int, inter: int, tp: int, head_dim: int = 128) -> list[tuple]:
    """A decoder layer's four linear weights ``(N, K)`` on one of ``tp`` ranks."""
    kv = max(1, kv_heads // tp)
    return [("qkv", (heads // tp + 2 * kv) * head_dim, hidden), ("o", hidden, heads // tp * head_dim),
            ("gate_up", 2 * inter // tp, hidden), ("down", hidden, inter // tp)]


# (name, N, K): Qwen3-8B, Qwen3-32B and Qwen3-0.6B, at TP=2, 1 and 4
MODELS = {"8b": (4096, 32, 8, 12288), "32b": (5120, 64, 8, 25600), "0.6b": (1024, 16, 8, 3072)}
SHAPES = [(f"{name} {model} tp{tp}", n, k) for model, dims in MODELS.items() for tp in (2, 1, 4)
          for name, n, k in shapes(*dims, tp)]


def cycling(f, x: torch.Tensor, ws: list[torch.Tensor], config=None):
    """``f(x, w)`` with the next weight copy at each call (so a captured graph cycles over them)."""
    state = {"i": 0}
    kw = {"config": config} if config else {}

    def call():
        state["i"] += 1
        return f(x, ws[state["i"] % len(ws)], **kw)

    return call


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[1])
    ap.add_argument("--configs", nargs="+", default=None)
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    args = ap.parse_args()
    configs = [tuple(int(v) for v in c.split("x")) for c in args.configs] if args.configs else [gemv_config(1, 1)]
    names = ["x".join(map(str, c)) for c in configs]
    print(f"GEMV vs cuBLAS on {torch.cuda.get_device_name(0)}, bf16, microseconds (TB/s of weight reads)")
    print(f"{'shape':<14}{'M':>3}{'cuBLAS':>16}" + "".join(f"{n:>18}" for n in names) + f"{'max rel err':>13}")
    for m in args.rows:
        for name, n, k in SHAPES:
            if name.split()[1] not in args.models:
                continue
            copies = max(2, -(-200 * 2**20 // (n * k * 2)))
            ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for _ in range(copies)]
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = F.linear(x.float(), ws[0].float())
            err = max((gemv(x, ws[0], config=c).float() - ref).norm().item() / ref.norm().item() for c in configs)
            gb = n * k * 2 / 1e9
            times = [time_in_graph(cycling(F.linear, x, ws))] + [time_in_graph(cycling(gemv, x, ws, c))
                                                                  for c in configs]
            cells = [f"{t:>9.2f} ({gb / t * 1e3:>4.2f})" for t in times]  # GB / us = 1e3 TB/s
            print(f"{name:<14}{m:>3}" + "".join(f"{c:>16}" if i == 0 else f"{c:>18}" for i, c in enumerate(cells))
                  + f"{err:>13.2e}")
            del ws


if __name__ == "__main__":
    main()
