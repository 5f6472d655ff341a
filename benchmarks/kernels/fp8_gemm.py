"""FP8 linear layers at Qwen3-8B's shapes (GPU): bf16 ``F.linear`` (cuBLAS), per-channel FP8 on cuBLASLt
(``quantize_fp8_per_token`` + ``torch._scaled_mm``), the Triton block-scaled FP8 GEMM (``quantize_fp8_per_group``
+ ``fp8_block_gemm``, 128 x 128 weight blocks) and what the engine does today with block weights (dequantize the
weight to bf16, then ``F.linear``). The FP8 columns include their activation quantization.

Each cell is the median of ``--iters`` samples of one call between two CUDA events (eager launches, no CUDA
graph), after ``--warmup`` calls: GPU time, the launch overhead hidden behind a spin kernel; before each sample
a 256 MB buffer is zeroed so that the weights come from HBM, not L2. TFLOP/s is ``2 M N K`` over the block
column's time; "vs bf16" and "vs ch" are the bf16 and per-channel times over the block column's (above 1: the
block GEMM is faster).

    PYTHONPATH=. python benchmarks/kernels/fp8_gemm.py
    PYTHONPATH=. python benchmarks/kernels/fp8_gemm.py --ms 1 64 512 --shapes qkv down
    PYTHONPATH=. python benchmarks/kernels/fp8_gemm.py --configs 16x64x128x8x4x4 64x128x128x8x4x4   # GEMM alone,
        BLOCK_MxBLOCK_NxBLOCK_KxSWIZZLE_MxSTAGESxWARPS tile configurations against the table's choice
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without install
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from timing import event_median_us  # noqa: E402

# Qwen3-8B's linear layers at TP=1: (N, K)
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}
BLOCK = (128, 128)
SPIN_CYCLES = 1_000_000  # ~0.5 ms at H100/H200 clocks


def parse_config(text: str) -> tuple[int, ...]:
    """``"BMxBNxBKxSWIZZLExSTAGESxWARPS"`` -> a ``fp8_block_gemm`` config, e.g. ``"64x128x128x8x4x4"``."""
    cfg = tuple(int(v) for v in text.split("x"))
    if len(cfg) != 6:
        raise ValueError(f"a config is BLOCK_MxBLOCK_NxBLOCK_KxSWIZZLE_MxSTAGESxWARPS, got {text!r}")
    return cfg


def linears(x, w16, w8c, wsc, w8b, wsb) -> dict:
    """The four ways to compute ``x @ w^T`` (bf16 out), each a callable."""
    from minivllm.kernels.fp8_block_gemm import fp8_block_gemm, quantize_fp8_per_group
    from minivllm.kernels.fp8_quant import quantize_fp8_per_token
    from minivllm.kernels.torch_backend import dequantize_weight_fp8_ref

    def channel():
        q, s = quantize_fp8_per_token(x)  # [m, k] fp8, [m, 1]
        return torch._scaled_mm(q, w8c.t(), scale_a=s, scale_b=wsc.view(1, -1), out_dtype=torch.bfloat16)

    def block():
        q, s = quantize_fp8_per_group(x, BLOCK[1])  # [m, k] fp8, [m, k / 128]
        return fp8_block_gemm(q, s, w8b, wsb, BLOCK, torch.bfloat16)

    return {"bf16": lambda: F.linear(x, w16), "channel": channel, "block": block,
            "dequant": lambda: F.linear(x, dequantize_weight_fp8_ref(w8b, wsb, BLOCK, torch.bfloat16))}


def gemm_only(x8, xs, w8b, wsb, config):
    from minivllm.kernels.fp8_block_gemm import fp8_block_gemm

    return lambda: fp8_block_gemm(x8, xs, w8b, wsb, BLOCK, torch.bfloat16, config=config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ms", type=int, nargs="+", default=[1, 16, 32, 64, 128, 256, 512, 1024])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--iters", type=int, default=50, help="samples (the median is printed)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--no-flush", action="store_true", help="keep L2 warm between samples")
    parser.add_argument("--no-dequant", action="store_true", help="skip today's dequantize + F.linear column")
    parser.add_argument("--configs", nargs="+", default=None, help="time the block GEMM alone over these tile "
                        "configurations (BMxBNxBKxSWIZZLExSTAGESxWARPS) instead of the comparison table")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("fp8_gemm.py needs a CUDA GPU; nothing to do on this machine.")
        return 0
    from minivllm.kernels.fp8_block_gemm import fp8_gemm_config, quantize_fp8_per_group
    from minivllm.kernels.torch_backend import quantize_weight_fp8_ref

    flush = None if args.no_flush else torch.empty(256 << 20, dtype=torch.int8, device="cuda")

    def before_sample():
        # NOTE: the GPU spins while Python queues the sample's launches (two Triton launches take longer than the
        # block GEMM runs at small M), so the events time the kernels, not the launch overhead
        torch.cuda._sleep(SPIN_CYCLES)
        if flush is not None:
            flush.zero_()  # the weights come from HBM, not L2

    bench = lambda fn: event_median_us(fn, args.iters, warmup=args.warmup, before_sample=before_sample)
    configs = [parse_config(c) for c in args.configs] if args.configs else None
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  us per call, median of {args.iters}"
          f"{'' if flush is not None else ', L2 warm'}")
    if configs:
        head = f"{'shape':<8}{'M':>6} | {'table':>8} " + "".join(f"{'x'.join(map(str, c)):>18}" for c in configs)
    else:
        head = (f"{'shape':<8}{'M':>6} | {'bf16':>8}{'fp8 ch':>8}{'fp8 blk':>8}{'deq+bf16':>9} | {'TFLOP/s':>8}"
                f"{'vs bf16':>9}{'vs ch':>8}")
    print(head)
    print("-" * len(head))
    for name in args.shapes:
        n, k = SHAPES[name]
        w = torch.randn(n, k, device="cuda") * 0.02  # [n, k]
        w16 = w.to(torch.bfloat16)
        w8c, wsc = quantize_weight_fp8_ref(w, None)  # [n, k] fp8, [n]
        w8b, wsb = quantize_weight_fp8_ref(w, BLOCK)  # [n, k] fp8, [n / 128, k / 128]
        del w
        for m in args.ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)  # [m, k]
            if configs:
                x8, xs = quantize_fp8_per_group(x, BLOCK[1])
                times = [bench(gemm_only(x8, xs, w8b, wsb, c)) for c in [fp8_gemm_config(m), *configs]]
                best = min(range(len(times)), key=times.__getitem__)
                cells = "".join(f"{t:>17.1f}{'*' if i == best else ' '}" for i, t in enumerate(times[1:], 1))
                print(f"{name:<8}{m:>6} | {times[0]:>7.1f}{'*' if best == 0 else ' '} {cells}")
                continue
            fns = linears(x, w16, w8c, wsc, w8b, wsb)
            t16, tch, tblk = (bench(fns[c]) for c in ("bf16", "channel", "block"))
            tdq = float("nan") if args.no_dequant else bench(fns["dequant"])
            print(f"{name:<8}{m:>6} | {t16:>8.1f}{tch:>8.1f}{tblk:>8.1f}{tdq:>9.1f} | {2 * m * n * k / tblk / 1e6:>8.1f}"
                  f"{t16 / tblk:>9.2f}{tch / tblk:>8.2f}")
        print("-" * len(head))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
