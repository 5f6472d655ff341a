"""The learning-rate schedule and the training loop."""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from demo_model.batches import batch_starts, evaluate_windows, gather_windows, steps_per_epoch
from demo_model.constants import CALIBRATION_STEPS
from demo_model.modeling import add_residual_dropout, autocast_for, make_optimizer, sync


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
