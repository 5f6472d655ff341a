"""Plot benchmark JSON results (the ``--json-out`` files of a folder) as PNGs with matplotlib (Agg).

- ``throughput_vs_batch.png``: output tok/s vs batch size, one line per ``throughput_vs_batch.py``
  result (and its transformers line when run with ``--hf``), plus points from ``hf_baseline.py``
  and fixed-batch ``bench throughput`` results.
- ``latency_vs_rate.png``: TTFT and TPOT (median solid, p99 dashed) vs request rate from
  ``bench serve`` results, one line per label (model); rate ``inf`` is drawn right of the rest.

    python benchmarks/engine/plot.py runs/ --out-dir runs/plots
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path


def load_results(folder: Path) -> list[dict]:
    out = []
    for f in sorted(folder.glob("*.json")):
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and "benchmark" in data:
            data["_file"] = f.name
            out.append(data)
    return out


def _who(r: dict) -> str:
    return f"{r.get('model_name') or r.get('model')} ({r.get('device_name', '?')})"


def plot_throughput(results: list[dict], out: Path, plt) -> bool:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    drawn = False
    for r in results:
        if r["benchmark"] == "throughput_vs_batch" and r.get("results"):
            rows = sorted(r["results"], key=lambda x: x["batch_size"])
            xs = [x["batch_size"] for x in rows]
            ax.plot(xs, [x["output_tok_s"] for x in rows], "o-", label=f"minivllm {_who(r)}")
            if all("hf_output_tok_s" in x for x in rows):
                ax.plot(xs, [x["hf_output_tok_s"] for x in rows], "s--", label=f"transformers {_who(r)}")
            drawn = True
        elif r["benchmark"] == "hf_baseline":
            ax.plot([r["batch_size"]], [r["hf_output_tok_s"]], "kx", label=f"transformers point {_who(r)}")
            if r.get("ours_output_tok_s"):
                ax.plot([r["batch_size"]], [r["ours_output_tok_s"]], "k^", label=f"minivllm point {_who(r)}")
            drawn = True
        elif r["benchmark"] == "throughput" and r.get("workload") == "fixed-batch":
            ax.plot([r["num_requests"]], [r["output_tok_s"]], "*", ms=10, label=f"bench throughput {_who(r)}")
            drawn = True
    if not drawn:
        plt.close(fig)
        return False
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size (requests)")
    ax.set_ylabel("output tokens / s")
    ax.set_title("Throughput vs batch size")
    return _finish(fig, [ax], out, plt)


def _finish(fig, axes, out: Path, plt) -> bool:
    """Grid and legend on each axis, then write the PNG and free the figure."""
    for ax in axes:
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return True


def plot_latency(results: list[dict], out: Path, plt) -> bool:
    series = defaultdict(list)
    for r in results:
        if r["benchmark"] == "serve" and r.get("completed"):
            series[r.get("label") or r.get("model")].append(r)
    if not series:
        return False
    finite = [float(r["request_rate"]) for rs in series.values() for r in rs if math.isfinite(float(r["request_rate"]))]
    inf_x = max(finite) * 1.5 if finite else 1.0
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for label, rs in sorted(series.items()):
        rs = sorted(rs, key=lambda r: float(r["request_rate"]))
        xs = [float(r["request_rate"]) if math.isfinite(float(r["request_rate"])) else inf_x for r in rs]
        for ax, key in zip(axes, ("ttft_ms", "tpot_ms")):
            line, = ax.plot(xs, [r[key]["median"] for r in rs], "o-", label=f"{label} median")
            ax.plot(xs, [r[key]["p99"] for r in rs], "o--", color=line.get_color(), alpha=0.6, label=f"{label} p99")
    for ax, name in zip(axes, ("TTFT (ms)", "TPOT (ms)")):
        ax.set_xlabel("request rate (req/s)" + ("; rightmost = inf" if any(
            not math.isfinite(float(r["request_rate"])) for rs in series.values() for r in rs) else ""))
        ax.set_ylabel(name)
        ax.set_title(f"{name} vs request rate")
    return _finish(fig, axes, out, plt)


def main(argv: list[str] | None = None) -> list[str]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results_dir", help="folder of benchmark JSON results")
    p.add_argument("--out-dir", default=None, help="where to write PNGs (default: results_dir)")
    p.add_argument("--json-out", default=None, help="write the list of plots written as JSON")
    args = p.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(args.results_dir)
    out_dir = Path(args.out_dir) if args.out_dir else folder
    out_dir.mkdir(parents=True, exist_ok=True)
    results = load_results(folder)
    written = []
    for name, fn in (("throughput_vs_batch.png", plot_throughput), ("latency_vs_rate.png", plot_latency)):
        if fn(results, out_dir / name, plt):
            written.append(str(out_dir / name))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"inputs": len(results), "plots": written}, indent=2))
    print(f"\n== plots from {len(results)} result file(s) in {folder} ==")
    for w in written or ["(no plottable results)"]:
        print(w)
    return written


if __name__ == "__main__":
    sys.exit(0 if main() is not None else 1)
