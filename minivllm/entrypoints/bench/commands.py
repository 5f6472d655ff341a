"""``minivllm bench {throughput,latency,serve}``: benchmark commands.

The ``minivllm`` CLI calls ``add_bench_parser(subparsers)``; the parsed namespace then carries
``func`` (call ``args.func(args)``; it returns an exit code). Without the CLI, run
``python -m minivllm.entrypoints.bench throughput ...``. Each command prints its result table
last and writes a JSON result with ``--json-out PATH``. Importing this module does not import torch.
"""

from __future__ import annotations

import argparse
import sys

from minivllm.entrypoints.bench import latency, serve, throughput
from minivllm.entrypoints.extras import missing_extra

COMMANDS = {"throughput": throughput, "latency": latency, "serve": serve}


#: what ``minivllm bench --help`` says (the module's docstring is for developers)
DESCRIPTION = """\
Benchmarks of minivllm, in vLLM's shape:

  minivllm bench throughput --model tiny-qwen3 --workload fixed-batch
  minivllm bench latency --model models/minivllm-demo-py --batch-size 8
  minivllm bench serve --base-url http://127.0.0.1:8000 --num-prompts 100

--model takes a checkpoint folder or a shipped config name (random weights of a real model's shapes). Each
command prints its result table last, --json-out PATH also writes it as JSON, and a progress bar shows on a
terminal (--disable-tqdm turns it off). `minivllm bench COMMAND --help` lists a command's flags."""


def add_bench_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``bench`` and its sub-commands to an argparse sub-parsers object; returns the ``bench`` parser."""
    p = subparsers.add_parser("bench", help="benchmarks: offline throughput, latency, online serving",
                              description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="bench_command", metavar="{throughput,latency,serve}")
    for mod in COMMANDS.values():
        mod.add_parser(sub)
    p.set_defaults(func=run_bench, bench_parser=p)
    return p


def run_bench(args: argparse.Namespace) -> int:
    """Run the chosen benchmark; prints help and returns 2 when no sub-command was given."""
    fn = getattr(args, "bench_func", None)
    if fn is None:
        args.bench_parser.print_help()
        return 2
    try:
        fn(args)
    except (ValueError, OSError) as exc:  # a bad flag, model or file, a server that never answered: one line
        sys.exit(f"minivllm bench {args.bench_command}: {exc}")
    except ModuleNotFoundError as exc:  # bench serve's HTTP client comes with the server extra
        message = missing_extra(exc, f"bench {args.bench_command}", ("server",))
        if message is None:
            raise
        sys.exit(message)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m minivllm.entrypoints.bench ...``: ``minivllm bench ...`` without the CLI."""
    parser = argparse.ArgumentParser(prog="minivllm")
    add_bench_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", *(argv if argv is not None else sys.argv[1:])])
    return args.func(args)


__all__ = ["add_bench_parser", "run_bench", "main", "COMMANDS"]
