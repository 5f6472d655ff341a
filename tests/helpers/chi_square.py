"""Pearson's chi-square goodness-of-fit test of sampled token counts against a distribution (no scipy)."""

from __future__ import annotations

import torch


def chi_square_p_value(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    """The p-value of "``tokens`` (int ids) were drawn i.i.d. from ``probs`` ([V])": the chi-square statistic over
    the tokens of positive probability (those expected fewer than 5 times in one bin), with ``bins - 1`` degrees
    of freedom. A token drawn outside the support gives 0.0 (impossible under ``probs``)."""
    probs = probs.to(torch.float64)
    counts = torch.bincount(tokens.flatten().cpu(), minlength=probs.numel()).to(torch.float64)
    support = probs > 0
    if counts[~support].sum() > 0:
        return 0.0
    counts, expected = counts[support], counts.sum() * probs[support]
    # tokens expected fewer than 5 times share one bin (the chi-square approximation needs about 5 per bin)
    small = expected < 5
    if small.any():
        counts = torch.cat([counts[~small], counts[small].sum().view(1)])
        expected = torch.cat([expected[~small], expected[small].sum().view(1)])
    stat = ((counts - expected) ** 2 / expected).sum()
    dof = counts.numel() - 1
    if dof == 0:
        return 1.0
    # the chi-square survival function: the regularized upper incomplete gamma Q(dof / 2, stat / 2)
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), stat / 2))
