"""Training windows, held-out windows, their evaluation and the unigram baseline."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from demo_model.modeling import autocast_for


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
