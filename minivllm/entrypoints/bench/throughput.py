"""``minivllm bench throughput``: offline generation throughput of one ``LLM.generate`` call.

Workloads (``--workload``):

- ``nano`` (default): nano-vLLM's bench.py exactly: 256 requests, ``random.seed(0)``, prompts of
  ``randint(100, 1024)`` tokens each ``randint(0, 10000)``, ``max_tokens=randint(100, 1024)``,
  ``ignore_eos``, temperature 0.6, ``max_model_len=4096``; throughput = sum(max_tokens) / time.
- ``fixed-batch``: 256 requests x 256 random prompt tokens -> 256 greedy tokens (ignore_eos).
- ``one-request``: one 128-token prompt -> 512 tokens (ignore_eos); reports ms per output token
  (wall time / 512, prefill included).

Any size flag overrides the workload's (the result then says ``sizes_overridden``).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from minivllm.entrypoints.bench import common

WORKLOADS = {
    "nano": dict(num_requests=256, min_input_len=100, max_input_len=1024, min_output_len=100,
                 max_output_len=1024, temperature=0.6, max_model_len=4096),
    "fixed-batch": dict(num_requests=256, min_input_len=256, max_input_len=256, min_output_len=256,
                        max_output_len=256, temperature=0.0, max_model_len=None),
    "one-request": dict(num_requests=1, min_input_len=128, max_input_len=128, min_output_len=512,
                        max_output_len=512, temperature=0.0, max_model_len=None),
}
_SIZE_KEYS = ("num_requests", "min_input_len", "max_input_len", "min_output_len", "max_output_len", "temperature")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The command's flags: the workload, its sizes, and the engine's."""
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="nano",
                   help="the requests' sizes and sampling (listed above); the flags below override them")
    positive = common.int_at_least(1)
    p.add_argument("--num-requests", type=positive, help="requests (default: the workload's)")
    p.add_argument("--input-len", type=positive, help="fixed prompt length (sets min and max)")
    p.add_argument("--output-len", type=positive, help="fixed output length (sets min and max)")
    for k in ("min-input-len", "max-input-len", "min-output-len", "max-output-len"):
        what = "prompt" if "input" in k else "output"
        p.add_argument(f"--{k}", type=positive, help=f"{k.split('-')[0]}imum {what} length, in tokens, of the random "
                                                  f"draws (default: the workload's)")
    p.add_argument("--temperature", type=float, help="sampling temperature (default: the workload's)")
    p.add_argument("--dataset", help="JSON/JSONL of {prompt_len, output_len} or ShareGPT conversations")
    p.add_argument("--tokenizer", help="tokenizer folder for --dataset conversations (default: the model's)")
    p.add_argument("--repeat", type=positive, default=1, help="timed runs; the median is reported")
    common.add_engine_args(p)


def workload_spec(args: argparse.Namespace) -> tuple[dict, bool]:
    """The workload's sizes with the flags applied, and whether any flag changed them."""
    spec = dict(WORKLOADS[args.workload])
    if args.input_len is not None:
        args.min_input_len = args.max_input_len = args.input_len
    if args.output_len is not None:
        args.min_output_len = args.max_output_len = args.output_len
    changed = getattr(args, "dataset", None) is not None
    for k in _SIZE_KEYS:
        v = getattr(args, k, None)
        if v is not None and v != spec[k]:
            spec[k], changed = v, True
    for what in ("input", "output"):
        if spec[f"min_{what}_len"] > spec[f"max_{what}_len"]:
            raise ValueError(f"min_{what}_len ({spec[f'min_{what}_len']}) must be <= max_{what}_len "
                             f"({spec[f'max_{what}_len']})")
    return spec, changed


def make_requests(spec: dict, seed: int, hi: int) -> tuple[list[list[int]], list[int]]:
    """Prompts and max_tokens in nano-vLLM's order of random draws (all prompts, then all lengths)."""
    rng = random.Random(seed)
    prompts = [[rng.randint(0, hi) for _ in range(rng.randint(spec["min_input_len"], spec["max_input_len"]))]
               for _ in range(spec["num_requests"])]
    max_tokens = [rng.randint(spec["min_output_len"], spec["max_output_len"]) for _ in range(spec["num_requests"])]
    return prompts, max_tokens


def load_dataset(path: str, n: int, seed: int, hi: int, tokenizer_path: str | None,
                 output_len: int | None) -> tuple[list[list[int]], list[int]]:
    """``{prompt_len, output_len}`` records, or ShareGPT conversations tokenized (vLLM's filters)."""
    with open(path) as f:
        text = f.read()
    data = json.loads(text) if text.lstrip().startswith("[") else [json.loads(x) for x in text.splitlines() if x.strip()]
    rng, tok, pairs = random.Random(seed), None, []
    for rec in data:
        if "prompt_len" in rec or "input_len" in rec:
            plen, olen = int(rec.get("prompt_len", rec.get("input_len"))), int(rec["output_len"])
            ids = None
        else:
            conv = rec.get("conversations") or rec.get("conversation") or []
            if len(conv) < 2:
                continue
            if tok is None:
                from transformers import AutoTokenizer

                tok = AutoTokenizer.from_pretrained(tokenizer_path)
            ids = tok.encode(conv[0]["value"])
            plen, olen = len(ids), len(tok.encode(conv[1]["value"]))
            if plen < 4 or olen < 4 or plen > 1024 or plen + olen > 2048:
                continue
        pairs.append((ids, plen, output_len or olen))
    rng.shuffle(pairs)
    pairs = pairs[:n]
    prompts = [ids if ids is not None else [rng.randint(0, hi) for _ in range(plen)] for ids, plen, _ in pairs]
    return prompts, [olen for _, _, olen in pairs]


def timed_generate(llm, prompts: list[list[int]], max_tokens: list[int], temperature: float, shift: int,
                   hi: int, use_tqdm: bool = False) -> dict:
    """One timed ``generate`` call. ``shift`` changes every token id (repeats miss the prefix cache);
    ``use_tqdm`` draws the engine's progress bar."""
    from minivllm.sampling_params import SamplingParams

    if shift:
        prompts = [[(t + shift) % (hi + 1) for t in p] for p in prompts]
    params = [SamplingParams(temperature=temperature, ignore_eos=True, max_tokens=m) for m in max_tokens]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=use_tqdm)
    elapsed = time.perf_counter() - t0
    n_out, n_in = sum(len(o["token_ids"]) for o in outs), sum(len(p) for p in prompts)
    if n_out != sum(max_tokens):
        print(f"warning: generated {n_out} tokens, asked for {sum(max_tokens)} (max_model_len too small?)")
    return {"elapsed_s": elapsed, "requests_per_s": len(prompts) / elapsed,
            "output_tok_s": sum(max_tokens) / elapsed, "total_tok_s": (n_in + n_out) / elapsed,
            "ms_per_token": 1000 * elapsed / max(1, sum(max_tokens)), "output_tokens": n_out}


def warm_up(llm) -> None:
    """nano-vLLM's warm-up: one short generate (token ids: benchmark checkpoints have no tokenizer)."""
    from minivllm.sampling_params import SamplingParams

    llm.generate([[11, 22, 33, 44]], SamplingParams(), use_tqdm=False)


def run(args: argparse.Namespace, llm=None) -> dict:
    """Run the benchmark; ``llm`` reuses an engine already built (then engine flags are ignored)."""
    spec, changed = workload_spec(args)
    path, kw = common.engine_kwargs(args)
    if spec["max_model_len"] and "max_model_len" not in kw:  # the workload's, capped at the model's limit
        kw["max_model_len"] = min(spec["max_model_len"],
                                  common.model_config(path).get("max_position_embeddings", 4096))
    hi = common.vocab_limit(path)
    if args.dataset:
        prompts, max_tokens = load_dataset(args.dataset, spec["num_requests"], args.seed, hi,
                                           args.tokenizer or path, args.output_len)
    else:
        prompts, max_tokens = make_requests(spec, args.seed, hi)
    own = llm is None
    if own:
        from minivllm.llm import LLM

        llm = LLM(path, **kw)
    counters = getattr(getattr(llm, "engine", None), "spec_totals", None)  # speculative decoding's
    try:
        warm_up(llm)
        before = counters.copy() if counters is not None else None
        runs = [timed_generate(llm, prompts, max_tokens, spec["temperature"], 1009 * r, hi,
                               use_tqdm=common.show_progress(args))
                for r in range(max(1, args.repeat))]
    finally:
        if own:
            llm.close()
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    result = {"benchmark": "throughput", "workload": args.workload, "sizes_overridden": changed, **spec,
              **common.metadata(args, path, kw), "num_requests": len(prompts),
              "total_prompt_tokens": sum(map(len, prompts)), "total_output_tokens": sum(max_tokens),
              **med, "runs": runs}
    if counters is not None and counters.k:
        result["speculative_decoding"] = counters.since(before).summary()
    metric = "ms_per_token" if args.workload == "one-request" else "output_tok_s"
    common.write_json(args.json_out, result)
    rows = [["workload", args.workload + (" (sizes overridden)" if changed else "")], ["model", args.model],
            ["device", result["device_name"]], ["requests", len(prompts)],
            ["prompt tokens", result["total_prompt_tokens"]], ["output tokens", result["total_output_tokens"]],
            ["elapsed (s)", med["elapsed_s"]], ["requests/s", med["requests_per_s"]],
            ["output tok/s", med["output_tok_s"]], ["total tok/s", med["total_tok_s"]]]
    if args.workload == "one-request":
        rows.append(["ms per output token", med["ms_per_token"]])
    if len(runs) > 1:
        rows.append([f"all runs ({metric})", ", ".join(common.fmt(r[metric]) for r in runs)])
    rows += common.spec_decode_rows(result)
    common.print_table("throughput results", ["metric", "value"], rows)
    return result


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``minivllm bench throughput`` to an argparse sub-parsers object."""
    return common.register(subparsers, "throughput", "offline throughput (nano, fixed-batch, one-request)", __doc__, add_arguments, run)


def main(argv: list[str] | None = None) -> dict:
    """``python -m minivllm.entrypoints.bench.throughput ...``: run it; returns the result."""
    return common.standalone("throughput", __doc__, add_arguments, run, argv)


if __name__ == "__main__":
    main()
