"""Multi-LoRA shrink + expand (minivllm/kernels/lora.py) beside the base layer's GEMM, on a GPU.

    PYTHONPATH=. python benchmarks/kernels/bench_lora.py [--rows 1 16 64 256 1024] [--adapters 1 4 8]
        [--ranks 8 16 32 64] [--model 8b] [--tp 1] [--layers qkv o gate_up down] [--slots 8]
        [--shrink-config BMxBKxSPLITxFMAxWARPS] [--expand-config BMxBNxWARPS]

For each linear layer of a decoder layer (Qwen3-8B's at TP=1 by default; the fused layers with their slices:
q/k/v, gate/up) and each (rows, adapters in the batch, rank): the base layer's ``F.linear``, the LoRA shrink,
the expand, and both, in microseconds per call, each timed as a CUDA graph of 20 calls replayed
(benchmarks/lib/timing.py) cycling over enough copies of the weights that they come from HBM, not L2; and
the LoRA's share of the base GEMM's time. The batch's tokens are spread evenly over the first ``adapters`` of
``--slots`` slots (no base-model tokens). The slot grouping that the runner builds once a step
(minivllm/kernels/lora_segments.py) is timed apart. A line per (rows, adapters, rank) sums the layers: the
decoder layer's LoRA overhead.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without install
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from timing import time_in_graph  # noqa: E402

# (hidden, query heads, KV heads, intermediate, head dim)
MODELS = {"8b": (4096, 32, 8, 12288, 128), "32b": (5120, 64, 8, 25600, 128), "0.6b": (1024, 16, 8, 3072, 128)}
LAYERS = ("qkv", "o", "gate_up", "down")


def layer_shapes(model: str, tp: int) -> dict[str, tuple[int, tuple[int, ...]]]:
    """``{layer: (in_features, slice widths)}`` of one decoder layer on one of ``tp`` ranks."""
    hidden, heads, kv_heads, inter, head_dim = MODELS[model]
    q, kv, i = heads // tp * head_dim, max(1, kv_heads // tp) * head_dim, inter // tp
    return {"qkv": (hidden, (q, kv, kv)), "o": (q, (hidden,)), "gate_up": (hidden, (i, i)), "down": (i, (hidden,))}


def parse_ints(text: str | None, count: int, name: str) -> tuple[int, ...] | None:
    """``"16x128x1x0x4"`` -> ``(16, 128, 1, 0, 4)`` (``count`` integers), or None."""
    if text is None:
        return None
    values = tuple(int(v) for v in text.split("x"))
    if len(values) != count:
        raise SystemExit(f"{name} takes {count} integers joined by 'x', got {text!r}")
    return values


def copies_for(nbytes: int) -> int:
    """Copies of a weight set that together exceed 200 MB, so that a graph cycling over them reads from HBM
    (as the model does: the other layers' weights pass through L2 between two uses), not from L2."""
    return max(2, -(-200 * 2**20 // nbytes))


def cycling(copies: list, f):
    """A zero-argument call of ``f`` on the next of ``copies`` each time (a captured graph cycles too)."""
    state = {"i": 0}

    def call():
        state["i"] = (state["i"] + 1) % len(copies)
        return f(copies[state["i"]])

    return call


def lora_call(rows: int, hidden: int, widths: tuple[int, ...], rank: int, slots: int, adapters: int,
              dtype: torch.dtype, shrink_cfg, expand_cfg, dev: str = "cuda", copies: int | None = None):
    """``(base, shrink, expand, both, segments)``: zero-argument calls for one layer, cycling over weights
    (``dev`` "cpu": Triton's interpreter, for the script's own test; ``copies``: that many weight copies)."""
    from minivllm.kernels.lora import lora_expand, lora_shrink
    from minivllm.kernels.lora_config import ExpandConfig, ShrinkConfig
    from minivllm.kernels.lora_segments import lora_segments

    el = torch.finfo(dtype).bits // 8
    x = torch.randn(rows, hidden, device=dev, dtype=dtype)  # [T, H]
    n = sum(widths)
    ws = [torch.randn(n, hidden, device=dev, dtype=dtype) / hidden**0.5  # [N, H]: the base weight
          for _ in range(copies or copies_for(n * hidden * el))]
    loras = [(tuple(torch.randn(slots, rank, hidden, device=dev, dtype=dtype) / hidden**0.5 for _ in widths),
              tuple(torch.randn(slots, w, rank, device=dev, dtype=dtype) / rank**0.5 for w in widths))
             for _ in range(copies or copies_for(slots * rank * (len(widths) * hidden + n) * el))]
    token_slot = (torch.arange(rows, device=dev) % adapters).to(torch.int32)  # [T]
    offsets = tuple(sum(widths[:i]) for i in range(len(widths) + 1))
    out = torch.empty(len(widths), rows, rank, device=dev)  # [num_slices, T, R] float32
    y = torch.zeros(rows, n, device=dev, dtype=dtype)  # [T, N]
    seg = lora_segments(token_slot, slots)
    s_cfg = ShrinkConfig(*shrink_cfg) if shrink_cfg else None
    e_cfg = ExpandConfig(*expand_cfg) if expand_cfg else None

    def shrink(ab):
        lora_shrink(x, ab[0], token_slot, out, segments=seg, config=s_cfg)

    def expand(ab):
        lora_expand(out, ab[1], token_slot, y, offsets, segments=seg, config=e_cfg)

    def both(ab):
        shrink(ab)
        expand(ab)

    return (cycling(ws, lambda w: F.linear(x, w)), cycling(loras, shrink), cycling(loras, expand),
            cycling(loras, both), lambda: lora_segments(token_slot, slots))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64, 256, 1024], help="tokens in the batch")
    ap.add_argument("--adapters", type=int, nargs="+", default=[1, 4, 8], help="distinct adapters in the batch")
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 16, 32, 64], help="max_lora_rank")
    ap.add_argument("--slots", type=int, default=8, help="adapter slots on the GPU (max_loras)")
    ap.add_argument("--model", choices=list(MODELS), default="8b")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel size: the shapes of one rank")
    ap.add_argument("--layers", nargs="+", choices=LAYERS, default=list(LAYERS))
    ap.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    ap.add_argument("--shrink-config", default=None,
                    help="BLOCK_MxBLOCK_KxSPLIT_KxFMA_ROWSxWARPS (FMA_ROWS 0: the MMA variant); default: the "
                         "kernel's choice per shape")
    ap.add_argument("--expand-config", default=None, help="BLOCK_MxBLOCK_NxWARPS; default: the kernel's choice")
    args = ap.parse_args(argv)
    shrink_cfg = parse_ints(args.shrink_config, 5, "--shrink-config")
    expand_cfg = parse_ints(args.expand_config, 3, "--expand-config")
    if max(args.adapters) > args.slots:
        raise SystemExit(f"--adapters {max(args.adapters)} is more than --slots {args.slots}")
    if not torch.cuda.is_available():
        print("bench_lora.py needs a CUDA GPU; nothing to do on this machine.")
        return 0
    dtype = getattr(torch, args.dtype)
    shapes = layer_shapes(args.model, args.tp)
    print(f"multi-LoRA shrink + expand vs the base GEMM on {torch.cuda.get_device_name(0)}, {args.dtype}, "
          f"Qwen3-{args.model.upper()} TP={args.tp}, {args.slots} slots; microseconds per call (CUDA graph)")
    print(f"{'layer':<9}{'rows':>6}{'adapters':>9}{'rank':>6}{'base':>9}{'shrink':>9}{'expand':>9}"
          f"{'lora':>9}{'lora/base':>11}{'segments':>10}")
    for rows in args.rows:
        for adapters in args.adapters:
            for rank in args.ranks:
                base_sum = lora_sum = 0.0
                for layer in args.layers:
                    hidden, widths = shapes[layer]
                    calls = lora_call(rows, hidden, widths, rank, args.slots, min(adapters, rows), dtype,
                                      shrink_cfg, expand_cfg)
                    base, shrink, expand, both, seg = (time_in_graph(f) for f in calls)
                    base_sum, lora_sum = base_sum + base, lora_sum + both
                    print(f"{layer:<9}{rows:>6}{adapters:>9}{rank:>6}{base:>9.2f}{shrink:>9.2f}{expand:>9.2f}"
                          f"{both:>9.2f}{both / base:>10.1%}{seg:>10.2f}", flush=True)
                print(f"{'layers':<9}{rows:>6}{adapters:>9}{rank:>6}{base_sum:>9.2f}{'':>18}{lora_sum:>9.2f}"
                      f"{lora_sum / base_sum:>10.1%}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
