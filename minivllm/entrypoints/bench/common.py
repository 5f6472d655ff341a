"""Helpers shared by the benchmark commands: engine arguments, statistics, tables, JSON results."""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import os
import statistics
import sys
from pathlib import Path

import minivllm
from minivllm.entrypoints.args import HelpFormatter
from minivllm.entrypoints.args import add_engine_args as add_engine_flags
from minivllm.entrypoints.args import engine_kwargs as flag_kwargs
from minivllm.entrypoints.bench.models import canonical_name, resolve_model


def int_at_least(minimum: int):
    """An argparse ``type``: an integer no less than ``minimum`` (else argparse's one-line error naming the flag)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {value}")
        return value

    return parse


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """``--model`` plus the engine's flags (the engine's ``--seed`` excepted: here it seeds the workload)."""
    p.add_argument("--model", default="qwen3-0.6b",
                   help="a checkpoint folder or a shipped config name (qwen3-0.6b, qwen3-8b, qwen3-32b, "
                        "llama-3.1-8b, mistral-7b-v0.1, mistral-small-24b, qwen3-30b-a3b, tiny-qwen3, "
                        "tiny-qwen3-moe: dummy weights)")
    add_engine_flags(p, exclude=("seed",))
    p.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="an engine argument as KEY=VALUE (a Python literal), e.g. long_prefill_threshold=2048")
    p.add_argument("--seed", type=int, default=0, help="Python random seed of the workload")
    add_output_args(p)


def add_output_args(p: argparse.ArgumentParser) -> None:
    """``--json-out`` and ``--disable-tqdm``, which every benchmark command takes."""
    p.add_argument("--json-out", default=None, help="write the result as JSON to this path")
    p.add_argument("--disable-tqdm", action="store_true",
                   help="no progress bar (there is none either when stderr is not a terminal)")


def show_progress(args: argparse.Namespace) -> bool:
    """Whether to draw progress bars (tqdm, on stderr): on a terminal, unless ``--disable-tqdm``."""
    return not getattr(args, "disable_tqdm", False) and sys.stderr.isatty()


def engine_kwargs(args: argparse.Namespace, **defaults) -> tuple[str, dict]:
    """Resolve ``--model`` and collect the engine kwargs (explicit flags > ``defaults`` > engine's)."""
    path, hint = resolve_model(args.model)
    kw = {k: v for k, v in defaults.items() if v is not None}
    if hint:
        kw["load_format"] = hint
    kw.update({k: v for k, v in flag_kwargs(args).items() if k != "seed"})
    from minivllm.config import Config

    names = Config.engine_arg_names()
    for item in getattr(args, "engine_arg", []) or []:
        key, eq, raw = item.partition("=")
        key = key.strip()
        if not eq or key not in names:
            raise ValueError(f"engine_arg: {item!r} is not KEY=VALUE with KEY an engine argument (the engine "
                             "flags of --help, with _ for -)")
        try:
            kw[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            kw[key] = raw
    return path, kw


def model_config(path: str) -> dict:
    """The checkpoint's ``config.json`` as a dict."""
    with open(os.path.join(path, "config.json")) as f:
        return json.load(f)


def vocab_limit(path: str, hi: int = 10000) -> int:
    """Largest random token id to use: ``hi``, capped at the model's vocabulary."""
    return min(hi, model_config(path)["vocab_size"] - 1)


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), no numpy needed."""
    if not values:
        return float("nan")
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summary(values: list[float], scale: float = 1.0) -> dict:
    """mean / median / p99 / min / max of ``values`` times ``scale`` (e.g. 1000 for seconds -> ms)."""
    if not values:
        return {"mean": float("nan"), "median": float("nan"), "p99": float("nan")}
    v = [x * scale for x in values]
    return {"mean": statistics.fmean(v), "median": statistics.median(v), "p99": percentile(v, 99),
            "min": min(v), "max": max(v)}


def device_name(device: str | None = None) -> str:
    """``torch.cuda.get_device_name()`` on a GPU run, else ``"cpu"``."""
    if device == "cpu":
        return "cpu"
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name()
    except Exception:  # noqa: BLE001
        pass
    return "cpu"


def metadata(args: argparse.Namespace, path: str, kw: dict) -> dict:
    """Fields every JSON result carries."""
    return {"model": args.model, "model_name": canonical_name(args.model) or canonical_name(path),
            "model_path": path, "engine_args": kw, "device_name": device_name(kw.get("device")),
            "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "version": minivllm.__version__}


def write_json(path: str | None, result: dict) -> None:
    """Write ``result`` as JSON to ``path`` (nothing when ``path`` is None)."""
    if not path:
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=2, default=str)
    print(f"wrote {path}")


def fmt(v) -> str:
    """A table cell: floats with thousands separators, NaN as "-"."""
    if isinstance(v, float):
        if v != v:
            return "-"
        return f"{v:,.2f}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def print_table(title: str, header: list[str], rows: list[list]) -> None:
    """A plain aligned text table."""
    cells = [[fmt(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(header)]
    print(f"\n== {title} ==")
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip())
    print("  ".join("-" * w for w in widths))
    for raw, r in zip(rows, cells):
        print("  ".join(c.rjust(w) if isinstance(v, (int, float)) else c.ljust(w)
                        for v, c, w in zip(raw, r, widths)).rstrip())


def description(doc: str) -> str:
    """A command module's docstring as its ``--help`` text: without the reStructuredText quotes."""
    return doc.replace("``", "")


def register(subparsers, name: str, help: str, doc: str, add_arguments, run) -> argparse.ArgumentParser:
    """Add ``minivllm bench NAME``: its arguments, and ``run`` as the function to call."""
    p = subparsers.add_parser(name, help=help, description=description(doc), formatter_class=HelpFormatter)
    add_arguments(p)
    p.set_defaults(bench_func=run)
    return p


def standalone(name: str, doc: str, add_arguments, run, argv: list[str] | None = None) -> dict:
    """Parse ``argv`` as ``minivllm bench NAME`` would and run it (``python -m ...`` entry points)."""
    p = argparse.ArgumentParser(prog=f"minivllm bench {name}", description=description(doc),
                                formatter_class=HelpFormatter)
    add_arguments(p)
    return run(p.parse_args(argv))


def spec_decode_rows(result: dict) -> list[list]:
    """Table rows of a result's ``speculative_decoding`` entry (none without speculative decoding)."""
    spec = result.get("speculative_decoding")
    if not spec:
        return []
    return [["spec decode: drafts / draft tokens", f"{spec['num_drafts']} / {spec['num_draft_tokens']}"],
            ["spec decode: acceptance rate", spec["acceptance_rate"]],
            ["spec decode: mean acceptance length", spec["mean_acceptance_length"]],
            ["spec decode: acceptance per position", ", ".join(fmt(r) for r in spec["acceptance_rate_per_pos"])]]
