"""The fused K/V store against the pair of launches it replaces (GPU, CUDA-graph replays).

    python benchmarks/bench_fused_kv_store.py [--rows 1 4 16 48 240]

``qk_norm_rope`` then ``store_kvcache``, against ``qk_norm_rope(..., kv_store=...)``, at Qwen3-8B's head
counts for TP=1 (32/8) and TP=2 (16/4). Each cell is the median of ``triton.testing.do_bench_cudagraph``
over 20 back-to-back calls in one graph (so launch gaps count, as in a decode graph), divided by 20:
microseconds per call. PDL as the engine uses it (on for batches up to ``MINIVLLM_PDL_MAX_ROWS`` rows).

NOTE: as bench_fusions.py (dc1e627) it also timed a SiLU-and-mul computed inside the down projection's
GEMV (H200, 2026-11-23): 0.3 us faster at one row and TP=1, 0.7 us slower at TP=2, and 3-7x slower at
4-16 rows (the MMA kernel's pipelined loads), so it was dropped (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

REPS = 20


def per_call_us(fn) -> float:
    import triton.testing

    fn()  # compile outside the capture
    torch.cuda.synchronize()

    def many():
        for _ in range(REPS):
            fn()

    return triton.testing.do_bench_cudagraph(many, return_mode="median") * 1e3 / REPS


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 48, 240])
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_fused_kv_store.py needs a CUDA GPU; nothing to do on this machine.")
        return 0

    from minivllm.kernels.fused_rope import qk_norm_rope
    from minivllm.kernels.pdl import pdl_for_rows
    from minivllm.kernels.store_kvcache import store_kvcache
    from minivllm.layers.rotary import RotaryEmbedding

    bf16 = torch.bfloat16
    print(f"# {torch.cuda.get_device_name()}, bf16, microseconds per call (CUDA graph of {REPS} calls)")
    print(f"{'pair':<34} {'rows':>5} | {'two kernels':>11} {'fused':>8} {'saved':>7}")
    rope = RotaryEmbedding(128, 8192, 1e6).cuda()
    for tp in (1, 2):
        hq, hkv, hd, bs = 32 // tp, 8 // tp, 128, 256
        qn, kn = torch.ones(hd, device="cuda", dtype=bf16), torch.ones(hd, device="cuda", dtype=bf16)
        for m in args.rows:
            qkv = torch.randn(m, (hq + 2 * hkv) * hd, device="cuda", dtype=bf16)
            q, k, v = qkv.split([hq * hd, hkv * hd, hkv * hd], dim=-1)
            q, k, v = q.view(m, hq, hd), k.view(m, hkv, hd), v.view(m, hkv, hd)
            blocks = m // bs + 64
            kc = torch.zeros(blocks, bs, hkv, hd, device="cuda", dtype=bf16)
            vc = torch.zeros_like(kc)
            slots = torch.randperm(blocks * bs, device="cuda")[:m]
            pos = torch.randint(0, 8192, (m,), device="cuda")

            def pair(q=q, k=k, v=v, kc=kc, vc=vc, slots=slots, pos=pos, qn=qn, kn=kn):
                qk_norm_rope(q, k, pos, rope.cos_sin_cache, qn, kn, 1e-6, inplace=True)
                store_kvcache(k, v, kc, vc, slots)

            def fused(q=q, k=k, v=v, kc=kc, vc=vc, slots=slots, pos=pos, qn=qn, kn=kn):
                qk_norm_rope(q, k, pos, rope.cos_sin_cache, qn, kn, 1e-6, inplace=True, kv_store=(v, kc, vc, slots))

            with pdl_for_rows(m):
                two, one = per_call_us(pair), per_call_us(fused)
            print(f"{f'q/k norm + RoPE + KV store, TP={tp}':<34} {m:>5} | {two:>11.2f} {one:>8.2f} {two - one:>7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
