"""Expert load of a mixture-of-experts model: how many tokens each layer sends to each expert.

    PYTHONPATH=. python benchmarks/engine/expert_load.py --model tiny-qwen3-moe --device cpu
    PYTHONPATH=. python benchmarks/engine/expert_load.py --model qwen3-30b-a3b --num-prompts 256 --per-expert

Runs a batch of random prompts (token ids, as the nano workload makes them) through the engine and counts, per
MoE layer, the (token, pick) pairs routed to each expert, prompt and generated tokens alike. Prints one row per
layer: tokens routed, experts that got none, the least and most loaded expert, and the imbalance (most loaded
over the mean: what a grouped GEMM's slowest expert costs over an even split). ``--per-expert`` adds every
expert's count; ``--json-out`` writes them all.

The counts come from a forward hook on each ``FusedMoE`` layer that takes the top-k of its router logits (the
softmax keeps their order), so the engine runs eagerly here: CUDA graph replays run no hooks. With dummy
weights the routing is that of random routers, not of a trained model.
"""

from __future__ import annotations

import argparse
import random

import torch

from minivllm import LLM, SamplingParams
from minivllm.entrypoints.bench.common import (
    add_engine_args,
    engine_kwargs,
    metadata,
    print_table,
    vocab_limit,
    write_json,
)
from minivllm.layers.fused_moe import FusedMoE


class ExpertCounter:
    """Per MoE layer, a running count of the picks of each expert (kept on the layer's device)."""

    def __init__(self, model: torch.nn.Module):
        self.layers: dict[str, FusedMoE] = {n: m for n, m in model.named_modules() if isinstance(m, FusedMoE)}
        if not self.layers:
            raise SystemExit("this model has no mixture-of-experts layer")
        self.counts = {n: torch.zeros(m.num_experts, dtype=torch.int64, device=m.w13_weight.device)
                       for n, m in self.layers.items()}
        self.handles = [m.register_forward_hook(self._hook(n)) for n, m in self.layers.items()]

    def _hook(self, name: str):
        layer = self.layers[name]

        def count(module, args, output) -> None:
            router_logits = args[1]  # [n, experts]
            ids = torch.topk(router_logits, layer.top_k, dim=-1).indices  # [n, k]
            self.counts[name] += torch.bincount(ids.flatten(), minlength=layer.num_experts)

        return count

    def reset(self) -> None:
        for c in self.counts.values():
            c.zero_()

    def table(self) -> list[dict]:
        """One dict per layer: its name and per-expert counts, with the summary figures."""
        rows = []
        for name, c in self.counts.items():
            counts = c.tolist()
            total = sum(counts)
            mean = total / len(counts)
            rows.append({"layer": name, "tokens_routed": total, "idle_experts": sum(1 for x in counts if x == 0),
                         "min": min(counts), "max": max(counts),
                         "imbalance": (max(counts) / mean) if mean else float("nan"), "per_expert": counts})
        return rows


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_engine_args(p)
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=256, help="tokens per prompt")
    p.add_argument("--output-len", type=int, default=64, help="tokens generated per prompt")
    p.add_argument("--per-expert", action="store_true", help="print every expert's count, per layer")
    args = p.parse_args(argv)
    path, kw = engine_kwargs(args, enforce_eager=True)
    if not kw.get("enforce_eager", True):
        raise SystemExit("expert_load.py counts in forward hooks, which CUDA graph replays skip: "
                         "drop --no-enforce-eager")
    kw["enforce_eager"] = True
    rng = random.Random(args.seed)
    hi = vocab_limit(path)
    prompts = [[rng.randint(1, hi) for _ in range(args.input_len)] for _ in range(args.num_prompts)]
    params = SamplingParams(temperature=0.6, max_tokens=args.output_len, ignore_eos=True, seed=args.seed)
    with LLM(path, **kw) as llm:
        counter = ExpertCounter(llm.engine.executor.runner.model)
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2), use_tqdm=False)  # warm-up, not counted
        counter.reset()
        llm.generate(prompts, params, use_tqdm=False)
        rows = counter.table()
    print_table(f"expert load: {args.model}, {args.num_prompts} prompts x ({args.input_len} in + "
                f"{args.output_len} out)", ["layer", "picks", "idle experts", "min", "max", "max / mean"],
                [[r["layer"], r["tokens_routed"], r["idle_experts"], r["min"], r["max"], r["imbalance"]]
                 for r in rows])
    if args.per_expert:
        for r in rows:
            print(f"{r['layer']}: {r['per_expert']}")
    result = {**metadata(args, path, kw), "num_prompts": args.num_prompts, "input_len": args.input_len,
              "output_len": args.output_len, "layers": rows}
    write_json(args.json_out, result)
    return result


if __name__ == "__main__":
    main()
