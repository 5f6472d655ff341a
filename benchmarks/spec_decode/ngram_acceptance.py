"""N-gram speculation on the demo model over held-out Python: acceptance rate, mean acceptance length and
end-to-end output tokens per second for each k, against no speculation (same prompts, greedy).

    python benchmarks/spec_decode/ngram_acceptance.py                       # k = 1, 2, 4, 8 on the CPU
    python benchmarks/spec_decode/ngram_acceptance.py --k 4 --device cuda --json-out ngram.json

The prompts are windows of the files the demo model never saw in training (``email/``, ``json/`` and ``xml/`` of
the standard library, see models/minivllm-demo-py/README.md), taken from this interpreter's standard library:
each prompt is ``--prompt-len`` tokens from a random place of a random file; the model continues it for
``--output-len`` tokens. Greedy outputs with speculation are checked equal to those without.
"""

from __future__ import annotations

import argparse
import json
import random
import sysconfig
import time
from pathlib import Path

from minivllm import LLM, SamplingParams

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "models" / "minivllm-demo-py"
HELD_OUT = ("email", "json", "xml")


def held_out_prompts(llm: LLM, n: int, prompt_len: int, seed: int) -> list[list[int]]:
    """``n`` windows of ``prompt_len`` tokens from the held-out packages' files."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for d in HELD_OUT for p in (stdlib / d).rglob("*.py") if "test" not in p.parts)
    tok = llm.get_tokenizer()
    rng = random.Random(seed)
    prompts = []
    while len(prompts) < n:
        ids = tok.encode(rng.choice(files).read_text(encoding="utf-8", errors="replace"))
        if len(ids) > prompt_len:
            start = rng.randrange(len(ids) - prompt_len)
            prompts.append(ids[start:start + prompt_len])
    return prompts


def timed(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> tuple[list[list[int]], float]:
    """Each prompt's output tokens, and the wall time of the one ``generate``."""
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    return [o["token_ids"] for o in outs], time.perf_counter() - t0


def add_workload_args(p: argparse.ArgumentParser) -> None:
    """The prompts', the device's and the output file's flags (what ``baseline`` reads)."""
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-out", default=None)


def baseline(args, max_num_seqs: int) -> tuple[SamplingParams, dict, list[list[int]], list[list[int]], list[dict]]:
    """Greedy params, engine arguments, the held-out prompts, their outputs without speculation and the k = 0
    row (``args``: the command line's ``num_prompts``, ``prompt_len``, ``output_len``, ``device``, ``seed``)."""
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    engine = dict(device=args.device, max_num_seqs=max_num_seqs, max_model_len=args.prompt_len + args.output_len + 16)
    base = LLM(str(DEMO), **engine)
    prompts = held_out_prompts(base, args.num_prompts, args.prompt_len, args.seed)
    base.generate(prompts[:1], params, use_tqdm=False)  # warm-up
    expected, elapsed = timed(base, prompts, params)
    base.close()
    return params, engine, prompts, expected, [{"k": 0, "output_tok_s": sum(map(len, expected)) / elapsed}]


def speculative_rows(model: str, specs: list[dict], prompts: list[list[int]], params: SamplingParams,
                     engine: dict, expected: list[list[int]]) -> list[dict]:
    """One row per speculative config: output tokens per second and the acceptance summary, after checking the
    greedy outputs equal ``expected`` (those without speculation)."""
    n_out, rows = sum(map(len, expected)), []
    for spec in specs:
        k = spec["num_speculative_tokens"]
        llm = LLM(model, speculative_config=spec, **engine)
        llm.generate(prompts[:1], params, use_tqdm=False)
        before = llm.engine.spec_totals.copy()
        got, elapsed = timed(llm, prompts, params)
        if got != expected:
            raise SystemExit(f"k={k}: greedy outputs differ from those without speculation")
        rows.append({"k": k, "output_tok_s": n_out / elapsed, **llm.engine.spec_totals.since(before).summary()})
        llm.close()
    return rows


def print_rows(rows: list[dict], header: str) -> None:
    """The table: tokens per second, speed-up over the first row (k = 0), acceptance per k."""
    print(header)
    print(f"{'k':>3} {'tok/s':>9} {'speed-up':>9} {'accept':>7} {'mean len':>9}  per position")
    for r in rows:
        extra = (f" {r['acceptance_rate']:7.3f} {r['mean_acceptance_length']:9.2f}  "
                 + " ".join(f"{x:.2f}" for x in r["acceptance_rate_per_pos"])) if r["k"] else ""
        print(f"{r['k']:>3} {r['output_tok_s']:9.1f} {r['output_tok_s'] / rows[0]['output_tok_s']:9.2f}{extra}")


def main(argv: list[str] | None = None) -> list[dict]:
    """Run the measurement; returns one row per k (k = 0: no speculation)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--k", type=int, nargs="+", default=[1, 2, 4, 8], help="num_speculative_tokens to try")
    p.add_argument("--prompt-lookup-min", type=int, default=2)
    p.add_argument("--prompt-lookup-max", type=int, default=4)
    p.add_argument("--batch", type=int, default=1, help="requests in flight at once (1: one request at a time)")
    add_workload_args(p)
    args = p.parse_args(argv)
    params, engine, prompts, expected, rows = baseline(args, args.batch)
    specs = [{"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": args.prompt_lookup_min,
              "prompt_lookup_max": args.prompt_lookup_max} for k in args.k]
    rows += speculative_rows(str(DEMO), specs, prompts, params, engine, expected)
    print_rows(rows, f"demo model, {args.num_prompts} held-out prompts x {args.output_len} tokens, batch {args.batch}, "
               f"{args.device}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    return rows


if __name__ == "__main__":
    main()
