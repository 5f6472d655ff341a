"""FP8 activation quantization fused into the norm / SiLU-and-mul kernels vs the unfused pair (GPU).

For each token count: RMSNorm, add+RMSNorm (in place) and SiLU-and-mul followed by
``quantize_fp8_per_token`` (two launches, the bf16 activations written and read back) against
``rms_norm_fp8`` / ``fused_add_rms_norm_fp8`` / ``silu_and_mul_fp8`` (one launch); the fused per-group (128)
variant for reference. Defaults: Qwen3-8B (hidden 4096, intermediate 12288, bf16). Times are CUDA-event
medians of ``--iters`` samples, each ``--reps`` back-to-back calls, per call: "graph" replays a CUDA graph of
them (GPU time, as the decode path runs), "eager" launches them from Python. The inputs stay in L2 between
calls (up to 24 MiB at 512 tokens).

    PYTHONPATH=. python benchmarks/kernels/fused_quant.py
    PYTHONPATH=. python benchmarks/kernels/fused_quant.py --tokens 1 16 --inter 25600 --hidden 5120
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without install
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from timing import event_median_us  # noqa: E402


def cases(m: int, hidden: int, inter: int, dtype: torch.dtype):
    """(name, unfused fn, fused fn, fused per-group-128 fn) for ``m`` tokens."""
    from minivllm.kernels.fp8_quant import quantize_fp8_per_token
    from minivllm.kernels.fused_act import silu_and_mul
    from minivllm.kernels.fused_norm import fused_add_rms_norm, rms_norm
    from minivllm.kernels.fused_quant import fused_add_rms_norm_fp8, rms_norm_fp8, silu_and_mul_fp8

    eps = 1e-6
    x = torch.randn(m, hidden, device="cuda", dtype=dtype)  # [m, hidden]
    res = torch.randn(m, hidden, device="cuda", dtype=dtype)  # [m, hidden]
    w = (1.0 + 0.1 * torch.randn(hidden, device="cuda")).to(dtype)  # [hidden]
    gate_up = torch.randn(m, 2 * inter, device="cuda", dtype=dtype)  # [m, 2 * inter]
    xa, ra = x.clone(), res.clone()  # the unfused in-place add+norm overwrites x

    def add_norm_quant():
        out, _ = fused_add_rms_norm(xa, ra, w, eps, inplace=True)
        return quantize_fp8_per_token(out)

    return [
        ("rms_norm", lambda: quantize_fp8_per_token(rms_norm(x, w, eps)), lambda: rms_norm_fp8(x, w, eps),
         lambda: rms_norm_fp8(x, w, eps, 128)),
        ("add_rms_norm", add_norm_quant, lambda: fused_add_rms_norm_fp8(x, res, w, eps),
         lambda: fused_add_rms_norm_fp8(x, res, w, eps, 128)),
        ("silu_and_mul", lambda: quantize_fp8_per_token(silu_and_mul(gate_up)),
         lambda: silu_and_mul_fp8(gate_up), lambda: silu_and_mul_fp8(gate_up, 128)),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[32, 128, 256, 512])
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--inter", type=int, default=12288, help="MLP intermediate size D (silu input is 2D)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--iters", type=int, default=50, help="samples (the median is printed)")
    parser.add_argument("--reps", type=int, default=20, help="calls per sample")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("fused_quant.py needs a CUDA GPU; nothing to do on this machine.")
        return 0
    dtype = getattr(torch, args.dtype)
    print(f"{torch.cuda.get_device_name()}  {args.dtype}  hidden {args.hidden}  inter {args.inter}  "
          f"(us per call, median of {args.iters} x {args.reps} calls)")
    head = (f"{'op + fp8 quant':<14}{'M':>5} | {'unfused':>8}{'fused':>8}{'x':>6}{'g128':>8} |"
            f" {'unfused':>8}{'fused':>8}{'x':>6}")
    print(f"{'':<19} | {'CUDA graph':^30} | {'eager':^22}")
    print(head)
    print("-" * len(head))
    for m in args.tokens:
        for name, unfused, fused, grouped in cases(m, args.hidden, args.inter, dtype):
            ug, fg, gg = (event_median_us(f, args.iters, reps=args.reps, graph=True) for f in (unfused, fused, grouped))
            ue, fe = (event_median_us(f, args.iters, reps=args.reps) for f in (unfused, fused))
            print(f"{name:<14}{m:>5} | {ug:>8.2f}{fg:>8.2f}{ug / fg:>6.2f}{gg:>8.2f} | {ue:>8.2f}{fe:>8.2f}"
                  f"{ue / fe:>6.2f}")
        print("-" * len(head))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
