"""Which Triton kernels compile after start-up, and what a user's first requests pay for them.

Builds an ``LLM`` (dummy weights) with a fresh Triton cache directory, so every compile is a real one,
then runs a list of small scenarios twice. For each it prints the first and second pass's seconds and
the kernels that compiled during the first pass, with the argument specialisations that made them new
(Triton specialises integer arguments on ``== 1`` and ``% 16 == 0`` and pointers on 16-byte alignment).

    python3 benchmarks/engine/lazy_compiles.py --model qwen3-0.6b [--json-out F]

A scenario whose first pass compiled nothing and takes about as long as its second is what users should see.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without install

from minivllm.entrypoints.bench import common  # noqa: E402 - imports neither torch nor triton


def scenarios(vocab: int, long_len: int, ids_seed: int):
    """(name, prompts, SamplingParams kwargs); prompts are token ids. Lengths are the same for every
    ``ids_seed``; token ids differ, so a second pass does not hit the first one's prefix cache."""
    rnd, rnd_ids = random.Random(0), random.Random(ids_seed)

    def ids(n: int) -> list[int]:
        return [rnd_ids.randint(1, vocab) for _ in range(n)]

    shared = ids(600)
    return [
        ("one request 128 -> 64, greedy", [ids(128)], dict(temperature=0.0, max_tokens=64)),
        ("one request 128 -> 64, temperature 0.6", [ids(128)], dict(temperature=0.6, max_tokens=64)),
        ("one request 37 -> 16, greedy", [ids(37)], dict(temperature=0.0, max_tokens=16)),
        ("8 requests of 20-700 -> 32, temperature 0.8", [ids(rnd.randint(20, 700)) for _ in range(8)],
         dict(temperature=0.8, max_tokens=32)),
        ("4 requests, top_p 0.9, top_k 50", [ids(rnd.randint(50, 300)) for _ in range(4)],
         dict(temperature=0.7, top_p=0.9, top_k=50, max_tokens=16)),
        ("2 requests, logprobs 5", [ids(100), ids(333)], dict(temperature=0.0, max_tokens=8, logprobs=5)),
        ("prefix hit: one 600-token prompt twice", [shared, shared + ids(5)], dict(temperature=0.0, max_tokens=8)),
        ("48 requests of 100-1024 -> 40, temperature 0.6", [ids(rnd.randint(100, 1024)) for _ in range(48)],
         dict(temperature=0.6, max_tokens=40)),
        (f"one request of {long_len} tokens (chunked prefill) -> 8", [ids(long_len)], dict(temperature=0.0, max_tokens=8)),
    ]


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keep-cache", action="store_true", help="use the existing Triton cache directory")
    common.add_engine_args(p)  # --model (a shipped name or folder: dummy weights), engine flags, --engine-arg
    args = p.parse_args(argv)
    if not args.keep_cache:
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-lazy-")
    import triton
    from triton import knobs

    from minivllm import LLM, SamplingParams

    phase = ["start-up"]
    compiled: list[tuple[str, str, dict]] = []  # (phase, kernel, {argument or option: specialisation})

    def hook(*, fn, compile, **kwargs):  # noqa: A002 - Triton's keyword
        compiled.append((phase[0], getattr(fn, "name", str(fn)), specialisation(compile)))
        return False  # NOTE: a true value would skip the compile

    knobs.runtime.jit_cache_hook = hook
    path, kw = common.engine_kwargs(args, max_model_len=24576)
    t0 = time.perf_counter()
    llm = LLM(path, **kw)
    startup_s = time.perf_counter() - t0
    cache_dir = os.environ.get("TRITON_CACHE_DIR")
    cached_at_start = cache_kernels(cache_dir)
    vocab = min(10000, llm.engine.config.model_config.arch.vocab_size - 1)
    rows = []
    cfg = llm.engine.config
    long_len = min(cfg.model_config.max_model_len - 16, cfg.scheduler_config.max_num_batched_tokens + 3001)
    passes = [scenarios(vocab, long_len, seed) for seed in (1, 2)]
    for i, (name, _, sp) in enumerate(passes[0]):
        times = []
        for rep in range(2):
            prompts = passes[rep][i][1]
            phase[0] = name if rep == 0 else f"{name} (again)"
            torch_sync()
            t = time.perf_counter()
            llm.generate(prompts, SamplingParams(ignore_eos=True, **sp), use_tqdm=False)
            times.append(time.perf_counter() - t)
        new = [(k, r) for ph, k, r in compiled if ph == name]
        again = [(k, r) for ph, k, r in compiled if ph == f"{name} (again)"]
        rows.append(dict(scenario=name, first_s=times[0], second_s=times[1], compiled=new, compiled_again=again))
    llm.close()
    # NOTE: the hook sees this process only; tensor-parallel workers compile into the same cache directory
    late_files = sorted(set(cache_kernels(cache_dir)) - set(cached_at_start)) if not args.keep_cache else []
    print(f"# start-up {startup_s:.1f} s, {sum(ph == 'start-up' for ph, _, _ in compiled)} kernels compiled "
          f"(triton {triton.__version__})")
    print(f"{'scenario':55s} {'first s':>8s} {'again s':>8s} {'compiled':>8s}")
    for r in rows:
        print(f"{r['scenario']:55s} {r['first_s']:8.3f} {r['second_s']:8.3f} "
              f"{len(r['compiled']):5d}{'+' + str(len(r['compiled_again'])) if r['compiled_again'] else ''}")
    for r in rows:
        for k, spec in r["compiled"] + r["compiled_again"]:
            earlier = [sp for ph, kk, sp in compiled if kk == k and sp is not spec]
            print(f"  [{r['scenario']}] {k}: {what_differs(spec, earlier)}")
    total = sum(len(r["compiled"]) + len(r["compiled_again"]) for r in rows)
    print(f"# kernels compiled after start-up: {total} in this process; "
          f"{len(late_files)} new in the Triton cache (any process){': ' if late_files else ''}"
          f"{', '.join(name for _, name in late_files)}")
    result = dict(model=args.model, startup_s=startup_s, scenarios=rows, lazy_compiles=total,
                  late_cache_kernels=[name for _, name in late_files])
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=1)
    return result


def cache_kernels(cache_dir: str | None) -> list[tuple[str, str]]:
    """(cache entry, kernel name) of every compiled kernel in a Triton cache directory."""
    if not cache_dir or not os.path.isdir(cache_dir):
        return []
    found = []
    for entry in sorted(os.listdir(cache_dir)):
        for f in os.listdir(os.path.join(cache_dir, entry)):
            if f.endswith(".json") and not f.startswith("__grp__"):
                found.append((entry, f[: -len(".json")]))
    return found


def specialisation(compile: dict) -> dict:
    """{argument name or option: its specialisation} from the hook's ``specialization_data`` (Triton 3.4+)."""
    try:
        data = json.loads(compile["specialization_data"])
    except (KeyError, TypeError, ValueError):
        return {"?": str(compile.get("key"))}
    names = list(data.get("signature", {}))
    spec = {n: str(t) for n, t in data.get("signature", {}).items() if t != "constexpr"}
    for key, val in zip(data.get("constant_keys", []), data.get("constant_vals", [])):
        name = names[key[0]] if key and key[0] < len(names) else str(key)
        spec[name] = f"= {val.get('constexpr', val) if isinstance(val, dict) else val}"
    for key, val in zip(data.get("attrs_keys", []), data.get("attrs_vals", [])):
        name = names[key[0]] if key and key[0] < len(names) else str(key)
        spec[name] = f"{spec.get(name, '')} {val}".strip()
    for opt in ("num_warps", "num_stages"):
        spec[opt] = str(data.get("options", {}).get(opt))
    return spec


def what_differs(spec: dict, earlier: list[dict]) -> str:
    """The entries of ``spec`` that differ from the closest earlier compile of the kernel (all if none)."""
    if not earlier:
        return "first compile: " + ", ".join(f"{k}: {v}" for k, v in spec.items())
    best = min(earlier, key=lambda e: sum(e.get(k) != v for k, v in spec.items()))
    diff = [f"{k}: {best.get(k)} -> {v}" for k, v in spec.items() if best.get(k) != v]
    return "; ".join(diff) or "same specialisation as an earlier compile"


def torch_sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1:])
