"""Tunes the fused MoE decode kernels (the GEMVs over the picked experts) on this GPU and writes the decode file
the layer reads (``minivllm/kernels/configs/E=..,N=..,H=..,top_k=..,device_name=..[,dtype=fp8_w8a8],decode.json``).

For each small batch size, a coordinate descent over the gate/up kernel's ``(BLOCK_N, BLOCK_K, NUM_STAGES,
num_warps)`` and then the down kernel's (plus ``picks``, how many of a token's picks one program sums), from the
default tiles, two passes; each candidate is the whole decode path timed as a CUDA graph of 10 calls, each call
with another routing (from random router logits), so that the picked experts' weights come from memory and not
from L2. The best decode time is compared with the grouped GEMMs' at the same size (their tiles from the device's
config file, ``tune_fused_moe.py``, else the default); the file keeps the sizes where decode won, from 1 up to the
first size where it lost, so the layer switches paths there.

    python benchmarks/kernels/tune_fused_moe_decode.py --model qwen3-30b-a3b [--tp 1] [--fp8 block|channel]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run from a checkout without install
sys.path.insert(0, str(ROOT / "benchmarks" / "lib"))

GATE_UP_SPACE = ((1, 2, 4, 8, 16), (64, 128, 256, 512), (2, 3, 4, 6), (1, 2, 4, 8))
CALLS = 10  # calls a graph, one routing each


def main() -> int:
    from moe_inputs import MODELS, MoeShape

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=list(MODELS), default="qwen3-30b-a3b")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel size: each rank holds I / tp")
    ap.add_argument("--fp8", choices=["block", "channel"], default=None, help="FP8 experts")
    ap.add_argument("--max-pairs", type=int, default=64, help="try batch sizes up to this many (token, pick) pairs")
    ap.add_argument("--passes", type=int, default=2, help="coordinate-descent passes over each kernel's tiles")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "minivllm" / "kernels" / "configs")
    ap.add_argument("--dry-run", action="store_true", help="print the best tiles, write nothing")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("tune_fused_moe_decode.py needs a CUDA GPU; nothing to do on this machine.")
        return 0
    return tune(MoeShape.of(args.model, args.tp), args)


def tune(shape, args) -> int:
    """Tunes each batch size in turn and writes the sizes where the decode path beat the grouped GEMMs."""
    from moe_inputs import make_tokens, make_weights
    from timing import time_in_graph

    from minivllm.kernels.fused_moe import fused_moe_triton
    from minivllm.kernels.fused_moe_config import decode_config, decode_file_name, device_name

    w13, w2, kw = make_weights(shape, args.fp8)
    fp8 = args.fp8 is not None
    name = decode_file_name(shape.num_experts, shape.inter, shape.hidden, shape.top_k, device_name(), fp8)
    print(f"{device_name()}: E={shape.num_experts} top-{shape.top_k} H={shape.hidden} I={shape.inter} "
          f"{'fp8 ' + args.fp8 if fp8 else 'bf16'} -> {name}")
    picks = tuple(p for p in range(1, shape.top_k + 1) if shape.top_k % p == 0)
    spaces = (GATE_UP_SPACE, GATE_UP_SPACE + (picks,))
    table = {}
    m = 1
    while m * shape.top_k <= args.max_pairs:
        inputs = [make_tokens(shape, m, seed=s) for s in range(CALLS)]

        def timed(decode: bool, tiles=None, inputs=inputs) -> float:
            turn = iter(range(1 << 30))

            def call():
                x, weights, ids = inputs[next(turn) % CALLS]
                return fused_moe_triton(x, w13, w2, weights, ids, decode=decode, decode_tiles=tiles, **kw)

            return time_in_graph(call, calls=CALLS, iters=20)

        grouped = timed(False)
        best = decode_config(m, shape.num_experts, shape.inter, shape.hidden, shape.top_k, None, fp8)  # default
        best_us = timed(True, best)
        tried = {best: best_us}
        for _ in range(args.passes):
            for part, space in enumerate(spaces):
                for axis, values in enumerate(space):
                    for value in values:
                        cand = list(best)
                        cand[part] = best[part][:axis] + (value,) + best[part][axis + 1:]
                        cand = tuple(cand)
                        if cand in tried:
                            continue
                        try:
                            tried[cand] = us = timed(True, cand)
                        except Exception as e:  # noqa: BLE001 - a tile that does not compile or fit is skipped
                            tried[cand] = float("inf")
                            print(f"  M={m} {cand}: {type(e).__name__}: {str(e)[:80]}")
                            continue
                        if us < best_us:
                            best, best_us = cand, us
        won = best_us < grouped
        print(f"M={m:>3}: decode {best_us:8.1f} us {best} ({len(tried)} tried), grouped {grouped:8.1f} us -> "
              f"{'decode' if won else 'grouped'}", flush=True)
        if not won:
            break
        table[m] = [list(best[0]), list(best[1])]
        m *= 2
    if args.dry_run or not table:
        print("nothing written" if not table else "dry run: nothing written")
        return 0
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path = args.out_dir / name
    path.write_text(json.dumps({str(m): table[m] for m in sorted(table)}, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
