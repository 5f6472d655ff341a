"""Prompt logprobs: the logprob of each prompt token given the tokens before it, and its top-k alternatives.

The forward pass already has the hidden state of every prompt position it computes; the rows that ask
(``ScheduledRow.prompt_logprobs``) have their positions' hidden states put through the LM head, in slices
so that a long prompt chunk never holds ``[chunk, vocab]`` logits at once. Every tensor-parallel rank runs
the same slices (the LM head gathers across ranks); rank 0 keeps the log-softmax. The host gets, per
row, ``{target id: Logprob, alternative id: Logprob, ...}`` for each of its positions (``Logprob``: the
logprob and its 1-based rank).
"""

from __future__ import annotations

import torch

from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.outputs import Logprob

#: prompt positions put through the LM head at once ([slice, vocab] float32 logits: 600 MB at Qwen3's vocabulary)
SLICE = 1024


def prompt_logits(model, hidden: torch.Tensor) -> list[torch.Tensor] | None:
    """``hidden`` ([positions, hidden]) through the LM head, slice by slice: float32 log-softmax slices
    ([slice, vocab]) on rank 0, None on other ranks."""
    out = []
    for i in range(0, hidden.shape[0], SLICE):
        logits = model.compute_logits(hidden[i:i + SLICE], gather=True)  # [slice, vocab] on rank 0
        if logits is not None:
            out.append(torch.log_softmax(logits, dim=-1, dtype=torch.float32))
    return out or None


class PromptLogprobs:
    """A step's prompt logprobs on their way to the host. ``result()`` gives ``[(seq_id, first, [{target:
    Logprob, top id: Logprob, ...}, ...]), ...]``: the entries of prompt tokens ``first, first + 1, ...``."""

    def __init__(self, rows: list[tuple[int, int, tuple[int, ...], int]], target: torch.Tensor,
                 top_ids: torch.Tensor | None, top_lps: torch.Tensor | None):
        self.rows = rows  # (seq_id, first token, target ids, k)
        self.tensors = [target, top_ids, top_lps]  # [M, 2] (logprob, rank), [M, kmax], [M, kmax]

    def result(self) -> list[tuple[int, int, list[dict[int, Logprob]]]]:
        target, top_ids, top_lps = (t.tolist() if t is not None else None for t in self.tensors)
        out, at = [], 0
        for seq_id, first, targets, k in self.rows:
            entries = []
            for j, tid in enumerate(targets, start=at):
                d = {tid: Logprob(target[j][0], int(target[j][1]))}
                for rank in range(k):
                    d.setdefault(top_ids[j][rank], Logprob(top_lps[j][rank], rank + 1))
                entries.append(d)
            out.append((seq_id, first, entries))
            at += len(targets)
        return out


def prompt_logprobs(slices: list[torch.Tensor], out: SchedulerOutput) -> PromptLogprobs:
    """Gather the targets' logprobs and ranks, and the top-k, of the positions of ``out``'s rows from ``slices``."""
    lp = slices[0] if len(slices) == 1 else torch.cat(slices)  # [M, vocab]
    vocab = lp.shape[1]
    rows, targets, kmax = [], [], 0
    for row in out.rows:
        if row.prompt_logprobs is not None:
            k, ids = row.prompt_logprobs
            k = vocab if k == -1 else min(k, vocab)  # -1: the whole vocabulary
            rows.append((row.seq_id, row.num_computed_tokens + 1, ids, k))
            targets.extend(ids)
            kmax = max(kmax, k)
    ids = torch.tensor(targets, dtype=torch.int64).to(lp.device, non_blocking=True)  # [M]
    target_lps = lp.gather(1, ids.unsqueeze(1))  # [M, 1]
    ranks = (lp > target_lps).sum(dim=1, keepdim=True) + 1  # [M, 1]
    target = torch.cat([target_lps, ranks.to(lp.dtype)], dim=1)  # [M, 2]
    top_lps, top_ids = torch.topk(lp, kmax, dim=-1) if kmax else (None, None)  # [M, kmax]
    return PromptLogprobs(rows, target, top_ids, top_lps)
