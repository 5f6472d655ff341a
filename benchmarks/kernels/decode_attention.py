"""Decode attention kernel benchmark (GPU): unified Triton kernel vs split-KV (flash-decoding).

Qwen3-0.6B attention shape by default: 16 query heads, 8 kv heads, head_dim 128, bf16. For
each cache block size, context length and batch size, prints the median time and the
achieved bandwidth of the K/V bytes read (2 * batch * context * kv_heads * head_dim * 2 B).

    python benchmarks/kernels/decode_attention.py                # triton.testing.do_bench (eager launches)
    python benchmarks/kernels/decode_attention.py --cuda-graph   # replayed CUDA graph, as the decode path runs
    python benchmarks/kernels/decode_attention.py --sweep-splits 1 2 4 8 16   # split-KV time per num_splits
    python benchmarks/kernels/decode_attention.py --cuda-graph --configs 64x2x4 64x3x4 128x2x8   # unified kernel,
        BLOCK_NxSTAGESxWARPS tile configurations (rows: the default configuration first)
    python benchmarks/kernels/decode_attention.py --cuda-graph --kv-dtype fp8 --tiles bf16   # an e4m3 cache, its tiles
        converted to bf16 instead of fp16 for tl.dot
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without install
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from timing import do_bench_us  # noqa: E402


def make_decode_batch(batch, context, block_size, num_heads, num_kv_heads, head_dim, dtype, layout="nhd"):
    """Every row has ``context`` keys in randomly permuted physical blocks. ``layout`` "hnd" stores each
    block head-major ([blocks, kv_heads, block_size, head_dim]) and passes the kernels a permuted view."""
    blocks_per_row = math.ceil(context / block_size)
    num_blocks = batch * blocks_per_row
    if layout == "hnd":
        k_cache = torch.randn(num_blocks, num_kv_heads, block_size, head_dim, device="cuda", dtype=dtype)
        k_cache = k_cache.permute(0, 2, 1, 3)  # [blocks, block_size, kv_heads, head_dim] view
        v_cache = torch.randn_like(k_cache.permute(0, 2, 1, 3)).permute(0, 2, 1, 3)
    else:
        k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, device="cuda", dtype=dtype)
        v_cache = torch.randn_like(k_cache)
    block_tables = torch.randperm(num_blocks, device="cuda").to(torch.int32).view(batch, blocks_per_row)
    context_lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    query = torch.randn(batch, num_heads, head_dim, device="cuda", dtype=dtype)
    return query, k_cache, v_cache, context_lens, block_tables


def main() -> int:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=fmt)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--block-sizes", type=int, nargs="+", default=[16, 256])
    parser.add_argument("--heads", type=int, nargs=3, default=[16, 8, 128], metavar=("Q", "KV", "D"))
    parser.add_argument("--cuda-graph", action="store_true", help="time graph replays (no launch overhead)")
    parser.add_argument("--sweep-splits", type=int, nargs="+", help="time split-KV at these num_splits")
    parser.add_argument("--configs", nargs="+", help="time the unified kernel at these BLOCK_NxSTAGESxWARPS")
    parser.add_argument("--kv-dtype", choices=["bf16", "fp8"], default="bf16", help="the cache's dtype")
    parser.add_argument("--tiles", choices=["auto", "bf16", "f16"], default="auto",
                        help="the dtype of the tiles tl.dot takes (auto: the kernels' choice)")
    parser.add_argument("--layout", choices=["nhd", "hnd"], default="nhd",
                        help="KV cache block layout: token-major (the engine's) or head-major (a permuted view)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("decode_attention.py needs a CUDA GPU; nothing to do on this machine.")
        return 0

    from minivllm.kernels.paged_attention import paged_attention
    from minivllm.kernels.paged_decode import choose_num_splits, num_sms, paged_decode_split_kv
    from minivllm.kernels.torch_backend import paged_attention_ref

    num_heads, num_kv_heads, head_dim = args.heads
    dtype = torch.bfloat16
    if args.tiles != "auto":  # NOTE: both kernels look dot_dtype up in their own module at each launch
        import triton.language as tl

        from minivllm.kernels import paged_attention as pa_mod
        from minivllm.kernels import paged_decode as pd_mod

        forced = tl.bfloat16 if args.tiles == "bf16" else tl.float16
        pa_mod.dot_dtype = pd_mod.dot_dtype = lambda q, c: forced
    scale = head_dim**-0.5
    sms = num_sms(torch.device("cuda"))

    def bench(fn) -> float:  # median microseconds
        return do_bench_us(fn, args.cuda_graph)

    mode = "CUDA-graph replay" if args.cuda_graph else "eager do_bench"
    print(f"# {torch.cuda.get_device_name()} ({sms} SMs), q/kv heads {num_heads}/{num_kv_heads}, "
          f"head_dim {head_dim}, bf16 q, {args.kv_dtype} KV ({args.tiles} tiles), {mode}, {args.layout} blocks; median microseconds, GB/s of K/V read")  # fmt: skip
    if args.configs:
        header = f"{'batch':>6} {'ctx':>6} {'bs':>4} | {'default':>8} | " + " ".join(f"{c:>9}" for c in args.configs)
    elif args.sweep_splits:
        header = f"{'batch':>6} {'ctx':>6} {'bs':>4} | {'unified':>8} | " + " ".join(
            f"{'s=' + str(s):>8}" for s in args.sweep_splits
        )
    else:
        header = (f"{'batch':>6} {'ctx':>6} {'bs':>4} | {'unified us':>10} {'GB/s':>7} | "
                  f"{'splits':>6} {'split us':>9} {'GB/s':>7} | {'auto':>7}")  # fmt: skip
    print(header)
    print("-" * len(header))
    for block_size in args.block_sizes:
        for context in args.contexts:
            for batch in args.batches:
                shape = (num_heads, num_kv_heads, head_dim, dtype)
                q, kc, vc, ctx, bt = make_decode_batch(batch, context, block_size, *shape, layout=args.layout)
                if args.kv_dtype == "fp8":
                    kc, vc = kc.to(torch.float8_e4m3fn), vc.to(torch.float8_e4m3fn)
                kv_bytes = 2 * batch * context * num_kv_heads * head_dim * kc.element_size()
                splits = choose_num_splits(batch, num_kv_heads, context, sms)
                out = torch.empty_like(q)

                def unified(q=q, kc=kc, vc=vc, ctx=ctx, bt=bt, out=out, context=context):
                    return paged_attention(q, kc, vc, None, ctx, bt, scale, 1, context, out=out)

                def split(n, q=q, kc=kc, vc=vc, ctx=ctx, bt=bt, out=out, context=context):
                    return paged_decode_split_kv(q, kc, vc, ctx, bt, scale, context, n, out=out)

                if batch <= 16:  # quick sanity check of both kernels
                    cpu = [t.cpu() for t in (q, kc, vc, torch.arange(batch + 1), ctx, bt)]
                    ref = paged_attention_ref(*cpu, scale).float().cuda()  # CPU-built causal mask
                    for res in (unified(), split(max(splits, 2))):
                        err = ((res.float() - ref).norm() / ref.norm()).item()
                        assert err < 1e-2, f"relative error {err:.2e}"
                t_u = bench(unified)
                row = f"{batch:>6} {context:>6} {block_size:>4} | "
                if args.configs:
                    times = []
                    for cfg in args.configs:
                        bn, st, w = (int(v) for v in cfg.split("x"))
                        res = paged_attention(q, kc, vc, None, ctx, bt, scale, 1, context, block_n=bn,
                                              num_stages=st, num_warps=w)
                        assert torch.equal(res, unified()) or (res.float() - unified().float()).abs().max() < 2e-2
                        times.append(bench(lambda bn=bn, st=st, w=w, q=q, kc=kc, vc=vc, ctx=ctx, bt=bt, out=out,
                                           context=context: paged_attention(q, kc, vc, None, ctx, bt, scale, 1,
                                                                            context, out=out, block_n=bn,
                                                                            num_stages=st, num_warps=w)))
                    gbs = [kv_bytes / (t * 1e-6) / 1e9 for t in times]
                    print(row + f"{t_u:>8.1f} | " + " ".join(f"{t:>5.1f}/{g / 1000:<3.1f}" for t, g in zip(times, gbs)))
                elif args.sweep_splits:
                    times = [bench(lambda n=n: split(n)) for n in args.sweep_splits]
                    print(row + f"{t_u:>8.1f} | " + " ".join(f"{t:>8.1f}" for t in times))
                else:
                    n_split = max(splits, 2)  # always show a split-KV number, even where auto picks 1
                    t_s = bench(lambda n=n_split: split(n))
                    gbs_u, gbs_s = (kv_bytes / (t * 1e-6) / 1e9 for t in (t_u, t_s))
                    auto = f"split{splits}" if splits > 1 else "unified"
                    print(
                        row
                        + f"{t_u:>10.1f} {gbs_u:>7.0f} | {n_split:>6} {t_s:>9.1f} {gbs_s:>7.0f} | {auto:>7}"
                    )
                del q, kc, vc, ctx, bt, out
    return 0


if __name__ == "__main__":
    sys.exit(main())
