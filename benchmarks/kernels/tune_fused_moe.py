"""Tunes the fused MoE grouped GEMMs' tiles on this GPU and writes the config file the kernel reads
(``minivllm/kernels/configs/E={E},N={N},device_name={GPU}.json``, vLLM's scheme: batch size -> tiles).

For each batch size, every candidate ``(BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M, num_warps,
num_stages)`` that fits is timed on the whole grouped path (alignment, GEMM 1 with SiLU-and-mul, GEMM 2, the sum)
as a CUDA graph of calls, on random weights and a routing from random logits; the fastest is kept. Row tiles
much larger than an expert's mean rows (``M * top_k / E``) are not tried, nor stage rings that do not fit in
shared memory, nor tiles whose two GEMM 1 accumulators (gate and up) would not fit in registers. Most of the time goes to compiling the candidates (once each, shared by the batch sizes).
Entries already in the file for other batch sizes are kept, so that a long tuning can be split over several
runs (``--batch-sizes``) to fit a time limit.

    python benchmarks/kernels/tune_fused_moe.py --model qwen3-30b-a3b [--tp 1] [--fp8 block]
    python benchmarks/kernels/tune_fused_moe.py --experts 128 --top-k 8 --hidden 2048 --inter 768 \
        --batch-sizes 1 16 256 --quick
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run from a checkout without install
sys.path.insert(0, str(ROOT / "benchmarks" / "lib"))

BATCH_SIZES = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096]
SPACE = {  # the full search; --quick: the first values of each
    "BLOCK_SIZE_M": (16, 32, 64, 128),
    "BLOCK_SIZE_N": (64, 128, 256, 32),
    "BLOCK_SIZE_K": (64, 128, 256),
    "GROUP_SIZE_M": (1, 16),
    "num_warps": (4, 8),
    "num_stages": (3, 4, 2, 5),
}
QUICK = {"BLOCK_SIZE_N": 2, "BLOCK_SIZE_K": 2, "num_warps": 1, "num_stages": 2}
ACC_REGS = 128  # GEMM 1's two float32 accumulators, per thread: more spills
SMEM_BYTES = 200 * 1024  # what a stage ring of A and two B tiles may take (H100/H200: 227 KB a block)


def candidates(m: int, num_experts: int, top_k: int, quick: bool, elem_bytes: int) -> list[dict]:
    """The configs worth timing at ``m`` tokens."""
    rows = m * top_k / num_experts  # an expert's mean rows
    max_bm = max(16, 2 * 2 ** max(0, int(rows - 1).bit_length()))
    space = {k: v[:QUICK[k]] if quick and k in QUICK else v for k, v in SPACE.items()}
    out = []
    for values in itertools.product(*space.values()):
        cfg = dict(zip(space, values))
        bm, bn, bk = cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_N"], cfg["BLOCK_SIZE_K"]
        if bm > max_bm:
            continue
        if cfg["num_stages"] * (bm + 2 * bn) * bk * elem_bytes > SMEM_BYTES:
            continue
        if 2 * bm * bn > ACC_REGS * 32 * cfg["num_warps"]:
            continue
        out.append(cfg)
    return out


def main() -> int:
    from moe_inputs import MODELS, MoeShape

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=list(MODELS), default="qwen3-30b-a3b",
                    help="the shapes of a shipped MoE model, unless --experts, --top-k, --hidden and --inter are given")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel size: each rank holds I / tp")
    ap.add_argument("--experts", type=int, default=None)
    ap.add_argument("--top-k", type=int, default=None)
    ap.add_argument("--hidden", type=int, default=None)
    ap.add_argument("--inter", type=int, default=None, help="the experts' intermediate size on one rank")
    ap.add_argument("--fp8", choices=["block", "channel"], default=None, help="FP8 experts (W8A8)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=BATCH_SIZES)
    ap.add_argument("--quick", action="store_true", help="a smaller search (minutes instead of an hour)")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "minivllm" / "kernels" / "configs")
    ap.add_argument("--dry-run", action="store_true", help="print the best configs, write nothing")
    args = ap.parse_args()
    explicit = (args.experts, args.top_k, args.hidden, args.inter)
    if any(v is not None for v in explicit) and None in explicit:
        ap.error("give all of --experts, --top-k, --hidden and --inter, or none (then --model's shapes)")
    if not torch.cuda.is_available():
        print("tune_fused_moe.py needs a CUDA GPU; nothing to do on this machine.")
        return 0
    shape = MoeShape(*explicit) if explicit[0] is not None else MoeShape.of(args.model, args.tp)
    return tune(shape, args)


def tune(shape, args) -> int:
    """Times the candidates per batch size and writes (merges into) the device's config file."""
    from moe_inputs import make_tokens, make_weights
    from timing import time_in_graph

    from minivllm.kernels.fused_moe import fused_moe_triton
    from minivllm.kernels.fused_moe_config import config_file_name, device_name

    w13, w2, kw = make_weights(shape, args.fp8)
    path = args.out_dir / config_file_name(shape.num_experts, shape.inter, device_name(), fp8=args.fp8 is not None)
    table = {int(k): v for k, v in json.loads(path.read_text()).items()} if path.is_file() else {}
    print(f"{device_name()}: E={shape.num_experts} top-{shape.top_k} H={shape.hidden} "
          f"I={shape.inter} {'fp8 ' + args.fp8 if args.fp8 else 'bf16'} -> {path}")
    for m in args.batch_sizes:
        x, weights, ids = make_tokens(shape, m)
        found = []
        for cfg in candidates(m, shape.num_experts, shape.top_k, args.quick, 1 if args.fp8 else 2):
            def call(cfg=cfg, x=x, weights=weights, ids=ids):
                return fused_moe_triton(x, w13, w2, weights, ids, cfg, decode=False, **kw)

            try:
                us = time_in_graph(call, calls=10, iters=10)
            except Exception as e:  # noqa: BLE001 - a config that does not compile or fit is skipped
                print(f"  M={m} {cfg}: {type(e).__name__}: {str(e)[:80]}")
                continue
            found.append((us, cfg))
        if not found:
            print(f"M={m}: no config ran")
            continue
        found.sort(key=lambda t: t[0])
        us, best = found[0]
        table[m] = best
        print(f"M={m:>5}: {us:9.1f} us  {best}  ({len(found)} configs ran)", flush=True)
    if args.dry_run:
        return 0
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({str(m): table[m] for m in sorted(table)}, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
