"""The fused MoE layer (``fused_moe_triton``) against the torch path at Qwen3-30B-A3B's and Mixtral-8x7B's shapes
(GPU): microseconds per layer, GB/s of expert weights read and TFLOP/s, M from 1 to 4096 tokens.

Columns: ``torch`` (``minivllm.kernels.moe_torch.fused_moe``, a loop over the experts with host syncs, launched
eagerly: it cannot be captured), then the Triton layer as a CUDA graph (``time_in_graph``): the path it picks by
itself (``auto``), and each path forced (``grouped``; ``decode`` while ``M * top_k <= --decode-up-to``), so that
``DECODE_MAX_PAIRS`` can be placed where the decode kernels stop winning. GB/s counts each expert some token
picked once (the least a layer must read) over the ``auto`` time; TFLOP/s is ``6 M top_k H I`` over it. Random
router logits, so the loads are near uniform. The grouped path's tiles come from the device's config file
(``tune_fused_moe.py``) or the default.

    python benchmarks/kernels/fused_moe_bench.py [--models qwen3-30b-a3b mixtral-8x7b] [--ms 1 8 256 4096]
        [--tp 1] [--fp8 block|channel | --mxfp4] [--no-torch] [--decode-tiles 4x256x4x2,4x256x4x2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run from a checkout without install
sys.path.insert(0, str(ROOT / "benchmarks" / "lib"))

MS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]


def parse_decode_tiles(text: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``"4x256x4x2,8x128x4x2x4"`` -> the ``decode_tiles`` argument of ``fused_moe_triton``."""
    parts = [tuple(int(v) for v in part.split("x")) for part in text.split(",")]
    if len(parts) != 2 or len(parts[0]) != 4 or len(parts[1]) not in (4, 5):
        raise argparse.ArgumentTypeError(f"want BNxBKxSTAGESxWARPS,BNxBKxSTAGESxWARPS[xPICKS], got {text!r}")
    return parts[0], parts[1]


def main() -> int:
    from moe_inputs import MODELS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", choices=list(MODELS), default=["qwen3-30b-a3b", "mixtral-8x7b"])
    ap.add_argument("--ms", type=int, nargs="+", default=MS)
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel size: each rank holds I / tp")
    ap.add_argument("--fp8", choices=["block", "channel"], default=None, help="FP8 experts (no torch column)")
    ap.add_argument("--mxfp4", action="store_true", help="MXFP4 experts, as gpt-oss stores them (no torch column)")
    ap.add_argument("--decode-up-to", type=int, default=64, help="time the decode path up to this many pairs")
    ap.add_argument("--no-torch", action="store_true", help="skip the torch column")
    ap.add_argument("--decode-tiles", type=parse_decode_tiles, default=None,
                    help="the decode kernels' tiles, gate/up then down: BNxBKxSTAGESxWARPS,BNxBKxSTAGESxWARPS[xPICKS] "
                         "(default: the tuned decode file, else fused_moe_config.decode_config's default)")
    args = ap.parse_args()
    if args.mxfp4 and args.fp8:
        ap.error("--mxfp4 and --fp8 are two weight formats: pick one")
    if not torch.cuda.is_available():
        print("fused_moe_bench.py needs a CUDA GPU; nothing to do on this machine.")
        return 0
    for model in args.models:
        bench_model(model, args)
    return 0


def bench_model(model: str, args) -> None:
    """One table: a row per M."""
    from moe_inputs import MoeShape, make_tokens, make_weights, weight_bytes_read
    from timing import event_median_us, time_in_graph

    from minivllm.kernels.fused_moe import fused_moe_triton
    from minivllm.kernels.fused_moe_config import device_name, use_decode

    shape = MoeShape.of(model, args.tp)
    w13, w2, kw = make_weights(shape, args.fp8, mxfp4=args.mxfp4)
    torch_moe = None
    if not args.no_torch and args.fp8 is None and not args.mxfp4:
        try:
            from minivllm.kernels.moe_torch import fused_moe as torch_moe
        except ImportError:
            print("minivllm.kernels.moe_torch is not in this checkout: no torch column")
    print(f"\n{model} on {torch.cuda.get_device_name()}: E={shape.num_experts} top-{shape.top_k} H={shape.hidden} "
          f"I={shape.inter} (TP={args.tp}) {'fp8 ' + args.fp8 if args.fp8 else 'mxfp4' if args.mxfp4 else 'bf16'}; "
          "us per layer")
    print(f"{'M':>6}{'torch':>10}{'auto':>10}{'path':>9}{'grouped':>10}{'decode':>10}{'GB/s':>8}{'TFLOP/s':>9}"
          f"{'x torch':>9}")
    def path_decode(m: int) -> bool:
        return use_decode(m, shape.num_experts, shape.inter, shape.hidden, shape.top_k, device_name(),
                          args.fp8 is not None)

    for m in args.ms:
        x, weights, ids = make_tokens(shape, m)

        def run(decode=None, x=x, weights=weights, ids=ids):
            return fused_moe_triton(x, w13, w2, weights, ids, decode=decode, decode_tiles=args.decode_tiles, **kw)

        auto = time_in_graph(run, calls=10, iters=20)
        grouped = time_in_graph(lambda run=run: run(False), calls=10, iters=20)
        pairs = m * shape.top_k
        decode = None
        if pairs <= args.decode_up_to:
            decode = time_in_graph(lambda run=run: run(True), calls=10, iters=20)
        t_torch = None
        if torch_moe is not None:
            t_torch = event_median_us(lambda x=x, weights=weights, ids=ids: torch_moe(x, w13, w2, weights, ids),
                                      iters=10)
        gb = weight_bytes_read(shape, ids, args.fp8 is not None, args.mxfp4) / 1e9
        print(f"{m:>6}{_cell(t_torch)}{_cell(auto)}{'decode' if path_decode(m) else 'grouped':>9}"
              f"{_cell(grouped)}{_cell(decode)}{gb / auto * 1e6:>8.0f}{shape.flops(m) / auto / 1e6:>9.1f}"
              f"{t_torch / auto if t_torch else float('nan'):>8.2f}x", flush=True)


def _cell(us: float | None) -> str:
    return f"{us:>10.1f}" if us is not None else f"{'-':>10}"


if __name__ == "__main__":
    sys.exit(main())
