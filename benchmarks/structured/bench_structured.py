"""What structured outputs cost on the GPU: the per-step mask (fill on the host + apply on the device) for 256
rows of a 151,936-token vocabulary, and the nano workload with 25% of its requests under a JSON schema against
the same workload unconstrained.

    python benchmarks/structured/bench_structured.py --tokenizer DIR mask
    python benchmarks/structured/bench_structured.py --tokenizer DIR nano [--repeat 3]

``DIR``: a tokenizer of Qwen3's vocabulary size (``big_tokenizer.py``). The nano part runs Qwen3-0.6B with
dummy weights and nano-vLLM's requests (``minivllm bench throughput``); every fourth request asks for an
array of records (``RECORDS``), which a random model fills for hundreds of tokens. The constrained run goes
first; the unconstrained run then asks each request for exactly the tokens it got, so both runs generate the
same tokens and differ only by the grammar. Throughput = generated tokens / wall time.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.helpers.json_schemas import SCHEMAS  # noqa: E402

RECORDS = {"type": "array", "items": {"type": "object", "properties": {
    "id": {"type": "integer"}, "name": {"type": "string", "maxLength": 40},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}}}, "required": ["id", "name", "tags"]}}


def model_dir(tokenizer: str, config: str = "qwen3-0.6b") -> str:
    """A folder with a shipped model config and the benchmark tokenizer (weights: dummy)."""
    from minivllm.entrypoints.bench.models import resolve_model

    out = Path(tempfile.mkdtemp(prefix="so-bench-"))
    shutil.copy(Path(resolve_model(config)[0]) / "config.json", out / "config.json")
    for f in Path(tokenizer).iterdir():
        if f.is_file():
            shutil.copy(f, out / f.name)
    return str(out)


def bench_mask(tokenizer_dir: str, rows: int, steps: int, device: str, threads: int | None = None) -> dict:
    """Median ms per step: host fill of ``rows`` masks, then copy + apply on ``device``, and the sampler with and
    without them."""
    from transformers import AutoTokenizer

    from minivllm.core.scheduler_output import ScheduledRow, SchedulerOutput
    from minivllm.engine.structured_output import StructuredOutputManager
    from minivllm.sample.metadata import build_sampling_metadata
    from minivllm.sample.sampler import Sampler, apply_grammar
    from minivllm.sampling_params import SamplingParams, StructuredOutputsParams

    V = 151_936
    from minivllm.config import StructuredOutputsConfig

    mgr = StructuredOutputManager(AutoTokenizer.from_pretrained(tokenizer_dir), V, [151645],
                                  StructuredOutputsConfig(structured_outputs_threads=threads))
    schemas = [StructuredOutputsParams(json=s) for s in SCHEMAS.values()]
    rng = random.Random(0)
    params = SamplingParams(temperature=0.6)
    seqs = []
    for i in range(rows):
        mgr.start(i, mgr.prepare(schemas[i % len(schemas)]))
        seqs.append(ScheduledRow(i, 0, (0,), (), -1, True, 0))
    out = SchedulerOutput(rows=tuple(seqs), sampled=tuple(seqs))
    dev = torch.device(device)
    sampler = Sampler(fused=dev.type == "cuda")
    logits = torch.randn(rows, V, device=dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    fill, apply, with_g, without = [], [], [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        mask = mgr.bitmask(out)
        fill.append(time.perf_counter() - t0)
        md0 = build_sampling_metadata([params] * rows, [()] * rows, [()] * rows, [], dev, V)
        sync()
        t0 = time.perf_counter()
        sampler(logits, md0)
        sync()
        without.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        md = build_sampling_metadata([params] * rows, [()] * rows, [()] * rows, [], dev, V,
                                     grammar=(mask.rows, mask.bitmask))
        x = logits.clone()
        apply_grammar(x, md.grammar_rows, md.grammar_bitmask, sampler.fused)
        sync()
        apply.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        md = build_sampling_metadata([params] * rows, [()] * rows, [()] * rows, [], dev, V,
                                     grammar=(mask.rows, mask.bitmask))
        tokens = sampler(logits, md).sampled_token_ids.tolist()
        with_g.append(time.perf_counter() - t0)
        for i, t in enumerate(tokens):  # each row moves on in its grammar (a finished one starts again)
            if mgr.accept(i, t):
                mgr.start(i, mgr.prepare(schemas[rng.randrange(len(schemas))]))
    ms = {k: 1e3 * statistics.median(v) for k, v in
          (("host_fill_ms", fill), ("copy_apply_ms", apply), ("sampler_ms", without), ("sampler_grammar_ms", with_g))}
    return {"rows": rows, "vocab": V, "steps": steps, "device": device, "threads": mgr.num_threads, **ms}


def bench_nano(tokenizer_dir: str, repeat: int, fraction: float, num_requests: int, max_output: int) -> dict:
    from minivllm.entrypoints.bench.throughput import WORKLOADS, make_requests
    from minivllm.llm import LLM
    from minivllm.sampling_params import SamplingParams, StructuredOutputsParams

    spec = {**WORKLOADS["nano"], "num_requests": num_requests,
            "max_output_len": min(max_output, WORKLOADS["nano"]["max_output_len"])}
    spec["min_output_len"] = min(spec["min_output_len"], spec["max_output_len"])
    prompts, max_tokens = make_requests(spec, 0, 10000)
    every = round(1 / fraction)
    so = StructuredOutputsParams(json=RECORDS)
    llm = LLM(model_dir(tokenizer_dir), load_format="dummy", max_model_len=spec["max_model_len"])
    llm.engine.structured.prepare(so)  # the tokenizer view and the grammar, before the clock starts
    llm.generate([[11, 22, 33, 44]], SamplingParams(), use_tqdm=False)

    def run(constrained: bool, lengths: list[int], shift: int) -> dict:
        ps = [[(t + shift) % 10001 for t in p] for p in prompts]
        params = [SamplingParams(temperature=spec["temperature"], ignore_eos=True, max_tokens=m,
                                 structured_outputs=so if constrained and i % every == 0 else None)
                  for i, m in enumerate(lengths)]
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        t0 = time.perf_counter()
        outs = llm.generate(ps, params, use_tqdm=False)
        elapsed = time.perf_counter() - t0
        got = [len(o["token_ids"]) for o in outs]
        valid = sum(1 for i, o in enumerate(outs) if i % every == 0 and _parses(o["text"]))
        return {"elapsed_s": elapsed, "tokens": sum(got), "tok_s": sum(got) / elapsed, "lengths": got,
                "constrained_valid_json": valid if constrained else None}

    first = run(True, max_tokens, 0)
    lengths = first["lengths"]
    runs = {"constrained": [], "free": []}
    for r in range(repeat):
        runs["free"].append(run(False, lengths, 1009 * (r + 1)))
        runs["constrained"].append(run(True, max_tokens, 1009 * (r + 1)))
    llm.close()
    n_con = len(range(0, len(prompts), every))
    med = {k: statistics.median(x["tok_s"] for x in v) for k, v in runs.items()}
    return {"requests": len(prompts), "constrained_requests": n_con,
            "constrained_tokens_first_run": sum(lengths[::every]), "tokens_first_run": sum(lengths),
            "free_tok_s_median": med["free"], "constrained_tok_s_median": med["constrained"],
            "ratio": med["constrained"] / med["free"],
            "runs": {k: [{kk: vv for kk, vv in x.items() if kk != "lengths"} for x in v] for k, v in runs.items()}}


def _parses(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=("mask", "nano"))
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--fraction", type=float, default=0.25)
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--max-output", type=int, default=1024)
    ap.add_argument("--threads", type=int, nargs="+", default=[None], help="mask-filling threads (mask part)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json-out")
    a = ap.parse_args()
    if a.part == "mask":
        results = [bench_mask(a.tokenizer, a.rows, a.steps, a.device, t) for t in a.threads]
    else:
        results = [bench_nano(a.tokenizer, a.repeat, a.fraction, a.num_requests, a.max_output)]
    print("| " + " | ".join(k for k, v in results[0].items() if not isinstance(v, dict)) + " |")
    for res in results:
        print("| " + " | ".join(f"{v:.4g}" if isinstance(v, float) else str(v)
                                for v in res.values() if not isinstance(v, dict)) + " |")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
