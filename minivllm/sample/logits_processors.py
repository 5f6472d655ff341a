"""Logits processors of the sampler, steps 1-3 and 6-8 of ``sample/sampler.py``'s docstring (its
formulas): each works in place on a float32 ``[B, V]`` tensor and returns it, skipping all work
when the batch's host-side flags say no row asks for it."""

from __future__ import annotations

import torch

from minivllm.sample.metadata import SamplingMetadata

#: use torch.topk (instead of a full sort) for top-k-only batches when the largest k is at most this.
_TOPK_MAX_K = 1024


def apply_bans(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """-inf at the banned (row, token) pairs: stop and EOS tokens under ``min_tokens``, and bad words."""
    if md.banned_rows is not None:
        logits[md.banned_rows, md.banned_cols] = float("-inf")  # scalar fill, no H2D copy
    return logits


def apply_penalties(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """Repetition, then frequency and presence penalties (formulas in the module docstring)."""
    if md.no_penalties:
        return logits
    counts = md.output_counts
    seen_out = counts > 0
    if md.prompt_mask is not None:
        seen = md.prompt_mask | seen_out
        rep = md.repetition_penalty.unsqueeze(1)
        penalized = torch.where(logits > 0, logits / rep, logits * rep)
        logits = torch.where(seen, penalized, logits)
    logits -= md.frequency_penalty.unsqueeze(1) * counts
    logits -= md.presence_penalty.unsqueeze(1) * seen_out
    return logits


def apply_top_k_top_p(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """Top-k then top-p with one ascending sort (or one ``topk`` when only small top-k is asked)."""
    V = logits.shape[-1]
    if md.no_top_k and md.no_top_p:
        return logits
    if md.no_top_p and md.max_top_k <= _TOPK_MAX_K:
        k = md.top_k
        top_vals = torch.topk(logits, md.max_top_k, dim=-1).values  # [B, kmax], descending
        kth = top_vals.gather(1, (k.clamp(max=md.max_top_k) - 1).unsqueeze(1))
        kth.masked_fill_((k >= V).unsqueeze(1), float("-inf"))  # disabled rows keep everything
        return logits.masked_fill_(logits < kth, float("-inf"))

    logits_sort, logits_idx = torch.sort(logits, dim=-1, descending=False)
    if not md.no_top_k:
        kth = logits_sort.gather(1, (V - md.top_k).clamp(min=0).unsqueeze(1))
        logits_sort.masked_fill_(logits_sort < kth, float("-inf"))
    if not md.no_top_p:
        probs_sort = torch.softmax(logits_sort, dim=-1)
        cumsum = torch.cumsum(probs_sort, dim=-1, out=probs_sort)
        remove = cumsum <= (1.0 - md.top_p).unsqueeze(1)
        remove[:, -1] = False  # always keep the most likely token
        logits_sort.masked_fill_(remove, float("-inf"))
    return logits.scatter_(-1, logits_idx, logits_sort)


def apply_min_p(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """keep t iff q[t] >= min_p * max(q), i.e. l[t] >= max(l) + log(min_p); no softmax, no sort."""
    if md.no_min_p:
        return logits
    threshold = logits.amax(dim=-1, keepdim=True) + torch.log(md.min_p).unsqueeze(1)  # log(0) = -inf
    return logits.masked_fill_(logits < threshold, float("-inf"))
