"""Train the small demo model shipped with minivllm: a byte-level BPE tokenizer and a tiny Qwen3.

The training text is the Python standard library's own source code (the stdlib of the Python that
runs this script), so nothing has to be downloaded. A few whole packages are held out and never
trained on; the held-out loss is reported next to a unigram baseline. The result is a regular
Hugging Face checkpoint folder (bf16 ``model.safetensors``, ``config.json``, tokenizer files with a
ChatML chat template) plus a model card, a JSON training log and a PNG of the loss curve.

Typical use (GPU)::

    python scripts/train_demo_model.py --out models/minivllm-demo-py

Training stops at the first of ``--max-epochs`` (default 10 passes over the ~3M training tokens,
about 830 steps, well under a minute on an H100/H200: more epochs overfit this small corpus),
``--max-steps`` and the ``--minutes`` time budget (default 6; after 30 steps the step time is
measured and the cosine schedule is fitted to whichever limit comes first).

A short CPU smoke run::

    python scripts/train_demo_model.py --out /tmp/demo --device cpu --max-steps 40 --minutes 0 \\
        --max-files 50 --vocab-size 1000 --hidden-size 64 --layers 2 --heads 4 --kv-heads 2 \\
        --head-dim 16 --intermediate-size 192 --seq-len 128 --batch-size 8 --threads 1
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # NOTE: scripts/ is not a package
from demo_model.batches import eval_windows, evaluate_windows, unigram_cross_entropy  # noqa: E402
from demo_model.constants import (  # noqa: E402
    EXCLUDED_DIRS,
    HELD_OUT_PACKAGES,
    MAX_FOLDER_MB,
    PERIODIC_EVAL_WINDOWS,
    PROMPTS,
)
from demo_model.corpus import encode_stream, load_corpus, train_tokenizer  # noqa: E402
from demo_model.modeling import build_config, count_parameters  # noqa: E402
from demo_model.report import (  # noqa: E402
    device_name,
    folder_mb,
    greedy_samples,
    load_checkpoint,
    model_card,
    plot_loss,
    print_summary,
    save_checkpoint,
)
from demo_model.training import train, warmup_steps  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line (``argv`` excludes the program name; ``None`` means ``sys.argv``)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="models/minivllm-demo-py", help="output checkpoint folder")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--minutes",
        type=float,
        default=6.0,
        help="time budget of the training loop in minutes (0: no time limit)",
    )
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many optimizer steps")
    p.add_argument(
        "--max-epochs",
        type=float,
        default=10.0,
        help="stop after this many passes over the training tokens (0: no epoch limit); the data is "
        "only ~3M tokens: on an H200 the held-out loss was lowest near 9 epochs and rose after",
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument(
        "--max-files",
        type=int,
        default=None,
        help="use only the first N training files and the first max(1, N // 10) held-out files",
    )
    # data / optimisation
    p.add_argument("--batch-size", type=int, default=64, help="sequences per optimizer step")
    p.add_argument("--seq-len", type=int, default=512, help="tokens per training sequence")
    p.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    p.add_argument("--min-lr-ratio", type=float, default=0.1, help="final lr as a fraction of the peak")
    p.add_argument("--warmup-steps", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument(
        "--dropout",
        type=float,
        default=0.1,
        help="residual dropout on attention/MLP outputs while training (the data is small)",
    )
    # model / tokenizer sizes
    p.add_argument(
        "--vocab-size",
        type=int,
        default=4000,
        help="tokenizer vocab (incl. special tokens); the model's is rounded up to a multiple of 64",
    )
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--intermediate-size", type=int, default=768)
    # logging / evaluation
    p.add_argument("--log-every", type=int, default=25, help="print the train loss every N steps")
    p.add_argument(
        "--eval-every",
        type=int,
        default=50,
        help=f"held-out loss on {PERIODIC_EVAL_WINDOWS} windows every N steps (0: only at the end)",
    )
    p.add_argument("--eval-windows", type=int, default=256, help="held-out windows for the final evaluation")
    p.add_argument("--sample-tokens", type=int, default=48, help="max_new_tokens of the greedy samples")
    return p.parse_args(argv)


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def main(argv: list[str] | None = None) -> dict:
    """Run the whole pipeline; returns the dict that is also written to ``train_log.json``."""
    import transformers
    from transformers import Qwen3ForCausalLM
    from transformers.utils import logging as hf_logging

    t0 = time.perf_counter()
    args = parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    hf_logging.disable_progress_bar()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 for the few float32 matmuls outside autocast
    out = Path(args.out)
    print(
        f"Python {sys.version}\ntorch {torch.__version__}, transformers {transformers.__version__}, "
        f"device {device_name(device)}",
        flush=True,
    )
    seed_everything(args.seed)

    corpus = load_corpus(args.max_files)
    print(
        f"[data] stdlib {corpus.root}: {len(corpus.train_files)} training files, "
        f"{len(corpus.held_files)} held-out files ({', '.join(HELD_OUT_PACKAGES)})",
        flush=True,
    )
    tokenizer = train_tokenizer(corpus.train_texts, args.vocab_size)
    train_tokens = encode_stream(tokenizer, corpus.train_texts)
    held_tokens = encode_stream(tokenizer, corpus.held_texts)
    print(
        f"[data] tokenizer vocab {len(tokenizer)}; {len(train_tokens):,} training tokens, "
        f"{len(held_tokens):,} held-out tokens ({sum(map(len, corpus.train_texts)) / len(train_tokens):.2f} "
        f"chars/token); {time.perf_counter() - t0:.1f}s so far",
        flush=True,
    )

    config = build_config(args, tokenizer)
    torch.manual_seed(args.seed)
    model = Qwen3ForCausalLM(config).to(device)
    n_params, n_non_emb = count_parameters(model)
    print(
        f"[model] {n_params:,} parameters ({n_non_emb:,} non-embedding), vocab {config.vocab_size}",
        flush=True,
    )

    final_windows = eval_windows(held_tokens, args.seq_len, args.eval_windows)
    periodic = final_windows[
        torch.linspace(0, len(final_windows) - 1, min(PERIODIC_EVAL_WINDOWS, len(final_windows))).long()
    ]
    result = train(model, train_tokens.to(device), periodic.to(device), args, device)

    save_checkpoint(model, tokenizer, out)
    del model
    model, tokenizer = load_checkpoint(out, device)
    train_windows = eval_windows(train_tokens, args.seq_len, len(final_windows))
    held = evaluate_windows(model, final_windows, args.batch_size, device)
    on_train = evaluate_windows(model, train_windows, args.batch_size, device)
    heldout_loss, train_window_loss = held["loss"], on_train["loss"]
    unigram = unigram_cross_entropy(train_tokens, final_windows[:, 1:], len(tokenizer))
    print(
        f"[eval]  saved checkpoint: held-out {heldout_loss:.4f}, training windows {train_window_loss:.4f}, "
        f"unigram baseline {unigram:.4f} nats/token",
        flush=True,
    )
    samples = greedy_samples(model, tokenizer, PROMPTS, args.sample_tokens, device)
    plot_loss(result.history, result.evals, unigram, out / "loss_curve.png")

    log = {
        "out": str(out),
        "command": "python scripts/train_demo_model.py " + shlex.join(argv),
        "args": vars(args),
        "python_version": sys.version,
        "python_version_short": platform.python_version(),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "data": {
            "stdlib_root": str(corpus.root),
            "held_out_packages": list(HELD_OUT_PACKAGES),
            "excluded_dirs": sorted(EXCLUDED_DIRS),
            "train_files": len(corpus.train_files),
            "held_files": len(corpus.held_files),
            "train_chars": sum(map(len, corpus.train_texts)),
            "train_tokens": len(train_tokens),
            "held_tokens": len(held_tokens),
        },
        "model": {
            "parameters": n_params,
            "non_embedding_parameters": n_non_emb,
            "tokenizer_vocab": len(tokenizer),
            "model_vocab": config.vocab_size,
            "eos_token_id": tokenizer.eos_token_id,
            "hidden_size": args.hidden_size,
            "layers": args.layers,
            "heads": args.heads,
            "kv_heads": args.kv_heads,
            "head_dim": args.head_dim,
            "intermediate_size": args.intermediate_size,
        },
        "training": {
            "device": device_name(device),
            "steps": result.steps,
            "seconds": result.seconds,
            "tokens_seen": result.tokens_seen,
            "epochs": result.epochs,
            "stop_reason": result.stop_reason,
            "batch_size": args.batch_size,
            "seq_len": args.seq_len,
            "lr": args.lr,
            "min_lr_ratio": args.min_lr_ratio,
            "warmup_steps": warmup_steps(result.planned_steps, args),
            "weight_decay": args.weight_decay,
            "dropout": args.dropout,
            "final_train_loss": result.history[-1]["loss"],
            "history": result.history,
            "periodic_evals": result.evals,
        },
        "eval": {
            "windows": len(final_windows),
            "target_tokens": final_windows[:, 1:].numel(),
            "heldout_loss": heldout_loss,
            "heldout_top1_acc": held["top1_acc"],
            "heldout_top1_prob": held["top1_prob"],
            "train_window_loss": train_window_loss,
            "train_window_top1_acc": on_train["top1_acc"],
            "train_window_top1_prob": on_train["top1_prob"],
            "unigram_baseline": unigram,
            "unigram_vocab": len(tokenizer),
        },
        "sample_tokens": args.sample_tokens,
        "samples": samples,
    }
    log["folder_mb"] = folder_mb(out)  # refreshed below once the card and the log exist
    (out / "README.md").write_text(model_card(log))
    log["wall_seconds"] = time.perf_counter() - t0
    (out / "train_log.json").write_text(json.dumps(log, indent=2) + "\n")
    log["folder_mb"] = folder_mb(out)

    print(f"\nGreedy samples (max_new_tokens={args.sample_tokens}):")
    for s in samples:
        print(f"--- {s['prompt']!r}\n{s['prompt']}{s['completion']}")
    if log["folder_mb"] > MAX_FOLDER_MB:
        print(f"WARNING: {out} is {log['folder_mb']:.1f} MB, over the {MAX_FOLDER_MB} MB limit")
    print_summary(log)
    return log


if __name__ == "__main__":
    main()
