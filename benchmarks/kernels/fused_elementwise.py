"""Fused elementwise kernels vs the torch layers (GPU): RMSNorm, add+RMSNorm, q/k norm+RoPE, SiLU*mul.

Qwen3-0.6B shapes by default (hidden 1024, 16/8 heads of 128, intermediate 3072, bf16) at
decode (n = 1, 64, 256) and prefill (n = 8192) token counts. Each cell is the median time of
``triton.testing.do_bench`` (eager launches, CPU overhead included) and of
``do_bench_cudagraph`` (replayed CUDA graph: GPU time, as the decode path runs); GB/s is the
fused kernel's DRAM traffic over its graph time.

    python benchmarks/kernels/fused_elementwise.py
    python benchmarks/kernels/fused_elementwise.py --tokens 1 64 --hidden 5120 --heads 64 8 128 --inter 25600
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without install
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from timing import do_bench_us  # noqa: E402

# per decoder layer: input and post-attention add+RMSNorm, q/k norm + RoPE, SiLU * up
LAYER_MIX = {"add_rms_norm_inplace": 2, "qk_norm_rope_inplace": 1, "silu_and_mul": 1}


def cases(n, hidden, hq, hkv, hd, inter, dtype):
    """(name, torch fn, fused fn, bytes moved by the fused kernel) for ``n`` tokens."""
    from minivllm.kernels.fused_act import silu_and_mul
    from minivllm.kernels.fused_norm import fused_add_rms_norm, rms_norm
    from minivllm.kernels.fused_rope import qk_norm_rope
    from minivllm.layers.activation import SiluAndMul
    from minivllm.layers.layernorm import RMSNorm
    from minivllm.layers.rotary import RotaryEmbedding

    el, eps = torch.finfo(dtype).bits // 8, 1e-6
    norm = RMSNorm(hidden, eps).to("cuda", dtype)
    qn, kn = RMSNorm(hd, eps).to("cuda", dtype), RMSNorm(hd, eps).to("cuda", dtype)
    rope = RotaryEmbedding(hd, 40960, 1e6).to("cuda")
    x = torch.randn(n, hidden, device="cuda", dtype=dtype)  # [n, hidden]
    res = torch.randn(n, hidden, device="cuda", dtype=dtype)  # [n, hidden]
    qkv = torch.randn(n, (hq + 2 * hkv) * hd, device="cuda", dtype=dtype)  # [n, (hq + 2 hkv) hd]
    q = qkv[:, : hq * hd].view(n, hq, hd)  # [n, hq, hd] strided view
    k = qkv[:, hq * hd : (hq + hkv) * hd].view(n, hkv, hd)  # [n, hkv, hd] strided view
    pos = torch.randint(0, 40960, (n,), device="cuda")  # [n]
    gate_up = torch.randn(n, 2 * inter, device="cuda", dtype=dtype)  # [n, 2 * inter]
    act = SiluAndMul()
    qk_bytes = 2 * n * (hq + hkv) * hd * el + n * hd * 4
    return [
        ("rms_norm", lambda: norm(x), lambda: rms_norm(x, norm.weight, eps), 2 * n * hidden * el),
        ("add_rms_norm", lambda: norm(x, res), lambda: fused_add_rms_norm(x, res, norm.weight, eps),
         4 * n * hidden * el),
        ("add_rms_norm_inplace", lambda: norm(x, res),
         lambda: fused_add_rms_norm(x, res, norm.weight, eps, inplace=True), 4 * n * hidden * el),
        ("qk_norm_rope", lambda: rope(pos, qn(q), kn(k)),
         lambda: qk_norm_rope(q, k, pos, rope.cos_sin_cache, qn.weight, kn.weight, eps), qk_bytes),
        ("qk_norm_rope_inplace", lambda: rope(pos, qn(q), kn(k)),
         lambda: qk_norm_rope(q, k, pos, rope.cos_sin_cache, qn.weight, kn.weight, eps, inplace=True), qk_bytes),
        ("silu_and_mul", lambda: act(gate_up), lambda: silu_and_mul(gate_up), 3 * n * inter * el),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 64, 256, 8192])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--heads", type=int, nargs=3, default=[16, 8, 128], metavar=("Q", "KV", "D"))
    parser.add_argument("--inter", type=int, default=3072, help="MLP intermediate size")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("fused_elementwise.py needs a CUDA GPU; nothing to do on this machine.")
        return 0
    dtype = getattr(torch, args.dtype)
    print(f"{torch.cuda.get_device_name()}  {args.dtype}  hidden {args.hidden}  heads {args.heads}  "
          f"inter {args.inter}  (times in us, median)")
    head = (f"{'kernel':<22}{'n':>6} | {'torch':>8}{'fused':>8}{'x':>6} | {'torch':>8}{'fused':>8}{'x':>6}"
            f"{'GB/s':>7}")
    print(f"{'':<28} | {'eager (do_bench)':^22} | {'CUDA graph (do_bench_cudagraph)':^29}")
    print(head)
    print("-" * len(head))
    totals = {}
    for n in args.tokens:
        for name, ref_fn, fused_fn, nbytes in cases(n, args.hidden, *args.heads, args.inter, dtype):
            te, fe = (do_bench_us(f) for f in (ref_fn, fused_fn))
            tg, fg = (do_bench_us(f, cuda_graph=True) for f in (ref_fn, fused_fn))
            print(f"{name:<22}{n:>6} | {te:>8.1f}{fe:>8.1f}{te / fe:>6.1f} | {tg:>8.1f}{fg:>8.1f}{tg / fg:>6.1f}"
                  f"{nbytes / (fg * 1e3):>7.0f}")
            weight = LAYER_MIX.get(name, 0)  # how often the op runs per decoder layer
            t = totals.setdefault(n, [0.0, 0.0])
            t[0], t[1] = t[0] + weight * tg, t[1] + weight * fg
        print("-" * len(head))
    for n, (tg, fg) in totals.items():
        print(f"n={n:<5} per decoder layer (2 add+norm, q/k norm+rope, silu*mul; graph): "
              f"torch {tg:.1f} us, fused {fg:.1f} us ({tg / fg:.1f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
