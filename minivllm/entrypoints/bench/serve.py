"""``minivllm bench serve``: load an OpenAI-compatible server with streaming ``/v1/completions`` requests.

Works against ``minivllm serve``, vLLM, or any server that streams completions as SSE. Requests
arrive as a Poisson process at ``--request-rate`` (``inf``: all at once), optionally capped at
``--max-concurrency`` in flight. Prompts are random token-id lists (``--token-ids``) or random
words (about one token each). The body carries ``ignore_eos: true`` (vLLM's extra) so every
request generates ``--output-len`` tokens. Reports TTFT, TPOT, ITL and end-to-end latency (mean,
median, p99) and request / output-token throughput; every streamed chunk counts as one token
unless the server reports ``usage``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import time

import minivllm
from minivllm.entrypoints.bench import common

_WORDS = ("the of and to in is was for on that with as by at from his it an are were which be this has "
          "also or had its first new after who they have her she two their one time been all other "
          "when there more into some most many city world people year state made later during").split()


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The command's flags: the server, the requests, their arrival."""
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="the server's address")
    p.add_argument("--endpoint", default="/v1/completions", help="the streaming completions route")
    p.add_argument("--model", default=None, help="served model name (default: the first of /v1/models)")
    p.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    positive = common.int_at_least(1)
    p.add_argument("--num-prompts", type=positive, default=100, help="requests to send")
    p.add_argument("--input-len", type=positive, default=128, help="prompt length, in random words or token ids")
    p.add_argument("--output-len", type=positive, default=128, help="tokens each request generates (ignore_eos)")
    p.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s (Poisson); inf = all at once")
    p.add_argument("--max-concurrency", type=positive, default=None, help="most requests in flight (default: no cap)")
    p.add_argument("--token-ids", action="store_true", help="send prompts as lists of token ids")
    p.add_argument("--max-token-id", type=int, default=10000, help="random token ids are drawn from [0, this]")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature of every request")
    p.add_argument("--logprobs", type=int, default=None,
                   help="send logprobs=N; 0 makes a server stream one chunk per token even when the text is "
                        "empty (tokenizer-less dummy models)")
    p.add_argument("--seed", type=int, default=0, help="Python random seed of the prompts and arrival times")
    p.add_argument("--ready-timeout", type=float, default=300, help="seconds to wait for /health to answer 200")
    p.add_argument("--label", default=None, help="series name for plots (default: the model)")
    common.add_output_args(p)


def make_prompts(args: argparse.Namespace) -> list:
    """The prompts: random token ids (``--token-ids``) or random words."""
    rng = random.Random(args.seed)
    if args.token_ids:
        return [[rng.randint(0, args.max_token_id) for _ in range(args.input_len)] for _ in range(args.num_prompts)]
    return [" ".join(rng.choice(_WORDS) for _ in range(args.input_len)) for _ in range(args.num_prompts)]


async def one_request(client, url: str, body: dict) -> dict:
    """Stream one completion; timestamps of every chunk that carries a choice."""
    rec = {"success": False, "ttft": 0.0, "itl": [], "latency": 0.0, "output_tokens": 0, "chunks": 0, "error": ""}
    t0 = time.perf_counter()
    last, chunks, usage = t0, 0, None
    try:
        async with client.stream("POST", url, json=body) as resp:
            if resp.status_code != 200:
                rec["error"] = f"HTTP {resp.status_code}: {(await resp.aread())[:300]!r}"
                return rec
            async for line in resp.aiter_lines():
                line = line.strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                msg = json.loads(data)
                if msg.get("usage"):
                    usage = msg["usage"]
                if msg.get("choices"):
                    now = time.perf_counter()
                    if chunks == 0:
                        rec["ttft"] = now - t0
                    else:
                        rec["itl"].append(now - last)
                    last, chunks = now, chunks + 1
        rec["latency"] = time.perf_counter() - t0
        rec["output_tokens"] = (usage or {}).get("completion_tokens") or chunks
        rec["chunks"] = chunks
        rec["success"] = chunks > 0
        rec["error"] = "" if chunks else "no tokens streamed"
    except Exception as e:  # noqa: BLE001 - any transport error is a failed request
        rec["error"] = f"{type(e).__name__}: {e}"
    return rec


async def _wait_ready(client, base: str, timeout: float) -> None:
    """Poll ``/health`` until 200 (a server without it, answering 404, counts as ready)."""
    deadline = time.monotonic() + timeout
    told = False
    while True:
        try:
            resp = await client.get(base + "/health")
            if resp.status_code in (200, 404):
                return
        except Exception:  # noqa: BLE001 - not listening yet
            pass
        if not told:  # a server still starting, or none at that address: say what the silence is
            print(f"waiting for {base}/health (up to {timeout:.0f} s, --ready-timeout)", file=sys.stderr, flush=True)
            told = True
        if time.monotonic() > deadline:
            raise TimeoutError(f"{base}/health did not answer 200 within {timeout:.0f} s")
        await asyncio.sleep(0.5)


_SPEC_METRIC = re.compile(r'^vllm:spec_decode_(num_drafts|num_draft_tokens|num_accepted_tokens|'
                          r'num_accepted_tokens_per_pos)_total(?:\{([^}]*)\})? (\S+)$', re.M)


async def _spec_counters(client, base: str):
    """The server's speculative-decoding counters from ``/metrics`` (vLLM's names, summed over models), or None
    when it exports none (no speculation, or no metrics)."""
    from minivllm.engine.spec_decode_stats import SpecDecodeCounters

    try:
        resp = await client.get(base + "/metrics")
    except Exception:  # noqa: BLE001 - a server without metrics
        return None
    found = _SPEC_METRIC.findall(resp.text) if resp.status_code == 200 else []
    if not found:
        return None
    counts, per_pos = {}, {}
    for name, labels, value in found:
        if name == "num_accepted_tokens_per_pos":
            pos = int(re.search(r'position="(\d+)"', labels)[1])
            per_pos[pos] = per_pos.get(pos, 0) + int(float(value))
        else:
            counts[name] = counts.get(name, 0) + int(float(value))
    k = max(per_pos) + 1 if per_pos else 0
    return SpecDecodeCounters(k, counts.get("num_drafts", 0), counts.get("num_draft_tokens", 0),
                              counts.get("num_accepted_tokens", 0), [per_pos.get(i, 0) for i in range(k)])


async def _model_name(client, base: str) -> str:
    resp = await client.get(base + "/v1/models")
    resp.raise_for_status()
    return resp.json()["data"][0]["id"]


async def benchmark(args: argparse.Namespace) -> tuple[list[dict], float, str, dict | None]:
    """Send the requests; returns their records, the wall time, the model's name and the server's
    speculative-decoding figures over the run (None without speculation)."""
    import httpx
    from tqdm import tqdm

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    base = args.base_url.rstrip("/")
    prompts, rng = make_prompts(args), random.Random(args.seed + 1)
    sem = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None
    limits = httpx.Limits(max_connections=args.max_concurrency or args.num_prompts, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=None, headers=headers, limits=limits) as client:
        await _wait_ready(client, base, args.ready_timeout)
        model = args.model or await _model_name(client, base)
        spec_before = await _spec_counters(client, base)

        async def limited(prompt) -> dict:
            body = {"model": model, "prompt": prompt, "max_tokens": args.output_len, "temperature": args.temperature,
                    "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}
            if args.logprobs is not None:
                body["logprobs"] = args.logprobs
            if sem is None:
                return await one_request(client, base + args.endpoint, body)
            async with sem:
                return await one_request(client, base + args.endpoint, body)

        t0 = time.perf_counter()
        tasks = []
        with tqdm(total=len(prompts), desc="Requests", disable=not common.show_progress(args)) as pbar:
            for i, prompt in enumerate(prompts):
                tasks.append(asyncio.create_task(limited(prompt)))
                tasks[-1].add_done_callback(lambda _: pbar.update(1))
                if args.request_rate != float("inf") and i < len(prompts) - 1:
                    await asyncio.sleep(rng.expovariate(args.request_rate))
            recs = await asyncio.gather(*tasks)
            elapsed = time.perf_counter() - t0
        spec_after = await _spec_counters(client, base) if spec_before is not None else None
        spec = None
        if spec_after is not None:
            spec_before.per_pos += [0] * (spec_after.k - spec_before.k)
            spec = spec_after.since(spec_before).summary()
        return recs, elapsed, model, spec


def run(args: argparse.Namespace) -> dict:
    """Run the benchmark, print its table; returns the result."""
    if not args.request_rate > 0:
        raise ValueError(f"request_rate must be > 0 (inf: all at once), got {args.request_rate}")
    recs, duration, model, spec = asyncio.run(benchmark(args))
    ok = [r for r in recs if r["success"]]
    n_out = sum(r["output_tokens"] for r in ok)
    ttft = common.summary([r["ttft"] for r in ok], 1000)
    tpot = common.summary([(r["latency"] - r["ttft"]) / (r["output_tokens"] - 1) for r in ok
                           if r["output_tokens"] > 1], 1000)
    itl = common.summary([x for r in ok for x in r["itl"]], 1000)
    e2el = common.summary([r["latency"] for r in ok], 1000)
    errors = sorted({r["error"] for r in recs if not r["success"]})
    n_chunks = sum(r["chunks"] for r in ok)
    if n_chunks < 0.9 * n_out:
        print(f"warning: {n_chunks} streamed chunks for {n_out} tokens: TPOT/ITL are not per token (a server "
              "skips empty-text chunks; without a tokenizer pass --logprobs 0)")
    result = {"benchmark": "serve", "base_url": args.base_url, "model": model, "label": args.label or model,
              "date": time.strftime("%Y-%m-%d %H:%M"), "version": minivllm.__version__,
              "request_rate": args.request_rate, "max_concurrency": args.max_concurrency,
              "num_prompts": args.num_prompts, "input_len": args.input_len, "output_len": args.output_len,
              "duration_s": duration, "completed": len(ok), "failed": len(recs) - len(ok), "errors": errors[:5],
              "total_input_tokens": len(ok) * args.input_len, "total_output_tokens": n_out,
              "request_throughput": len(ok) / duration, "output_throughput": n_out / duration,
              "total_token_throughput": (len(ok) * args.input_len + n_out) / duration,
              "streamed_chunks": n_chunks, "logprobs": args.logprobs,
              "ttft_ms": ttft, "tpot_ms": tpot, "itl_ms": itl, "e2el_ms": e2el}
    if spec is not None and spec["num_drafts"]:
        result["speculative_decoding"] = spec
    for name, s in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el)):
        for stat in ("mean", "median", "p99"):
            result[f"{stat}_{name}_ms"] = s[stat]  # vLLM's flat key names
    common.write_json(args.json_out, result)
    for e in errors[:5]:
        print(f"failed request: {e}")
    print(f"\n{args.base_url} model {model}: {args.num_prompts} prompts, {args.input_len} in -> {args.output_len} out, "
          f"rate {args.request_rate} req/s, max concurrency {args.max_concurrency or 'none'}")
    rows = [["successful / failed requests", len(ok), len(recs) - len(ok), ""],
            ["duration (s)", duration, "", ""],
            ["request throughput (req/s)", result["request_throughput"], "", ""],
            ["output token throughput (tok/s)", result["output_throughput"], "", ""],
            ["total token throughput (tok/s)", result["total_token_throughput"], "", ""],
            ["TTFT (ms)", ttft["mean"], ttft["median"], ttft["p99"]],
            ["TPOT (ms)", tpot["mean"], tpot["median"], tpot["p99"]],
            ["ITL (ms)", itl["mean"], itl["median"], itl["p99"]],
            ["E2E latency (ms)", e2el["mean"], e2el["median"], e2el["p99"]]]
    rows += [[name, value, "", ""] for name, value in common.spec_decode_rows(result)]
    common.print_table("serving results", ["metric", "mean / value", "median", "p99"], rows)
    return result


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``minivllm bench serve`` to an argparse sub-parsers object."""
    return common.register(subparsers, "serve", "online serving benchmark against an OpenAI-compatible server", __doc__, add_arguments, run)


def main(argv: list[str] | None = None) -> dict:
    """``python -m minivllm.entrypoints.bench.serve ...``: run it; returns the result."""
    return common.standalone("serve", __doc__, add_arguments, run, argv)


if __name__ == "__main__":
    main()
