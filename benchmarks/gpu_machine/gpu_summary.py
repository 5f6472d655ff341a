"""Print one table from the JSON results that benchmarks/gpu_machine/gpu_check.sh wrote.

Throughput results (``minivllm bench throughput``) get the vLLM 0.24.0 reference of benchmarks/lib/reference.py
beside them; ``compare`` pairs (``cmp_<model>_<workload>_{before,after}.json``) get the change in percent.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from reference import lookup  # noqa: E402


def metric(r: dict) -> tuple[str, float, list[float]]:
    """``(name, median, every run)`` of a throughput result: ms/token for one request, else output tok/s."""
    key = "ms_per_token" if r.get("workload") == "one-request" else "output_tok_s"
    return key, r[key], [x[key] for x in r.get("runs", [])]


def rows_of(folder: Path) -> tuple[list[tuple], list[tuple]]:
    plain, pairs = [], {}
    for path in sorted(folder.glob("*.json")):
        r = json.loads(path.read_text())
        if path.stem.startswith("cmp_") and r.get("benchmark") == "throughput":
            base, side = path.stem.rsplit("_", 1)
            pairs.setdefault(base.removeprefix("cmp_"), {})[side] = r
            continue
        if r.get("benchmark") == "latency":
            plain.append((path.stem, "TPOT ms (median)", r["tpot_ms"]["median"], None, ""))
        elif r.get("benchmark") == "throughput":
            key, med, runs = metric(r)
            ref = lookup(r.get("device_name"), (r.get("engine_args") or {}).get("tensor_parallel_size", 1),
                         r.get("model_name"), r["workload"]) if not r.get("sizes_overridden") else None
            plain.append((f"{r.get('model_name') or r.get('model')} {r['workload']}", key, med,
                          ref.vllm if ref else None, ", ".join(f"{x:.2f}" for x in runs)))
        elif isinstance(r.get("results"), list):  # tp_scaling.py
            for x in r["results"]:
                if "error" not in x:
                    plain.append((f"{path.stem} TP={x['tp']}", "output tok/s", x["throughput_tok_s"], None,
                                  f"{x['ms_per_token']:.2f} ms/token one request"))
    compared = []
    for name, sides in sorted(pairs.items()):
        if {"before", "after"} <= sides.keys():
            key, before, b_runs = metric(sides["before"])
            _, after, a_runs = metric(sides["after"])
            change = 100 * (after - before) / before
            compared.append((name, key, before, after, change, b_runs, a_runs))
    return plain, compared


def main(folder: str) -> None:
    plain, compared = rows_of(Path(folder))
    fmt = lambda v: f"{v:>10.2f}" if isinstance(v, (int, float)) else f"{'-':>10}"  # noqa: E731
    print("\n== summary ==")
    print(f"{'workload':<34} {'metric':<18}{'minivllm':>10}{'vLLM':>10}  runs")
    for name, key, ours, vllm, runs in plain:
        print(f"{name:<34} {key:<18}{fmt(ours)}{fmt(vllm)}  {runs}")
    if compared:
        print("\n== before / after (medians; change in %, + means a larger figure) ==")
        print(f"{'model workload':<28} {'metric':<14}{'before':>10}{'after':>10}{'change':>9}  runs before | after")
        for name, key, before, after, change, b_runs, a_runs in compared:
            print(f"{name:<28} {key:<14}{fmt(before)}{fmt(after)}{change:>+8.2f}%  "
                  f"{', '.join(f'{x:.2f}' for x in b_runs)} | {', '.join(f'{x:.2f}' for x in a_runs)}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/gpu_check")
