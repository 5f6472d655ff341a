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
import contextlib
import json
import math
import platform
import random
import shlex
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

HELD_OUT_PACKAGES = ("email", "json", "xml")
EXCLUDED_DIRS = frozenset({"site-packages", "test", "tests", "idlelib", "lib2to3"})
EOS_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = (EOS_TOKEN, "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
PROMPTS = ("def fibonacci(n):", "import os\n", "class Stack:", "for i in range(")
VOCAB_MULTIPLE = 64
CALIBRATION_STEPS = (10, 30)  # time steps [10, 30) to estimate how many steps fit the time budget
PERIODIC_EVAL_WINDOWS = 32
MAX_FOLDER_MB = 40


# ----------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------


@dataclass
class Corpus:
    """Source files of the stdlib, split into a training part and a held-out part."""

    root: Path
    train_files: list[Path]
    held_files: list[Path]
    train_texts: list[str] = field(repr=False)
    held_texts: list[str] = field(repr=False)


def stdlib_root() -> Path:
    """The directory of the running Python's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def is_held_out(rel: Path) -> bool:
    """Whether a stdlib file (path relative to the stdlib root) belongs to a held-out package."""
    return len(rel.parts) > 1 and rel.parts[0] in HELD_OUT_PACKAGES


def collect_files(root: Path) -> tuple[list[Path], list[Path]]:
    """All usable ``*.py`` files under ``root`` in sorted order, split into (train, held-out)."""
    train, held = [], []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if EXCLUDED_DIRS.intersection(rel.parts[:-1]):
            continue
        (held if is_held_out(rel) else train).append(path)
    return train, held


def read_texts(paths: list[Path]) -> tuple[list[Path], list[str]]:
    """Read files as UTF-8 and drop the empty ones; returns the kept paths and their texts."""
    kept, texts = [], []
    for path in paths:
        text = path.read_text(encoding="utf-8", errors="replace")
        if text.strip():
            kept.append(path)
            texts.append(text)
    return kept, texts


def load_corpus(max_files: int | None = None) -> Corpus:
    """Collect and read the training and held-out stdlib sources (optionally only a few files)."""
    root = stdlib_root()
    train, held = collect_files(root)
    if max_files is not None:
        train, held = train[:max_files], held[: max(1, max_files // 10)]
    train, train_texts = read_texts(train)
    held, held_texts = read_texts(held)
    if not train or not held:
        raise RuntimeError(f"no training or held-out files found under {root}")
    return Corpus(root, train, held, train_texts, held_texts)


# ----------------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------------


def train_tokenizer(texts: list[str], vocab_size: int):
    """Train a byte-level BPE on ``texts`` and wrap it as a ``PreTrainedTokenizerFast``.

    The BPE trainer is deterministic for a given input order. ``<|endoftext|>`` is both eos and
    pad; there is no bos. Decoding never "cleans up" spaces, so code round-trips exactly.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        additional_special_tokens=list(SPECIAL_TOKENS[1:]),  # transformers 5 renames it extra_special_tokens
        clean_up_tokenization_spaces=False,
        model_max_length=2048,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def save_tokenizer(tokenizer, out: Path) -> None:
    """``save_pretrained`` plus a tokenizer_config that transformers 4.x can read too."""
    tokenizer.save_pretrained(out)
    path = out / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    if "extra_special_tokens" in cfg:
        cfg["additional_special_tokens"] = cfg.pop("extra_special_tokens")
    path.write_text(json.dumps(cfg, indent=2) + "\n")


def encode_stream(tokenizer, texts: list[str]) -> torch.Tensor:
    """Tokenize every file and concatenate them, each followed by ``<|endoftext|>`` (int64 1-D)."""
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for enc in tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


# ----------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------


def round_up(n: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is >= ``n``."""
    return (n + multiple - 1) // multiple * multiple


def build_config(args: argparse.Namespace, tokenizer):
    """The Qwen3 config: tied embeddings, GQA, vocab padded to a multiple of 64."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=round_up(len(tokenizer), VOCAB_MULTIPLE),
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        max_position_embeddings=2048,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def count_parameters(model) -> tuple[int, int]:
    """(all parameters with tied weights counted once, parameters outside the embedding)."""
    total = sum(p.numel() for p in model.parameters())
    return total, total - model.get_input_embeddings().weight.numel()


def make_optimizer(model, args: argparse.Namespace, device: torch.device) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices (incl. the tied embedding), none on norm gains."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")


def add_residual_dropout(model, p: float) -> list:
    """Dropout on every attention and MLP output before it joins the residual stream.

    Qwen3 has no such dropout of its own; forward hooks add it for training only (they act only
    in ``train()`` mode and are not part of the saved checkpoint). Returns the hook handles.
    """

    def hook(module, inputs, output):
        if not module.training or p == 0:
            return output
        if isinstance(output, tuple):  # attention returns (output, weights)
            return (F.dropout(output[0], p, training=True), *output[1:])
        return F.dropout(output, p, training=True)

    layers = model.model.layers
    return [m.register_forward_hook(hook) for layer in layers for m in (layer.self_attn, layer.mlp)]


def warmup_steps(total: int | None, args: argparse.Namespace) -> int:
    """``--warmup-steps``, but at most a tenth of the run once its length is known."""
    return args.warmup_steps if total is None else min(args.warmup_steps, max(1, total // 10))


def lr_at(step: int, total: int | None, args: argparse.Namespace) -> float:
    """Linear warmup then cosine decay to ``min_lr_ratio * lr`` at ``total`` (warmup only if unknown)."""
    warmup = warmup_steps(total, args)
    if step < warmup:
        return args.lr * (step + 1) / warmup
    if total is None:
        return args.lr
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    floor = args.lr * args.min_lr_ratio
    return floor + (args.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def autocast_for(device: torch.device):
    """bf16 autocast on CUDA; plain float32 elsewhere."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def sync(device: torch.device) -> None:
    """Wait for queued GPU work so that wall-clock timings are real."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ----------------------------------------------------------------------------------------------
# Batches and evaluation
# ----------------------------------------------------------------------------------------------


def chunk_starts(n_tokens: int, seq_len: int, offset: int) -> torch.Tensor:
    """Starts of the non-overlapping ``seq_len + 1`` token chunks (sharing one boundary token)."""
    return offset + seq_len * torch.arange((n_tokens - 1 - offset) // seq_len)


def steps_per_epoch(n_tokens: int, batch_size: int, seq_len: int) -> int:
    """Optimizer steps in one pass over the training stream."""
    return len(chunk_starts(n_tokens, seq_len, 0)) // batch_size


def batch_starts(n_tokens: int, batch_size: int, seq_len: int, gen: torch.Generator, device: torch.device):
    """Endless deterministic stream of ``(epoch, starts[batch_size])``.

    Every epoch cuts the stream into chunks at a fresh random offset and visits them in a fresh
    random order (the incomplete last batch of an epoch is dropped). The order is drawn on the CPU
    from ``gen``, so it is the same on every device.
    """
    if steps_per_epoch(n_tokens, batch_size, seq_len) < 1:
        raise ValueError(f"{n_tokens} training tokens do not fill one batch of {batch_size}x{seq_len}")
    epoch = 0
    while True:
        offset = int(torch.randint(seq_len, (1,), generator=gen))
        starts = chunk_starts(n_tokens, seq_len, offset)
        starts = starts[torch.randperm(len(starts), generator=gen)].to(device)
        for i in range(0, len(starts) - batch_size + 1, batch_size):
            yield epoch, starts[i : i + batch_size]
        epoch += 1


def gather_windows(tokens: torch.Tensor, starts: torch.Tensor, seq_len: int) -> torch.Tensor:
    """``tokens[start : start + seq_len + 1]`` for every start, as a ``[len(starts), seq_len + 1]`` tensor."""
    return tokens[starts.to(tokens.device)[:, None] + torch.arange(seq_len + 1, device=tokens.device)]


def eval_windows(tokens: torch.Tensor, seq_len: int, n: int) -> torch.Tensor:
    """``n`` evenly spaced non-overlapping windows of ``seq_len + 1`` tokens (fewer if the stream is short)."""
    available = (len(tokens) - 1) // seq_len
    if available < 1:
        raise ValueError(f"only {len(tokens)} tokens, need more than {seq_len} for one evaluation window")
    idx = torch.linspace(0, available - 1, steps=min(n, available)).round().long()
    return gather_windows(tokens, idx * seq_len, seq_len)


@torch.no_grad()
def evaluate_windows(model, windows: torch.Tensor, batch_size: int, device: torch.device) -> dict:
    """Next-token statistics over all positions of the windows.

    ``loss``: mean cross entropy (nats/token); ``top1_acc``: how often the argmax is the next
    token; ``top1_prob``: mean probability of the argmax (how peaked the logits are).
    """
    was_training = model.training
    model.eval()
    loss = hits = top1 = 0.0
    count = 0
    for i in range(0, len(windows), batch_size):
        w = windows[i : i + batch_size].to(device)
        with autocast_for(device):
            logits = model(input_ids=w[:, :-1], use_cache=False).logits
        logits, targets = logits.float().flatten(0, 1), w[:, 1:].flatten()
        loss += F.cross_entropy(logits, targets, reduction="sum").item()
        probs, argmax = logits.softmax(-1).max(-1)
        hits += (argmax == targets).sum().item()
        top1 += probs.sum().item()
        count += targets.numel()
    model.train(was_training)
    return {"loss": loss / count, "top1_acc": hits / count, "top1_prob": top1 / count}


def unigram_cross_entropy(train_tokens: torch.Tensor, targets: torch.Tensor, vocab_size: int) -> float:
    """Cross entropy of ``targets`` under the add-one-smoothed unigram distribution of ``train_tokens``."""
    counts = torch.bincount(train_tokens.cpu(), minlength=vocab_size).double()
    log_probs = torch.log((counts + 1.0) / (counts.sum() + vocab_size))
    return float(-log_probs[targets.cpu().flatten()].mean())


# ----------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------


@dataclass
class TrainResult:
    """What happened in the training loop."""

    steps: int
    seconds: float
    tokens_seen: int
    epochs: float
    stop_reason: str
    planned_steps: int
    history: list[dict]
    evals: list[dict]


def planned_steps(args: argparse.Namespace, per_epoch: int) -> tuple[int | None, str]:
    """Steps known before training starts (--max-steps / --max-epochs) and which limit set them.

    Returns ``(None, "")`` when only the time budget decides.
    """
    caps = []
    if args.max_epochs:
        caps.append((max(1, int(args.max_epochs * per_epoch)), "max_epochs"))
    if args.max_steps is not None:
        caps.append((args.max_steps, "max_steps"))
    return min(caps) if caps else (None, "")


def train(model, train_tokens: torch.Tensor, periodic_windows: torch.Tensor, args, device) -> TrainResult:
    """Run the training loop until the step cap or the time budget; returns the loss curve."""
    per_epoch = steps_per_epoch(len(train_tokens), args.batch_size, args.seq_len)
    total, stop_reason = planned_steps(args, per_epoch)
    budget = args.minutes * 60.0 if args.minutes > 0 else math.inf
    if total is None and math.isinf(budget):
        raise ValueError("give --max-steps, --max-epochs or a positive --minutes")

    optimizer = make_optimizer(model, args, device)
    hooks = add_residual_dropout(model, args.dropout)
    gen = torch.Generator().manual_seed(args.seed)
    stream = batch_starts(len(train_tokens), args.batch_size, args.seq_len, gen, device)
    tokens_per_step = args.batch_size * args.seq_len
    history, evals = [], []
    loss_sum, loss_n = torch.zeros((), device=device), 0
    model.train()
    sync(device)
    t_start = t_log = time.perf_counter()
    t_calib = None
    step = 0
    while total is None or step < total:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, total, args)
        _, starts = next(stream)
        batch = gather_windows(train_tokens, starts, args.seq_len)
        with autocast_for(device):
            logits = model(input_ids=batch[:, :-1], use_cache=False).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
        loss_sum += loss.detach()
        loss_n += 1
        step += 1

        if step == CALIBRATION_STEPS[0] or step == CALIBRATION_STEPS[1]:
            sync(device)
            now = time.perf_counter()
            if step == CALIBRATION_STEPS[0]:
                t_calib = now
            elif not math.isinf(budget):
                per_step = (now - t_calib) / (CALIBRATION_STEPS[1] - CALIBRATION_STEPS[0])
                fit = step + int(0.97 * (budget - (now - t_start)) / per_step)
                if total is None or fit < total:
                    total, stop_reason = max(fit, step), "time budget"
                print(
                    f"[train] {per_step * 1e3:.1f} ms/step -> planning {total} steps "
                    f"({total / per_epoch:.1f} epochs of {per_epoch} steps)",
                    flush=True,
                )

        done = total is not None and step >= total
        if step % args.log_every == 0 or done:
            sync(device)
            now = time.perf_counter()
            rec = {
                "step": step,
                "epoch": step / per_epoch,
                "tokens": step * tokens_per_step,
                "loss": float(loss_sum) / loss_n,
                "lr": optimizer.param_groups[0]["lr"],
                "tokens_per_s": loss_n * tokens_per_step / (now - t_log),
                "elapsed_s": now - t_start,
            }
            history.append(rec)
            print(
                f"[train] step {step:6d}  epoch {rec['epoch']:6.2f}  loss {rec['loss']:.4f}  "
                f"lr {rec['lr']:.2e}  {rec['tokens_per_s']:,.0f} tok/s  {rec['elapsed_s']:.0f}s",
                flush=True,
            )
            loss_sum.zero_()
            loss_n, t_log = 0, time.perf_counter()
        if (args.eval_every and step % args.eval_every == 0) or done:
            t_eval = time.perf_counter()
            held = evaluate_windows(model, periodic_windows, args.batch_size, device)["loss"]
            evals.append({"step": step, "heldout_loss": held})
            t_log += time.perf_counter() - t_eval  # keep evaluation out of the tokens/s figure
            print(
                f"[eval]  step {step:6d}  held-out loss ({len(periodic_windows)} windows) {held:.4f}",
                flush=True,
            )
        if time.perf_counter() - t_start > budget and not done:
            stop_reason = "time budget (hard stop)"
            print(f"[train] time budget of {args.minutes} min exhausted at step {step}", flush=True)
            break
    sync(device)
    seconds = time.perf_counter() - t_start
    for handle in hooks:
        handle.remove()
    if not history or history[-1]["step"] != step:  # hard stop between two log points
        history.append(
            {
                "step": step,
                "epoch": step / per_epoch,
                "tokens": step * tokens_per_step,
                "loss": float(loss_sum) / max(1, loss_n),
                "lr": optimizer.param_groups[0]["lr"],
                "tokens_per_s": math.nan,
                "elapsed_s": seconds,
            }
        )
    return TrainResult(
        step, seconds, step * tokens_per_step, step / per_epoch, stop_reason, total or step, history, evals
    )


# ----------------------------------------------------------------------------------------------
# Checkpoint, samples, report
# ----------------------------------------------------------------------------------------------


def save_checkpoint(model, tokenizer, out: Path) -> None:
    """Save the model in bf16 with its generation config and tokenizer.

    ``config.json`` additionally gets the legacy keys ``torch_dtype`` and ``rope_theta`` so that
    readers written for transformers 4.x find them.
    """
    from transformers import GenerationConfig

    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(out)
    path = out / "config.json"
    cfg = json.loads(path.read_text())
    cfg["dtype"] = cfg["torch_dtype"] = "bfloat16"
    cfg["rope_theta"] = cfg.get("rope_parameters", {}).get("rope_theta", 10000.0)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    save_tokenizer(tokenizer, out)


def load_checkpoint(out: Path, device: torch.device):
    """Reload the saved folder (bf16 on CUDA, upcast to float32 on the CPU) and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(out, dtype=dtype).to(device).eval()
    return model, AutoTokenizer.from_pretrained(out)


@torch.no_grad()
def greedy_samples(model, tokenizer, prompts, max_new_tokens: int, device: torch.device) -> list[dict]:
    """Greedy continuations of each prompt with transformers ``generate``."""
    samples = []
    for prompt in prompts:
        enc = tokenizer(prompt, return_tensors="pt").to(device)
        out = model.generate(
            **enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
        )
        new = out[0, enc["input_ids"].shape[1] :]
        samples.append({"prompt": prompt, "completion": tokenizer.decode(new), "new_tokens": len(new)})
    return samples


def plot_loss(history: list[dict], evals: list[dict], unigram: float, path: Path) -> None:
    """Train loss (and periodic held-out loss) against the step, with the unigram baseline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    ax.plot([h["step"] for h in history], [h["loss"] for h in history], label="train loss")
    if evals:
        ax.plot(
            [e["step"] for e in evals],
            [e["heldout_loss"] for e in evals],
            "o-",
            ms=3,
            label=f"held-out loss ({PERIODIC_EVAL_WINDOWS} windows)",
        )
    ax.axhline(unigram, color="gray", ls="--", lw=1, label=f"unigram baseline ({unigram:.2f})")
    last = history[-1]
    per_epoch = round(last["step"] / last["epoch"]) if last["epoch"] else 0
    ax.set_xlabel(f"optimizer step (1 epoch = {per_epoch} steps)")
    ax.set_ylabel("cross entropy (nats/token)")
    ax.set_ylim(0, max([h["loss"] for h in history] + [e["heldout_loss"] for e in evals] + [unigram]) * 1.05)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("minivllm demo model: training on the Python stdlib")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def folder_mb(out: Path) -> float:
    """Total size of the files in ``out`` in MB (10^6 bytes)."""
    return sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) / 1e6


def device_name(device: torch.device) -> str:
    """Human-readable name of the training device."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def model_card(log: dict) -> str:
    """The README.md of the checkpoint folder."""
    d, m, t, e = log["data"], log["model"], log["training"], log["eval"]
    samples = "\n\n".join(
        f"Prompt `{s['prompt']!r}`:\n\n```python\n{s['prompt']}{s['completion']}\n```" for s in log["samples"]
    )
    held = ", ".join(f"`{p}/`" for p in d["held_out_packages"])
    best = min(t["periodic_evals"], key=lambda ev: ev["heldout_loss"])
    per_epoch = t["steps"] / t["epochs"]
    subset = (
        "" if log["args"]["max_files"] is None else f"the first (`--max-files {log['args']['max_files']}`) "
    )
    return f"""# minivllm-demo-py

A tiny Qwen3-architecture language model trained from scratch on the Python standard library's
source code, shipped with minivllm so that examples and GPU tests have a real model with peaked
logits and no download. It continues Python code; it is not an assistant (the ChatML template
exists so that chat code paths can be exercised, but the model never saw chat data).

## Data

* Source: every `*.py` file of the standard library of **Python {log["python_version_short"]}**
  (`{d["stdlib_root"]}`), sorted by path, excluding `site-packages`, `test`, `tests`, `idlelib`
  and `lib2to3` directories and empty files. Each file is followed by `<|endoftext|>`.
* Held out (never trained on, tokenizer included): {subset}files under {held} —
  {d["held_files"]} files, {d["held_tokens"]:,} tokens.
* Training: {d["train_files"]} files, {d["train_tokens"]:,} tokens.
* The stdlib differs slightly between Python versions; this checkpoint used
  `{log["python_version"]}`.

## Tokenizer

Byte-level BPE (`tokenizers`), {m["tokenizer_vocab"]} tokens including the special tokens
`<|endoftext|>` (eos and pad, id {m["eos_token_id"]}), `<|im_start|>`, `<|im_end|>`; no bos.
Chat template: ChatML (`<|im_start|>{{role}}\\n{{content}}<|im_end|>\\n`, generation prompt
`<|im_start|>assistant\\n`).

## Model

`Qwen3ForCausalLM`: {m["parameters"]:,} parameters ({m["non_embedding_parameters"]:,} outside
the tied embedding), hidden {m["hidden_size"]}, {m["layers"]} layers, {m["heads"]} query heads /
{m["kv_heads"]} KV heads (GQA), head_dim {m["head_dim"]}, MLP {m["intermediate_size"]}, RMSNorm
with q/k norms, RoPE theta 10000, max_position_embeddings 2048, tied input/output embeddings.
The model's vocab is **{m["model_vocab"]}** (tokenizer vocab rounded up to a multiple of
{VOCAB_MULTIPLE}); ids >= {m["tokenizer_vocab"]} are never produced by the tokenizer. Stored in bfloat16
(`model.safetensors`, {log["folder_mb"]:.1f} MB folder).

## Training

```
{log["command"]}
```

* Device: {t["device"]}; torch {log["torch_version"]}, transformers {log["transformers_version"]}.
* {t["steps"]:,} AdamW steps (betas 0.9/0.95, weight decay {t["weight_decay"]}, peak lr {t["lr"]},
  {t["warmup_steps"]} warmup steps then cosine to {t["min_lr_ratio"]}x), batch
  {t["batch_size"]} x {t["seq_len"]} tokens, {t["tokens_seen"]:,} tokens seen
  ({t["epochs"]:.1f} epochs), {t["seconds"]:.0f} s of training ({t["stop_reason"]}).
  Residual dropout {t["dropout"]} on attention/MLP outputs while training (not part of the
  model); bf16 autocast on CUDA, float32 on the CPU.
* Final train loss (mean of the last logging interval): {t["final_train_loss"]:.4f} nats/token.
  Held-out loss during training ({PERIODIC_EVAL_WINDOWS} windows, every {log["args"]["eval_every"]} steps): lowest
  {best["heldout_loss"]:.4f} at step {best["step"]} (epoch {best["step"] / per_epoch:.1f}), last {t["periodic_evals"][-1]["heldout_loss"]:.4f}.
* Determinism: tokenizer, initialisation, data order and dropout masks depend only on `--seed`
  and the stdlib files; on the CPU a run whose length is set by `--max-epochs`/`--max-steps` is
  bitwise reproducible. When the time budget sets the length, the step count depends on the
  device's speed; on CUDA, kernels are not bitwise deterministic (results agree closely, not
  bitwise).

## Evaluation

Mean next-token cross entropy of the saved bf16 checkpoint on {e["windows"]} evenly spaced
{t["seq_len"]}-token windows ({e["target_tokens"]:,} predicted tokens):

| | nats/token | top-1 accuracy | mean top-1 probability |
|---|---|---|---|
| held-out (`{", ".join(d["held_out_packages"])}`) | **{e["heldout_loss"]:.4f}** | {e["heldout_top1_acc"]:.3f} | {e["heldout_top1_prob"]:.3f} |
| training windows (same count) | {e["train_window_loss"]:.4f} | {e["train_window_top1_acc"]:.3f} | {e["train_window_top1_prob"]:.3f} |
| unigram baseline on the held-out tokens (add-one smoothed training counts, {e["unigram_vocab"]} symbols) | {e["unigram_baseline"]:.4f} | | |

![loss curve](loss_curve.png)

## Greedy samples (`max_new_tokens={log["sample_tokens"]}`)

{samples}

## License

The training text is the CPython standard library (PSF License).
"""


def summary_rows(log: dict) -> list[tuple[str, str]]:
    """Key figures for the final console table."""
    d, m, t, e = log["data"], log["model"], log["training"], log["eval"]
    best = min(t["periodic_evals"], key=lambda ev: ev["heldout_loss"])
    return [
        ("output", log["out"]),
        ("device", t["device"]),
        ("python (stdlib)", log["python_version_short"]),
        ("parameters", f"{m['parameters']:,} ({m['non_embedding_parameters']:,} non-embedding)"),
        ("vocab tokenizer / model", f"{m['tokenizer_vocab']} / {m['model_vocab']}"),
        ("train / held-out tokens", f"{d['train_tokens']:,} / {d['held_tokens']:,}"),
        ("steps / epochs", f"{t['steps']:,} / {t['epochs']:.2f}"),
        ("tokens seen", f"{t['tokens_seen']:,}"),
        ("training time", f"{t['seconds']:.1f} s ({t['stop_reason']})"),
        ("final train loss", f"{t['final_train_loss']:.4f}"),
        ("best periodic held-out", "{heldout_loss:.4f} at step {step}".format(**best)),
        ("train-window loss", f"{e['train_window_loss']:.4f}"),
        ("held-out loss", f"{e['heldout_loss']:.4f}"),
        ("held-out top-1 acc / prob", f"{e['heldout_top1_acc']:.3f} / {e['heldout_top1_prob']:.3f}"),
        ("unigram baseline", f"{e['unigram_baseline']:.4f}"),
        ("folder size", f"{log['folder_mb']:.1f} MB"),
        ("total wall time", f"{log['wall_seconds']:.1f} s"),
    ]


def print_summary(log: dict) -> None:
    """Print the summary table."""
    rows = summary_rows(log)
    width = max(len(k) for k, _ in rows)
    print("\n" + "=" * 72 + "\nSummary\n" + "=" * 72)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


# ----------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------


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
