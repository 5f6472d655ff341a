"""The ``minivllm`` command: ``serve`` (OpenAI-compatible server), ``generate`` (one-shot), ``bench``.

    minivllm serve MODEL [--host 127.0.0.1] [--port 8000] [--served-model-name NAME] [engine flags]
    minivllm serve MODEL --enable-lora --lora-modules NAME=PATH ... [--enable-lora-runtime-updates]
    minivllm generate MODEL --prompt "def f(" --max-tokens 32 --temperature 0
    minivllm bench {throughput,latency,serve} ...
    minivllm --version

What ``serve`` needs beyond the default install is an extra of the package (``pyproject.toml``); a missing one
ends the command with one line that names it and the command that installs it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from minivllm import __version__
from minivllm.entrypoints.args import HelpFormatter, add_model_args, add_serve_args, engine_kwargs
from minivllm.entrypoints.extras import missing_extra


def check_model(args: argparse.Namespace) -> str:
    """``args.model``, or exit with a clear message if that folder does not exist."""
    if not os.path.isdir(args.model):
        sys.exit(f"minivllm: model folder not found: {args.model}")
    return args.model


def check_lora_flags(config, kwargs: dict, on_ray: bool) -> None:
    """ValueError naming the flag when the server's LoRA flags cannot work with the engine's."""
    for name, given in (("lora_modules", bool(config.lora_modules)),
                        ("enable_lora_runtime_updates", config.enable_lora_runtime_updates)):
        if given and not kwargs.get("enable_lora"):
            raise ValueError(f"{name} needs enable_lora (--enable-lora)")
        if given and on_ray:
            raise ValueError(f"{name}: LoRA adapters are served by one engine only for now, not with "
                             f"--data-parallel-size or autoscaling")


def _serve(args: argparse.Namespace) -> int:
    """One engine behind the OpenAI server, or (``--data-parallel-size N`` > 1, or autoscaling) engine replicas
    behind it on Ray Serve."""
    check_model(args)
    logging.basicConfig(level=getattr(logging, (args.log_level or "info").upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from minivllm.config.server import ServerConfig
    from minivllm.entrypoints.openai.reasoning import with_reasoning_markers

    on_ray = False
    try:
        config = ServerConfig.from_args(args)
        kwargs = with_reasoning_markers(engine_kwargs(args), config.reasoning_parser)
        ray = (args.data_parallel_size or 1) > 1 or config.autoscale_max_replicas is not None
        check_lora_flags(config, kwargs, ray)
        if ray:
            on_ray = True
            from minivllm.scale_out.serve.app import run_ray_server

            return run_ray_server(args.model, kwargs, config)
        from minivllm.config import Config
        from minivllm.entrypoints.openai.api_server import run_server

        Config.create(args.model, **kwargs)  # a bad engine flag: one line now, not a failed engine thread later
        return run_server(args.model, kwargs, config)
    except ValueError as exc:  # a bad flag: the message names it
        sys.exit(f"minivllm: {exc}")
    except ModuleNotFoundError as exc:  # an extra that is not installed: one line, no traceback
        message = (missing_extra(exc, "serve --data-parallel-size N", ("server", "ray")) if on_ray
                   else missing_extra(exc, "serve", ("server",)))
        if message is None:
            raise
        sys.exit(message)


def _generate(args: argparse.Namespace) -> int:
    """Complete each prompt and print it."""
    check_model(args)
    from minivllm import LLM, SamplingParams

    try:
        params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                                max_tokens=args.max_tokens, stop=args.stop, seed=args.sampling_seed)
        with LLM(args.model, **engine_kwargs(args)) as llm:
            outputs = llm.generate(args.prompt, params, use_tqdm=False)
    except ValueError as exc:
        sys.exit(f"minivllm: {exc}")
    for i, (prompt, out) in enumerate(zip(args.prompt, outputs)):
        if len(outputs) > 1:
            print(f"--- {i}")
        print(prompt + out["text"])
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``minivllm`` argument parser with all its subcommands."""
    from minivllm.entrypoints.bench.commands import add_bench_parser

    parser = argparse.ArgumentParser(prog="minivllm", description="A small LLM inference engine.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="start the OpenAI-compatible server", formatter_class=HelpFormatter,
                           description="Serve MODEL through an OpenAI-compatible HTTP API (/v1/completions,\n"
                                       "/v1/chat/completions, ...). Needs the server extra: pip install -e \".[server]\";\n"
                                       "--data-parallel-size N > 1 needs the ray extra too: pip install -e \".[server,ray]\".")
    add_serve_args(serve)
    serve.set_defaults(func=_serve)

    gen = sub.add_parser("generate", help="generate a completion of a prompt and print it",
                         formatter_class=HelpFormatter, description="Complete each --prompt with MODEL and print it.")
    add_model_args(gen)
    gen.add_argument("--prompt", action="append", required=True, help="the prompt (repeat for several)")
    gen.add_argument("--max-tokens", type=int, default=32, help="tokens to generate per prompt, at most")
    gen.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (0: greedy)")
    gen.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: the smallest set of tokens "
                                                              "whose probabilities add up to this")
    gen.add_argument("--top-k", type=int, default=-1, help="sample among the k most likely tokens (-1: all)")
    gen.add_argument("--stop", action="append", default=None, help="a stop string (repeat for several)")
    gen.add_argument("--sampling-seed", type=int, default=None, help="seed of the sampling")
    gen.set_defaults(func=_generate)

    add_bench_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``minivllm`` console script."""
    args = build_parser().parse_args(argv)
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
