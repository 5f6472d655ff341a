"""Scale-out simulation: 1 to 64 data-parallel minivllm replicas behind a router, Poisson load, on the CPU.

Each replica is a fake engine (``benchmarks/scale_out/scale_out_model.py``): minivllm's token-budget scheduler with
chunked prefill, step by step, each step costing

    ms = fixed + per_row * decode rows + per_context * keys the decode rows attend to + per_prefill * prompt tokens

for Qwen3-8B, bf16, on one H200 per replica (TP=1). Every coefficient comes from figures in docs/benchmarks.md
and docs/performance-notes.md (``MEASURED`` below):

- per_context: performance-notes.md, section "Where the time goes", the decode step table, row bf16: attention
  9.19 ms at 240 rows of context ~1000 (``profile_step.py --decode-rows 240 --decode-context 1000``), so
  9.19 / 240,000 ms a key. (The decode attention kernel table under "FP8" there, 250.8 us a layer at 256 rows x
  1,024 keys over 36 layers, gives 34.4 ns a key against this 38.3: the same order.)
- per_row: the same row's wall time less its attention, 16.63 - 9.19 = 7.44 ms at 240 rows, against the text
  below the table: one row of context ~400 decodes in 4.34 ms of wall time; the line through the two points.
- fixed: that one-row step less its one row and its attention.
- per_prefill: calibrated so that the simulated nano workload (nano-vLLM's 256 requests, ``random.seed(0)``, all
  at once) runs at 9,458 output tok/s, Qwen3-8B's nano figure in benchmarks.md's table "H200 (one NVIDIA H200)". The steps
  of a closed batch do not depend on their times, so its makespan is linear in per_prefill: solved exactly.
  Printed as a check: the table's one-request figure (128 -> 512 tokens, 4.33 ms/token) against the model's.

The load: Poisson arrivals, prompts of randint(100, 1024) tokens and outputs of randint(100, 1024) tokens (the
nano workload's ranges), seeded. One replica under a backlog gives its saturated output tok/s; divided by the
mean output length (562) it is the replica's saturated request rate. For each load fraction f and replica count
N, requests arrive at N * f * that rate for ``--duration`` seconds, or longer until ``--min-requests`` have come.
TTFT percentiles cover the requests that arrive after ``--warmup`` seconds; throughput counts the output tokens
made from then to the last arrival (offered tok/s: those the requests ask for, over the same time). The engines
run minivllm's GPU defaults: 256 sequences, 16,384 tokens a step, asynchronous scheduling.

    python benchmarks/scale_out/scale_out_sim.py --jobs 2 --json-out runs/scale_out.json --out docs/img/scale_out_sim.png
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale_out_model import ROUTERS, CostModel, Limits, Request, simulate  # noqa: E402

MEASURED = {  # Qwen3-8B, bf16, dummy weights, one H200; docs/benchmarks.md and docs/performance-notes.md
    "decode_240_wall_ms": 16.63,  # performance-notes.md, "Where the time goes", bf16 row, wall (cac26d1)
    "decode_240_attention_ms": 9.19,  # same row, attention
    "decode_240_rows": 240, "decode_240_context": 1000,
    "decode_1_wall_ms": 4.34,  # the text under that table: one row, context ~400, bf16 (e266fee)
    "decode_1_context": 400,
    "nano_tok_s": 9458.0,  # "H200 (one NVIDIA H200)", nano, Qwen3-8B (ed21ead)
    "one_request_ms_per_token": 4.33,  # same table, one-request, Qwen3-8B (3c07a39): a check, not fitted
}
LENGTHS = (100, 1024)  # nano's prompt and output length range (both randint, inclusive)
MEAN_OUTPUT = sum(LENGTHS) / 2


def nano_requests() -> list[Request]:
    """nano-vLLM's bench.py lengths in its order of draws (prompt token ids drawn and dropped), all at t=0."""
    rng = random.Random(0)
    prompts = [len([rng.randint(0, 10000) for _ in range(rng.randint(*LENGTHS))]) for _ in range(256)]
    return [Request(0.0, p, rng.randint(*LENGTHS)) for p in prompts]


def fit_cost_model(m: dict = MEASURED) -> CostModel:
    """The step-cost coefficients from the measured figures (see the module's docstring); nano ran with the
    default scheduler settings, so its calibration uses them whatever the simulation's are."""
    limits = Limits()
    per_context = m["decode_240_attention_ms"] / (m["decode_240_rows"] * m["decode_240_context"])
    one_row_rest = m["decode_1_wall_ms"] - per_context * m["decode_1_context"]
    per_row = (m["decode_240_wall_ms"] - m["decode_240_attention_ms"] - one_row_rest) / (m["decode_240_rows"] - 1)
    cost0 = CostModel(one_row_rest - per_row, per_row, per_context, 0.0)
    reqs = nano_requests()
    makespan0 = max(r.finish for r in simulate(reqs, 1, cost0, limits).requests)
    target = sum(r.output_len for r in reqs) / m["nano_tok_s"]
    per_prefill = 1000 * (target - makespan0) / sum(r.prompt_len for r in reqs)
    return CostModel(cost0.fixed_ms, per_row, per_context, per_prefill)


def poisson_requests(rate: float, duration: float, seed: int) -> list[Request]:
    """Poisson arrivals at ``rate`` per second over ``[0, duration)``, nano-like lengths."""
    rng, t, out = random.Random(seed), 0.0, []
    while True:
        t += rng.expovariate(rate)
        if t >= duration:
            return out
        out.append(Request(t, rng.randint(*LENGTHS), rng.randint(*LENGTHS)))


def saturated(cost: CostModel, limits: Limits, n: int, duration: float, warmup: float, seed: int) -> float:
    """Output tok/s of ``n`` replicas that always have a backlog, from ``warmup`` to ``duration`` seconds."""
    # NOTE: enough requests that no replica runs dry: a step makes at most max_num_seqs tokens in at least
    # fixed_ms, and a request wants at least LENGTHS[0]
    per_s = limits.max_num_seqs / (cost.fixed_ms / 1000) / LENGTHS[0]
    rng = random.Random(seed)
    reqs = [Request(0.0, rng.randint(*LENGTHS), rng.randint(*LENGTHS)) for _ in range(int(n * per_s * duration))]
    res = simulate(reqs, n, cost, limits, stop_at=duration)
    return res.tokens_between(warmup, duration) / (duration - warmup)


def run_point(cost: CostModel, limits: Limits, n: int, rate: float, router: str, args) -> dict:
    """One replica count, request rate and router: throughput and TTFT after the warm-up."""
    duration = max(args.duration, args.min_requests / rate)
    reqs = poisson_requests(rate, duration, seed=args.seed * 1000 + n)
    res = simulate(reqs, n, cost, limits, router=router, seed=args.seed,
                   router_overhead_ms=args.router_overhead_ms, until_first_tokens=True)
    end = reqs[-1].arrival
    tok_s = res.tokens_between(args.warmup, end) / (end - args.warmup)
    offered = sum(r.output_len for r in reqs if r.arrival >= args.warmup) / (end - args.warmup)
    ttft = np.array([r.first_token - r.arrival for r in reqs if r.arrival >= args.warmup]) * 1000
    p50, p99 = np.percentile(ttft, [50, 99])
    return {"replicas": n, "router": router, "offered_req_s": rate, "offered_tok_s": offered, "duration_s": duration,
            "requests": len(reqs), "output_tok_s": tok_s, "tok_s_per_replica": tok_s / n, "ttft_p50_ms": float(p50),
            "ttft_p99_ms": float(p99)}


def table(rows: list[dict], routers: list[str]) -> str:
    """The printed result: one line per load and replica count, the routers side by side."""
    cols = f"{'tok/s':>9} {'/replica':>8} {'p50 ms':>7} {'p99 ms':>7}"
    out = [f"{'':>36}" + "".join(f" | {name + ' (TTFT)':^{len(cols)}}" for name in routers),
           f"{'load':>4} {'N':>3} {'offered req/s':>13} {'offered tok/s':>13}" + f" | {cols}" * len(routers)]
    for key in dict.fromkeys((r["load"], r["replicas"]) for r in rows):
        by = {r["router"]: r for r in rows if (r["load"], r["replicas"]) == key}
        first = by[routers[0]]
        line = f"{key[0]:>4} {key[1]:>3} {first['offered_req_s']:>13.1f} {first['offered_tok_s']:>13,.0f}"
        for name in routers:
            r = by[name]
            line += (f" | {r['output_tok_s']:>9,.0f} {r['tok_s_per_replica']:>8,.0f} {r['ttft_p50_ms']:>7.1f} "
                     f"{r['ttft_p99_ms']:>7.1f}")
        out.append(line)
    return "\n".join(line.rstrip() for line in out)


def plot(rows: list[dict], routers: list[str], sat_tok_s: float, out: str) -> None:
    """Two panels: output tok/s vs replicas with the ideal lines; TTFT p50 / p99 vs replicas at the highest load,
    one colour per router."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    ns = sorted({r["replicas"] for r in rows})
    loads = sorted({r["load"] for r in rows})
    marks = dict(zip(routers, ("o", "x", "+")))
    ax1.plot(ns, [n * sat_tok_s for n in ns], "k-", lw=1, label="ideal: N x one saturated replica")
    for i, load in enumerate(loads):
        ax1.plot(ns, [n * load * sat_tok_s for n in ns], "--", color=f"C{i}", lw=0.8,
                 label=f"ideal at load {load}")
        for name in routers:
            pts = [r for r in rows if r["load"] == load and r["router"] == name]
            ax1.plot([r["replicas"] for r in pts], [r["output_tok_s"] for r in pts], marks[name], color=f"C{i}",
                     ms=7, label=f"{name}, load {load}")
    top = loads[-1]
    for j, name in enumerate(routers):
        pts = [r for r in rows if r["load"] == top and r["router"] == name]
        for q, ls in (("p50", ":"), ("p99", "-")):
            ax2.plot([r["replicas"] for r in pts], [r[f"ttft_{q}_ms"] for r in pts], ls, marker=marks[name],
                     color=f"C{j + len(loads)}", label=f"{name} {q}")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_xlabel("replicas (Qwen3-8B, one H200 each)")
        ax.grid(True, which="both", alpha=0.3)
    ax1.set_ylabel("output tok/s")
    ax1.set_title("Throughput (simulated)")
    ax2.set_ylabel("TTFT, ms")
    ax2.set_title(f"TTFT at load {top}: p50 (dotted), p99 (solid)")
    ax1.legend(fontsize=6, ncol=2)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", default="1,2,4,8,16,32,64", help="comma-separated replica counts")
    p.add_argument("--loads", default="0.7,0.9,0.95", help="load per replica, fractions of its saturated rate")
    p.add_argument("--routers", default="least-loaded,random,p2c", help=f"comma-separated, of {', '.join(ROUTERS)}")
    p.add_argument("--duration", type=float, default=240.0, help="simulated seconds of arrivals per point, at least")
    p.add_argument("--min-requests", type=int, default=20000,
                   help="arrivals per point, at least (longer runs for few replicas)")
    p.add_argument("--saturation-duration", type=float, default=600.0,
                   help="simulated seconds of the one-replica backlog run")
    p.add_argument("--warmup", type=float, default=60.0, help="simulated seconds left out of the figures")
    p.add_argument("--router-overhead-ms", type=float, default=0.0,
                   help="an assumed delay between a request's arrival and its replica (default 0: not modelled)")
    p.add_argument("--max-num-seqs", type=int, default=Limits.max_num_seqs)
    p.add_argument("--max-num-batched-tokens", type=int, default=Limits.max_num_batched_tokens)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=1, help="points simulated at once, in processes (same results)")
    p.add_argument("--json-out", default=None)
    p.add_argument("--out", default=None, help="PNG to write (two panels)")
    args = p.parse_args(argv)
    ns = [int(x) for x in args.replicas.split(",")]
    loads = [float(x) for x in args.loads.split(",")]
    routers = [x.strip() for x in args.routers.split(",")]
    if not set(routers) <= set(ROUTERS) or not 0 <= args.warmup < args.duration:
        p.error(f"routers must be of {ROUTERS} and 0 <= warmup < duration")
    limits = Limits(args.max_num_seqs, args.max_num_batched_tokens)
    cost = fit_cost_model()
    print(f"step ms = {cost.fixed_ms:.4f} + {cost.per_decode_row_ms:.5f} x decode rows + "
          f"{cost.per_context_token_ms:.4e} x context tokens + {cost.per_prefill_token_ms:.5f} x prompt tokens")
    one = simulate([Request(0.0, 128, 512)], 1, cost, limits).requests[0]
    print(f"check, one request 128 -> 512: {1000 * one.finish / 512:.2f} ms/token "
          f"(measured {MEASURED['one_request_ms_per_token']})")
    sat = saturated(cost, limits, 1, args.saturation_duration, args.warmup, args.seed)
    mu = sat / MEAN_OUTPUT
    print(f"one replica, saturated: {sat:,.0f} output tok/s = {mu:.2f} req/s "
          f"(mean output {MEAN_OUTPUT:.0f} tokens)")
    tasks = [(load, n, router) for load in loads for n in ns for router in routers]
    k = len(tasks)
    cols = ([cost] * k, [limits] * k, [n for _, n, _ in tasks], [n * f * mu for f, n, _ in tasks],
            [r for _, _, r in tasks], [args] * k)
    print(f"simulating {len(tasks)} points ...", file=sys.stderr, flush=True)
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as ex:
            points = list(ex.map(run_point, *cols))
    else:
        points = list(map(run_point, *cols))
    rows = [{"load": f, **pt} for (f, _, _), pt in zip(tasks, points)]
    print(f"\nQwen3-8B, one H200 per replica (simulated); Poisson arrivals for max({args.duration:.0f} s, "
          f"{args.min_requests} requests) per point, the first {args.warmup:.0f} s left out; load = fraction of "
          f"{mu:.2f} req/s per replica")
    print(table(rows, routers))
    result = {"benchmark": "scale_out_sim", "measured": MEASURED, "cost_model": asdict(cost),
              "limits": asdict(limits), "saturated_tok_s": sat, "saturated_req_s": mu, "args": vars(args),
              "results": rows}
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(result, indent=2))
        print(f"wrote {args.json_out}")
    if args.out:
        plot(rows, routers, sat, args.out)
    return result


if __name__ == "__main__":
    main()
