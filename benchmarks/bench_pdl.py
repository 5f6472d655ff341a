"""Programmatic dependent launch on and off: a stack of decoder layers' decode kernels in one CUDA graph.

    PYTHONPATH=. python benchmarks/bench_pdl.py [--layers 36] [--rows 1 4 16]

Each layer (``decode_layer.py``: a Qwen3-8B layer on one of 2 ranks, 11 kernels, no all-reduce) has
its own weights, so the stack streams ~7 GB a step as the engine does. Prints microseconds a step
and a layer with ``MINIVLLM_PDL`` 0 and 1, and the difference.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_layer import DecodeLayer  # noqa: E402
from graph_timing import time_in_graph  # noqa: E402


def step_us(layers: list[DecodeLayer], pdl: bool) -> float:
    os.environ["MINIVLLM_PDL"] = "1" if pdl else "0"
    x, res = layers[0].x.clone(), layers[0].residual.clone()

    def step():
        h, r = x, res
        for layer in layers:
            h, r = layer.forward(h, r)

    return time_in_graph(step, calls=1, iters=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--json-out")
    args = ap.parse_args()
    results = []
    print(f"{'rows':>5} {'PDL off us':>11} {'PDL on us':>10} {'saved us':>9} {'per layer':>10}")
    for rows in args.rows:
        layers = [DecodeLayer(rows, context=args.context, seed=i) for i in range(args.layers)]
        off, on = step_us(layers, False), step_us(layers, True)
        off, on = min(off, step_us(layers, False)), min(on, step_us(layers, True))  # best of two, alternated
        results.append({"rows": rows, "layers": args.layers, "pdl_off_us": off, "pdl_on_us": on})
        print(f"{rows:>5} {off:>11.1f} {on:>10.1f} {off - on:>9.1f} {(off - on) / args.layers:>10.2f}")
        del layers
        torch.cuda.empty_cache()
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
