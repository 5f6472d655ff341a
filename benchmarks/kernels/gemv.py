"""The Triton GEMV against cuBLAS (``F.linear``) at the decode shapes of Qwen3-8B and -32B, bf16.

    PYTHONPATH=. python benchmarks/kernels/gemv.py [--rows 1 48] [--configs 32x256x4x4 8x256x6x2f ...] [--fp8]

``--fp8``: FP8 (e4m3) weights with one scale per output channel (the kernel scales its outputs), against
cuBLAS on the bf16 weights they stand for.

Each shape is timed as a CUDA graph of 20 calls cycling over enough weight copies (> 200 MB)
that L2 cannot hold them; TB/s counts the weight bytes read. Configurations are
``BLOCK_NxBLOCK_KxSTAGESxWARPS``, ``f`` appended for the FMA variant (default: the kernel's own choice);
the table shows the fastest per shape, ``--all-out`` keeps every time. NOTE: the kernel only
runs in the engine for weights of at least ``MIN_WEIGHT_NUMEL`` elements; smaller shapes here are
measured to see where that bound should sit.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

_BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # benchmarks/
sys.path.insert(0, os.path.dirname(_BENCH))  # run from a checkout without install
sys.path.insert(0, os.path.join(_BENCH, "lib"))
from timing import time_in_graph  # noqa: E402

from minivllm.kernels.gemv import gemv  # noqa: E402
from minivllm.kernels.gemv_config import VARIANTS  # noqa: E402


def parse_config(text: str) -> tuple[int, int, int, int, str]:
    """``"BNxBKxSTAGESxWARPS"`` then a variant of ``VARIANTS`` (``"f"``: FMA): e.g. ``"8x256x6x2f"``."""
    body = text.rstrip("f")
    bn, bk, st, w = (int(v) for v in body.split("x"))
    variant = text[len(body):]
    if variant not in VARIANTS:
        raise ValueError(f"unknown GEMV variant {variant!r} in {text!r}; known: {VARIANTS}")
    return bn, bk, st, w, variant


def shapes(hidden: int, heads: int, kv_heads: int, inter: int, tp: int, head_dim: int = 128,
           vocab: int = 151936) -> list[tuple]:
    """A decoder layer's four linear weights ``(N, K)`` on one of ``tp`` ranks, then the LM head's slice."""
    kv = max(1, kv_heads // tp)
    return [("qkv", (heads // tp + 2 * kv) * head_dim, hidden), ("o", hidden, heads // tp * head_dim),
            ("gate_up", 2 * inter // tp, hidden), ("down", hidden, inter // tp), ("lm_head", vocab // tp, hidden)]


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


def cell(us: float, gb: float) -> str:
    """A time and the weight-read bandwidth it means (GB / us = 1e3 TB/s)."""
    return f"{us:>8.2f} ({gb / us * 1e3:>4.2f})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[1])
    ap.add_argument("--configs", nargs="+", default=None,
                    help="BLOCK_NxBLOCK_KxSTAGESxWARPS[variant] (kernels/gemv.py VARIANTS), 'default' (the kernel's "
                         "choice) or 'none' alone (cuBLAS only)")
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--tps", type=int, nargs="+", default=[2, 1, 4])
    ap.add_argument("--cublaslt", action="store_true", help="also time torch's cuBLASLt backend")
    ap.add_argument("--all-out", default=None, help="also write every config's time per shape to this file")
    ap.add_argument("--fp8", action="store_true", help="FP8 weights with per-channel scales")
    args = ap.parse_args()
    # None: the kernel's own choice for the shape and rows; "none" alone: cuBLAS only
    names = [] if args.configs == ["none"] else args.configs or [None]
    print(f"GEMV vs cuBLAS on {torch.cuda.get_device_name(0)}, bf16, microseconds (TB/s of weight reads); "
          f"configs tried: {' '.join(n or 'default' for n in names)}")
    print(f"{'shape':<16}{'M':>4}{'cuBLAS':>16}{'best config':>14}{'best':>16}{'speedup':>9}{'max rel err':>13}")
    rows_out = []
    for m in args.rows:
        for name, n, k in SHAPES:
            model, tp = name.split()[1], int(name.split()[2][2:])
            if model not in args.models or tp not in args.tps:
                continue
            copies = max(2, -(-200 * 2**20 // (n * k * 2)))
            ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for _ in range(copies)]
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = F.linear(x.float(), ws[0].float())
            gb = n * k * 2 / 1e9
            t_cublas = time_in_graph(cycling(F.linear, x, ws))
            f = gemv
            if args.fp8:  # NOTE: the reference stays the bf16 weight: the error includes FP8's rounding
                from minivllm.kernels.torch_backend import quantize_weight_fp8_ref

                q = [quantize_weight_fp8_ref(w, None) for w in ws]
                del ws
                ws, scales, gb = [w8 for w8, _ in q], {w8.data_ptr(): sc for w8, sc in q}, n * k / 1e9

                def f(x, w, config=None, scales=scales):
                    return gemv(x, w, None, w_scale=scales[w.data_ptr()], config=config)
            times, err = {}, 0.0
            if args.cublaslt:
                torch.backends.cuda.preferred_blas_library("cublaslt")
                times["cuBLASLt"] = time_in_graph(cycling(F.linear, x, ws))
                torch.backends.cuda.preferred_blas_library("default")
            for cfg in names:
                config = parse_config(cfg) if cfg and cfg != "default" else None
                if config and config[4] == "f" and m > 2:  # one row a program: re-reads the weight per row
                    continue
                try:
                    out = f(x, ws[0], config=config)
                    err = max(err, (out.float() - ref).norm().item() / ref.norm().item())
                    times[cfg or "default"] = time_in_graph(cycling(f, x, ws, config))
                except Exception as e:  # noqa: BLE001 - a config that does not fit (shared memory) is skipped
                    times[cfg or "default"] = float("nan")
                    print(f"  {cfg}: {type(e).__name__}: {str(e)[:80]}")
            best = min((t, c) for c, t in times.items() if t == t) if any(t == t for t in times.values()) else None
            print(f"{name:<16}{m:>4}{cell(t_cublas, gb):>16}{best[1] if best else '-':>14}"
                  f"{cell(best[0], gb) if best else '-':>16}{t_cublas / best[0] if best else 0:>8.2f}x{err:>13.2e}",
                  flush=True)
            rows_out.append(f"{name}\t{m}\tcublas={t_cublas:.2f}\t" + "\t".join(f"{c}={t:.2f}" for c, t in times.items()))
            del ws
    if args.all_out:
        with open(args.all_out, "w") as f:
            f.write("\n".join(rows_out) + "\n")


if __name__ == "__main__":
    main()
