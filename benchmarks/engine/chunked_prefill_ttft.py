"""Time to first token of short requests queued behind one long prompt, chunked prefill on vs off.

    python benchmarks/engine/chunked_prefill_ttft.py --model qwen3-0.6b          # GPU
    python benchmarks/engine/chunked_prefill_ttft.py --model PATH --device cpu --long-len 600 --short-len 16

One long prompt arrives first and ``--num-short`` short prompts right behind it, all before the
first step. Each request's TTFT is reported in engine steps and in milliseconds from its arrival. Chunking off: the whole long prompt is one step
(``enable_chunked_prefill=False``). Chunking on: the budget is ``--chunk-budget`` tokens a step and
the long prompt advances ``--long-prefill-threshold`` tokens at a time, so short requests join early.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from minivllm import LLM, SamplingParams
from minivllm.entrypoints.bench.models import resolve_model  # noqa: E402


def run(llm: LLM, long_ids: list[int], shorts: list[list[int]], out_len: int) -> list[tuple[str, int, int, float]]:
    params = SamplingParams(temperature=0, max_tokens=out_len, ignore_eos=True)
    arrival, first_step, first_ms = {}, {}, {}
    rid = llm.engine.add_request(long_ids, params, stream=True)
    arrival[rid], names = time.perf_counter(), {rid: "long"}
    for i, ids in enumerate(shorts):
        r = llm.engine.add_request(ids, params, stream=True)
        arrival[r], names[r] = time.perf_counter(), f"short {i}"
    step = 0
    while llm.engine.has_unfinished_requests():
        outputs, _ = llm.engine.step()
        now = time.perf_counter()
        for o in outputs:
            if o.request_id not in first_step:
                first_step[o.request_id] = step
                first_ms[o.request_id] = 1000 * (now - arrival[o.request_id])
        step += 1
    return [(names[r], len(long_ids) if names[r] == "long" else len(shorts[0]), first_step[r], first_ms[r])
            for r in arrival]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-0.6b", help="a checkpoint folder or a shipped config name")
    ap.add_argument("--load-format", default=None, help="default: dummy for a folder without weights")
    ap.add_argument("--device", default=None)
    ap.add_argument("--long-len", type=int, default=3000)
    ap.add_argument("--short-len", type=int, default=64)
    ap.add_argument("--num-short", type=int, default=16)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--chunk-budget", type=int, default=512)
    ap.add_argument("--long-prefill-threshold", type=int, default=256)
    ap.add_argument("--max-model-len", type=int, default=4096)
    args = ap.parse_args()
    args.model = resolve_model(args.model)[0]
    import glob
    import os

    load_format = args.load_format or ("auto" if glob.glob(os.path.join(args.model, "*.safetensors")) else "dummy")
    common = dict(device=args.device, load_format=load_format, max_model_len=args.max_model_len)
    modes = {
        "chunking off": dict(enable_chunked_prefill=False, max_num_batched_tokens=args.max_model_len),
        "chunking on": dict(max_num_batched_tokens=args.chunk_budget, long_prefill_threshold=args.long_prefill_threshold,
                            max_num_partial_prefills=1),
    }
    results = {}
    for mode, kw in modes.items():
        llm = LLM(args.model, **common, **kw)
        vocab = min(10000, llm.engine.config.model_config.arch.vocab_size)
        rng = random.Random(0)
        long_ids = [rng.randrange(vocab) for _ in range(args.long_len)]
        shorts = [[rng.randrange(vocab) for _ in range(args.short_len)] for _ in range(args.num_short)]
        run(llm, long_ids[:64], shorts[:2], 2)  # warm-up (compiles kernels, captures nothing new)
        results[mode] = run(llm, long_ids, shorts, args.output_len)
        llm.close()
    print(f"\n== TTFT per request: 1 x {args.long_len} tokens, then {args.num_short} x {args.short_len} "
          f"(device {common['device'] or 'default'}) ==")
    print(f"{'request':<10}{'prompt':>8}" + "".join(f"{m + ' steps':>20}{m + ' ms':>18}" for m in modes))
    for i, row in enumerate(results["chunking off"]):
        cells = "".join(f"{results[m][i][2]:>20}{results[m][i][3]:>18.2f}" for m in modes)
        print(f"{row[0]:<10}{row[1]:>8}{cells}")
    for m in modes:
        ms = [r[3] for r in results[m] if r[0] != "long"]
        print(f"{m}: short requests' TTFT median {statistics.median(ms):.2f} ms, max {max(ms):.2f} ms; "
              f"long request {results[m][0][3]:.2f} ms")


if __name__ == "__main__":
    main()
