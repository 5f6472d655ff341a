"""The ``minivllm`` command: ``serve`` (OpenAI-compatible server), ``generate`` (one-shot), ``bench``.

    minivllm serve [MODEL] [--host 127.0.0.1] [--port 8000] [--served-model-name NAME] [engine flags]
    minivllm generate [MODEL] --prompt "def f(" --max-tokens 32 --temperature 0
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from minivllm.entrypoints.defaults import DEFAULT_MODEL

# (flag, Config field, type, help); every flag defaults to None = "the engine's default".
ENGINE_FLAGS = [
    ("--max-model-len", "max_model_len", int, "longest prompt + output, in tokens"),
    ("--max-num-seqs", "max_num_seqs", int, "most sequences in one step"),
    ("--max-num-batched-tokens", "max_num_batched_tokens", int, "token budget of one step"),
    ("--kvcache-block-size", "kvcache_block_size", int, "tokens per KV cache block (16..256, power of 2)"),
    ("--num-kvcache-blocks", "num_kvcache_blocks", int, "KV cache blocks (default: sized from free memory)"),
    ("--gpu-memory-utilization", "gpu_memory_utilization", float, "fraction of GPU memory to use"),
    ("--cpu-kvcache-space-gib", "cpu_kvcache_space_gib", float, "cap on the CPU KV cache, GiB"),
    ("--tensor-parallel-size", "tensor_parallel_size", int, "GPUs to shard the model over"),
    ("--device", "device", str, "cpu or cuda (default: cuda if available)"),
    ("--dtype", "dtype", str, "float32, float16 or bfloat16 (default: the checkpoint's)"),
    ("--seed", "seed", int, "random seed of the engine"),
    ("--load-format", "load_format", str, "auto, safetensors or dummy (random weights)"),
    ("--attention-backend", "attention_backend", str, "torch or triton"),
    ("--kv-cache-dtype", "kv_cache_dtype", str, "auto (the model's dtype) or fp8 (e4m3: half the KV bytes)"),
    ("--max-num-partial-prefills", "max_num_partial_prefills", int, "prompts prefilled in chunks at once"),
    ("--max-long-partial-prefills", "max_long_partial_prefills", int, "long prompts prefilled at once"),
    ("--long-prefill-threshold", "long_prefill_threshold", int, "per-step cap on one prompt's chunk"),
]
BOOL_FLAGS = [
    ("--enforce-eager", "enforce_eager", "no CUDA graphs"),
    ("--enable-prefix-caching", "enable_prefix_caching", "share KV blocks of common prompt prefixes"),
    ("--enable-chunked-prefill", "enable_chunked_prefill", "split long prompts over steps"),
    ("--async-scheduling", "async_scheduling", "launch step N+1 before step N's tokens reach the host (GPU default)"),
]


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """Add the model argument and the engine flags (shared by serve, generate and bench)."""
    parser.add_argument("model", nargs="?", default=None,
                        help=f"checkpoint folder (default: {DEFAULT_MODEL})")
    group = parser.add_argument_group("engine")
    for flag, dest, typ, help in ENGINE_FLAGS:
        group.add_argument(flag, dest=dest, type=typ, default=None, help=help)
    group.add_argument("-tp", dest="tensor_parallel_size", type=int, default=None, help=argparse.SUPPRESS)
    for flag, dest, help in BOOL_FLAGS:
        group.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=None, help=help)


def engine_kwargs(args: argparse.Namespace) -> dict:
    """The engine keyword arguments the user set on the command line."""
    names = [dest for _, dest, _, _ in ENGINE_FLAGS] + [dest for _, dest, _ in BOOL_FLAGS]
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def resolve_model(args: argparse.Namespace) -> str:
    """``args.model`` or DEFAULT_MODEL; exits with a clear message if the folder is missing."""
    model = args.model or DEFAULT_MODEL
    if args.model is None and getattr(args, "served_model_name", None) is None:
        args.served_model_name = os.path.basename(DEFAULT_MODEL)  # "minivllm-demo-py", not a path
    if not os.path.isdir(model):
        hint = (" (train the demo model with `python scripts/train_demo_model.py --out models/minivllm-demo-py`,"
                " or pass a checkpoint folder)" if args.model is None else "")
        sys.exit(f"minivllm: model folder not found: {model}{hint}")
    args.model = model
    return model


def _serve(args: argparse.Namespace) -> int:
    resolve_model(args)
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from minivllm.entrypoints.openai_server import run_server

    return run_server(args)


def _generate(args: argparse.Namespace) -> int:
    resolve_model(args)
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
    parser = argparse.ArgumentParser(prog="minivllm", description="A small LLM inference engine.")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="start the OpenAI-compatible server")
    add_engine_args(serve)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--served-model-name", default=None, help="the model name clients use (default: MODEL)")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.set_defaults(func=_serve)

    gen = sub.add_parser("generate", help="generate a completion of a prompt and print it")
    add_engine_args(gen)
    gen.add_argument("--prompt", action="append", required=True, help="the prompt (repeat for several)")
    gen.add_argument("--max-tokens", type=int, default=32)
    gen.add_argument("--temperature", type=float, default=1.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=-1)
    gen.add_argument("--stop", action="append", default=None, help="a stop string (repeat for several)")
    gen.add_argument("--sampling-seed", type=int, default=None, help="seed of the sampling")
    gen.set_defaults(func=_generate)

    try:  # written separately; the cli works before it lands
        from minivllm.entrypoints.bench import add_bench_parser
    except ImportError:
        pass
    else:
        add_bench_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``minivllm`` console script."""
    args = build_parser().parse_args(argv)
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
