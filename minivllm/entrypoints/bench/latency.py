"""``minivllm bench latency``: time to first token, time per output token and end-to-end latency.

One batch size at a time: ``--batch-size`` random prompts of ``--input-len`` tokens, each
generating ``--output-len`` greedy tokens (ignore_eos), driven through the engine's step API
(``add_request`` then ``step()`` until done). Per request: TTFT = first token time - arrival,
TPOT = (finish - first token) / (tokens - 1). Per step: ITL = wall time of decode-only steps.
Each iteration uses fresh random prompts, so no run hits the prefix cache of an earlier one.
"""

from __future__ import annotations

import argparse
import random
import time

from minivllm.entrypoints.bench import common


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The command's flags: the batch, the iterations, and the engine's."""
    positive = common.int_at_least(1)
    p.add_argument("--batch-size", type=positive, default=8, help="requests in the batch")
    p.add_argument("--input-len", type=positive, default=32, help="prompt length, in random tokens")
    p.add_argument("--output-len", type=positive, default=128, help="tokens each request generates")
    p.add_argument("--num-iters", type=positive, default=10, help="timed iterations")
    p.add_argument("--num-iters-warmup", type=common.int_at_least(0), default=2, help="untimed iterations first")
    common.add_engine_args(p)


def one_iteration(engine, prompts: list[list[int]], output_len: int) -> dict:
    """Run one batch to completion; returns per-request TTFT/TPOT, decode step times and e2e latency."""
    from minivllm.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    t0 = time.perf_counter()
    ids = {engine.add_request(p, params) for p in prompts}
    done: dict[str, object] = {}
    itl: list[float] = []
    while len(done) < len(ids):
        outputs, stats = engine.step()
        if stats.num_decode_tokens and not stats.num_prefill_tokens:
            itl.append(stats.step_time)
        for o in outputs:
            if o.finished and o.request_id in ids:
                done[o.request_id] = o
    e2e = time.perf_counter() - t0
    ttft, tpot = [], []
    for o in done.values():
        n = len(o.outputs[0].token_ids)
        ttft.append(o.first_token_time - o.arrival_time)
        if n > 1:
            tpot.append((o.finished_time - o.first_token_time) / (n - 1))
    return {"e2e": e2e, "ttft": ttft, "tpot": tpot, "itl": itl}


def run(args: argparse.Namespace) -> dict:
    """Run the benchmark, print its table; returns the result."""
    from tqdm import tqdm

    from minivllm.engine.llm_engine import LLMEngine

    path, kw = common.engine_kwargs(args)
    hi = common.vocab_limit(path)
    rng = random.Random(args.seed)
    batch = lambda: [[rng.randint(0, hi) for _ in range(args.input_len)] for _ in range(args.batch_size)]
    engine = LLMEngine(path, **kw)
    quiet = not common.show_progress(args)
    try:
        for _ in tqdm(range(args.num_iters_warmup), desc="Warm-up iterations", disable=quiet):
            one_iteration(engine, batch(), args.output_len)
        before = engine.spec_totals.copy()
        iters = [one_iteration(engine, batch(), args.output_len)
                 for _ in tqdm(range(max(1, args.num_iters)), desc="Timed iterations", disable=quiet)]
        spec = engine.spec_totals.since(before).summary() if engine.speculative else None
    finally:
        engine.close()
    ttft = common.summary([x for it in iters for x in it["ttft"]], 1000)
    tpot = common.summary([x for it in iters for x in it["tpot"]], 1000)
    itl = common.summary([x for it in iters for x in it["itl"]], 1000)
    e2e = common.summary([it["e2e"] for it in iters])
    result = {"benchmark": "latency", **common.metadata(args, path, kw), "batch_size": args.batch_size,
              "input_len": args.input_len, "output_len": args.output_len, "num_iters": len(iters),
              "ttft_ms": ttft, "tpot_ms": tpot, "itl_ms": itl, "e2e_latency_s": e2e,
              "e2e_latencies_s": [it["e2e"] for it in iters],
              "output_tok_s": args.batch_size * args.output_len / e2e["median"]}
    if spec is not None:
        result["speculative_decoding"] = spec
    common.write_json(args.json_out, result)
    print(f"\nmodel {args.model} on {result['device_name']}: batch {args.batch_size}, "
          f"{args.input_len} in -> {args.output_len} out, {len(iters)} iterations")
    rows = [["TTFT (ms)", ttft["mean"], ttft["median"], ttft["p99"]],
            ["TPOT (ms)", tpot["mean"], tpot["median"], tpot["p99"]],
            ["ITL, decode steps (ms)", itl["mean"], itl["median"], itl["p99"]],
            ["end-to-end latency (s)", e2e["mean"], e2e["median"], e2e["p99"]],
            ["output tok/s (median e2e)", result["output_tok_s"], "", ""]]
    rows += [[name, value, "", ""] for name, value in common.spec_decode_rows(result)]
    common.print_table("latency results", ["metric", "mean", "median", "p99"], rows)
    return result


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``minivllm bench latency`` to an argparse sub-parsers object."""
    return common.register(subparsers, "latency", "TTFT / TPOT / end-to-end latency of one batch", __doc__, add_arguments, run)


def main(argv: list[str] | None = None) -> dict:
    """``python -m minivllm.entrypoints.bench.latency ...``: run it; returns the result."""
    return common.standalone("latency", __doc__, add_arguments, run, argv)


if __name__ == "__main__":
    main()
