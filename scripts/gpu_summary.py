"""Print one table from the JSON results that scripts/gpu_check.sh wrote (ours, vLLM, ratio, target)."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(folder: str) -> None:
    rows = []
    for path in sorted(Path(folder).glob("*.json")):
        r = json.loads(path.read_text())
        if r.get("benchmark") == "latency":
            rows.append((path.stem, r.get("device_name", "?"), "TPOT ms (median)", r["tpot_ms"]["median"],
                         None, None, f"TTFT median {r['ttft_ms']['median']:.2f} ms"))
            continue
        if "results" in r and r["results"] and "pdl_off_us" in r["results"][0]:  # bench_pdl.py
            for x in r["results"]:
                rows.append((f"{path.stem} rows={x['rows']}", "?", "step us PDL on", x["pdl_on_us"], None, None,
                             f"PDL off {x['pdl_off_us']:.1f} us ({x['layers']} layers)"))
            continue
        if "results" in r and isinstance(r["results"], list):  # tp_scaling.py
            for x in r["results"]:
                if "error" not in x:
                    rows.append((f"{path.stem} TP={x['tp']}", "?", "output tok/s", x["throughput_tok_s"], None, None,
                                 f"{x['ms_per_token']:.2f} ms/token one request"))
            continue
        if r.get("benchmark") != "throughput":
            if "hf_output_tok_s" in r or "output_tok_s" in r:
                rows.append((path.stem, r.get("device_name", "?"), "transformers tok/s",
                             r.get("hf_output_tok_s", r.get("output_tok_s")), None, None, None))
            continue
        one = r["workload"] == "one-request"
        ours = r["ms_per_token"] if one else r["output_tok_s"]
        ref = r.get("reference") or {}
        runs = ", ".join(f"{x['ms_per_token' if one else 'output_tok_s']:.2f}" for x in r.get("runs", []))
        sync = " (sync)" if (r.get("engine_args") or {}).get("async_scheduling") is False else ""
        model = r.get("model_name") or r.get("model")
        variant = path.stem.removeprefix(f"var_{model}_") if path.stem.startswith(f"var_{model}_") else ""
        rows.append((f"{model} {r['workload']}{sync}{' ' + variant if variant else ''}", r.get("device_name", "?"),
                     "ms/token" if one else "output tok/s", ours, ref.get("vllm"), ref.get("target"), runs))
    print("\n== summary ==")
    print(f"{'workload':<34} {'metric':<20}{'ours':>10}{'vLLM':>10}{'target':>10}  runs")
    for name, _dev, metric, ours, vllm, target, runs in rows:
        f = lambda v: f"{v:>10.2f}" if isinstance(v, (int, float)) else f"{'-':>10}"
        print(f"{name:<34} {metric:<20}{f(ours)}{f(vllm)}{f(target)}  {runs or ''}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/gpu_check")
