"""Tensor-parallel scaling: throughput and one-request latency at several TP sizes (dummy weights).

Throughput is nano-vLLM's workload: 256 requests (``random.seed(0)``), prompts of
randint(100, 1024) tokens drawn from randint(0, 10000), max_tokens randint(100, 1024),
ignore_eos, temperature 0.6, max_model_len 4096, after a warm-up generate of 32 other prompts of
the same lengths (8 tokens each: compiles the kernels of chunked and mixed steps); tok/s = requested
output tokens / wall time. Latency is one request, a 128-token prompt -> 512 tokens: ms/token =
wall time / 512 (and TPOT, the decode part alone). Each TP size runs in a fresh subprocess, so
GPU memory and worker processes are released between sizes. Scaling efficiency at TP=k is
tok/s(k) / (k * tok/s(1)).

    python benchmarks/engine/tp_scaling.py --model qwen3-8b --tp 1 2 4 --json-out runs/tp_8b.json

``--rank-proxy`` also runs, for each TP size k > 1, one rank's shapes as a model at TP=1 (``rank_proxy.py``)
and prints, step kind by step kind, the TP run's time over it: what tensor parallelism costs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from minivllm.entrypoints.bench.models import resolve_model  # noqa: E402

REPO = str(Path(__file__).resolve().parents[2])


def _workload(args: argparse.Namespace, vocab: int):
    from minivllm import SamplingParams

    random.seed(0)
    hi = min(10000, vocab - 1)
    prompts = [[random.randint(0, hi) for _ in range(random.randint(100, args.max_input_len))]
               for _ in range(args.num_seqs)]
    params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=random.randint(100, args.max_output_len))
              for _ in range(args.num_seqs)]
    return prompts, params


BUCKETS = [(1, 16), (17, 64), (65, 128), (129, 192), (193, 256), (257, 1 << 30)]


def step_breakdown(trace: list[tuple[int, int, float]]) -> list[dict]:
    """Where a run's wall time went, from each ``step()``'s (prefill tokens, decode tokens, seconds).

    NOTE: with asynchronous scheduling a call launches one step and waits for the previous one, so
    its time is the previous step's device time in steady state; counts are per scheduled step.
    """
    rows = [{"kind": "with prefill", "steps": 0, "seconds": 0.0, "tokens": 0}]
    rows += [{"kind": f"decode {lo}-{hi if hi < 1 << 30 else 'up'} rows", "steps": 0, "seconds": 0.0, "tokens": 0}
             for lo, hi in BUCKETS]
    for prefill, decode, sec in trace:
        if not prefill and not decode:  # a call that only collected the last step's tokens
            continue
        i = 0 if prefill else 1 + next(j for j, (lo, hi) in enumerate(BUCKETS) if lo <= decode <= hi)
        rows[i]["steps"] += 1
        rows[i]["seconds"] += sec
        rows[i]["tokens"] += decode
    return [r for r in rows if r["steps"]]


def _traced_step(llm, trace: list):
    """Wrap ``llm.engine.step`` to append (prefill tokens, decode tokens, seconds) of each call to ``trace``."""
    step = llm.engine.step

    def traced():
        t = time.perf_counter()
        outputs, stats = step()
        trace.append((stats.num_prefill_tokens, stats.num_decode_tokens, time.perf_counter() - t))
        return outputs, stats

    return traced


def measure(args: argparse.Namespace) -> dict:
    """One TP size, in this process: the throughput run, then the one-request latency run."""
    sys.path.insert(0, REPO)
    from minivllm import LLM, SamplingParams

    kw = dict(load_format="dummy", tensor_parallel_size=args.tp, max_model_len=args.max_model_len,
              enforce_eager=args.enforce_eager)
    kw.update({k: v for k, v in (("device", args.device), ("dtype", args.dtype),
                                  ("kv_cache_dtype", args.kv_cache_dtype)) if v is not None})
    t0 = time.perf_counter()
    llm = LLM(args.model, **kw)
    try:
        startup = time.perf_counter() - t0
        vocab = llm.engine.config.model_config.arch.vocab_size
        prompts, params = _workload(args, vocab)
        warm = random.Random(12345)  # NOTE: other prompts than the workload's, so no prefix-cache hits
        hi = min(10000, vocab - 1)
        warm_prompts = [[warm.randint(0, hi) for _ in range(warm.randint(100, args.max_input_len))] for _ in range(32)]
        # warm-up: chunked prefill, mixed steps, sampling at the workload's temperature, so that the
        # Triton kernels it needs are compiled before the clock starts (a cold cache cost ~1.7 s)
        llm.generate(warm_prompts, SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=8), use_tqdm=False)
        trace: list[tuple[int, int, float]] = []
        llm.engine.step = _traced_step(llm, trace)
        t = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - t
        del llm.engine.step
        breakdown = step_breakdown(trace)
        for r in breakdown:
            print(f"  {r['kind']:<22} {r['steps']:>5} steps {r['seconds']:>7.3f} s "
                  f"{1000 * r['seconds'] / r['steps']:>7.2f} ms/step", file=sys.stderr)
        out_tokens = sum(p.max_tokens for p in params)
        rng = random.Random(1)
        prompt = [rng.randint(0, min(10000, vocab - 1)) for _ in range(args.latency_input_len)]
        sp = SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=args.latency_output_len)
        t = time.perf_counter()
        llm.engine.add_request(prompt, sp)
        final = None
        while final is None:
            final = next((o for o in llm.engine.step()[0] if o.finished), None)
        latency = time.perf_counter() - t
        n = len(final.outputs[0].token_ids)
        tpot = (final.finished_time - final.first_token_time) / max(1, n - 1)
        return {"tp": args.tp, "startup_s": startup, "kv_blocks": llm.engine.executor.num_kvcache_blocks,
                "throughput_tok_s": out_tokens / elapsed, "throughput_elapsed_s": elapsed,
                "output_tokens": out_tokens, "latency_s": latency, "ms_per_token": 1000 * latency / n,
                "tpot_ms": 1000 * tpot, "step_breakdown": breakdown, "device": llm.engine.config.device_config.device, "dtype": llm.engine.config.model_config.dtype,
                "kv_cache_dtype": llm.engine.config.cache_config.kv_cache_dtype,
                "custom_all_reduce": getattr(getattr(llm.engine.executor.runner, "tp_group", None), "custom_ar", None) is not None,
                "env": {k: v for k, v in os.environ.items() if k.startswith(("MINIVLLM_", "NCCL_"))}}
    finally:
        llm.close()


def run_subprocess(args: argparse.Namespace, tp: int, model: str | None = None) -> dict:
    """``measure`` for one TP size (of ``model``, default ``args.model``) in a fresh interpreter; the last stdout
    line is its JSON."""
    cmd = [sys.executable, __file__, "--worker", "--model", model or args.model, "--tp", str(tp),
           "--num-seqs", str(args.num_seqs), "--max-input-len", str(args.max_input_len),
           "--max-output-len", str(args.max_output_len), "--max-model-len", str(args.max_model_len),
           "--latency-input-len", str(args.latency_input_len), "--latency-output-len", str(args.latency_output_len)]
    cmd += [f for f, v in (("--enforce-eager", args.enforce_eager),) if v]
    cmd += [x for k in ("device", "dtype", "kv_cache_dtype") if getattr(args, k)
            for x in (f"--{k.replace('_', '-')}", getattr(args, k))]
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=dict(os.environ), timeout=args.size_timeout)
    except subprocess.TimeoutExpired:
        return {"tp": tp, "error": f"no result within {args.size_timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"tp": tp, "error": f"exit code {proc.returncode}"}
    return json.loads(lines[-1])


def table(rows: list[dict]) -> str:
    base = next((r["throughput_tok_s"] for r in rows if r.get("tp") == 1 and "error" not in r), None)
    out = [f"{'TP':>3} {'tok/s':>10} {'ms/token':>9} {'TPOT ms':>8} {'efficiency':>10} {'KV blocks':>9}"]
    for r in rows:
        if "error" in r:
            out.append(f"{r['tp']:>3} failed: {r['error']}")
            continue
        eff = r["throughput_tok_s"] / (r["tp"] * base) if base else None
        r["scaling_efficiency"] = eff
        out.append(f"{r['tp']:>3} {r['throughput_tok_s']:>10.1f} {r['ms_per_token']:>9.2f} {r['tpot_ms']:>8.2f} "
                   f"{'-' if eff is None else f'{eff:.1%}':>10} {r['kv_blocks']:>9}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a folder with config.json or a shipped config name (weights "
                                                  "are not read)")
    p.add_argument("--tp", type=int, nargs="+", default=[1, 2, 4], help="tensor-parallel sizes")
    p.add_argument("--num-seqs", type=int, default=256)
    p.add_argument("--max-input-len", type=int, default=1024)
    p.add_argument("--max-output-len", type=int, default=1024)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--latency-input-len", type=int, default=128)
    p.add_argument("--latency-output-len", type=int, default=512)
    p.add_argument("--device", default=None, help="default: cuda if available")
    p.add_argument("--dtype", default=None, help="default: the config's")
    p.add_argument("--kv-cache-dtype", default=None, help="auto (the model's dtype) or fp8")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    p.add_argument("--size-timeout", type=float, default=None, help="seconds allowed per TP size (default: none)")
    p.add_argument("--json-out", default=None)
    p.add_argument("--rank-proxy", action="store_true",
                   help="also run one rank's shapes at TP=1 for each TP size > 1 and print where the TP run's extra "
                        "time goes (benchmarks/engine/rank_proxy.py)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.model = resolve_model(args.model)[0]
    if args.worker:
        args.tp = args.tp[0]
        print(json.dumps(measure(args)), flush=True)
        return []
    rows = []
    for tp in args.tp:
        print(f"TP={tp} ...", flush=True)
        rows.append(run_subprocess(args, tp))
        print(json.dumps(rows[-1]), flush=True)
    print(f"\n{args.model}: {args.num_seqs} requests (throughput), "
          f"{args.latency_input_len} -> {args.latency_output_len} tokens (latency)")
    print(table(rows))
    proxies = rank_proxies(args, rows) if args.rank_proxy else {}
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps({"model": args.model, "args": vars(args), "results": rows,
                                                   "rank_proxy": proxies}, indent=2))
    return rows


def rank_proxies(args: argparse.Namespace, rows: list[dict]) -> dict[int, dict]:
    """For each TP size > 1 that ran: its rank proxy at TP=1 (``rank_proxy.py``), and the comparison printed."""
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from rank_proxy import overhead_table, write_rank_config

    out = {}
    for row in rows:
        if row.get("tp", 1) == 1 or "error" in row:
            continue
        with tempfile.TemporaryDirectory(prefix=f"rank_of_{row['tp']}_") as d:
            print(f"rank proxy of TP={row['tp']} ...", flush=True)
            proxy = out[row["tp"]] = run_subprocess(args, 1, write_rank_config(args.model, row["tp"], d))
        print(json.dumps(proxy), flush=True)
        print("\n" + (overhead_table(row, proxy) if "error" not in proxy else f"rank proxy failed: {proxy['error']}"))
    return out


if __name__ == "__main__":
    main()
