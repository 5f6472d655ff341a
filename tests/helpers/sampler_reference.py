"""The statistical tests' reference: the exact distribution the sampler draws one row from.

Written independently of ``minivllm.sample.sampler`` (sorted Python lists, float64) from that module's
docstring, so a bug in the batched implementation does not show up here too. Not for the hot path.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import torch

from minivllm.sample.metadata import SAMPLING_EPS
from minivllm.sampling_params import SamplingParams


def filtered_probs(
    logits_row: torch.Tensor,
    params: SamplingParams,
    prompt_token_ids: Sequence[int] = (),
    output_token_ids: Sequence[int] = (),
    eos_token_ids: Sequence[int] = (),
    bad_words: Sequence[Sequence[int]] = (),
) -> torch.Tensor:
    """Float64 probabilities the sampler draws row ``logits_row`` from (one-hot for greedy).

    A straightforward per-row reference of the module docstring (sorted lists, float64), used by
    the statistical tests; not for the hot path. ``bad_words``: each bad word's token ids.
    """
    x = logits_row.detach().to("cpu", torch.float64).clone()
    V = x.numel()
    if params.allowed_token_ids:
        keep = set(params.allowed_token_ids)
        for t in range(V):
            if t not in keep:
                x[t] = -math.inf
    for t, bias in (params.logit_bias or {}).items():
        if t < V:
            x[t] += bias
    out = list(output_token_ids)
    for word in map(list, bad_words):
        if len(word) == 1 or out[len(out) - len(word) + 1:] == word[:-1] and len(out) >= len(word) - 1:
            x[word[-1]] = -math.inf
    if len(output_token_ids) < params.min_tokens:
        banned = set(params.stop_token_ids or ())
        if not params.ignore_eos:
            banned.update(eos_token_ids)
        for t in banned:
            if 0 <= t < V:
                x[t] = -math.inf
    r = params.repetition_penalty
    if r != 1.0:
        for t in set(prompt_token_ids) | set(output_token_ids):
            x[t] = x[t] / r if x[t] > 0 else x[t] * r
    for t, c in Counter(output_token_ids).items():
        x[t] -= params.frequency_penalty * c + params.presence_penalty
    if params.temperature < SAMPLING_EPS:
        probs = torch.zeros(V, dtype=torch.float64)
        probs[int(torch.argmax(x))] = 1.0
        return probs
    x /= params.temperature
    order = sorted(range(V), key=lambda t: -float(x[t]))
    if 0 < params.top_k < V:
        kth = float(x[order[params.top_k - 1]])
        x[x < kth] = -math.inf
    if params.top_p < 1.0:
        q = torch.softmax(x, dim=0)
        mass_before = 0.0
        for t in order:
            if mass_before >= params.top_p:
                x[t] = -math.inf
            mass_before += float(q[t])
    if params.min_p > 0.0:
        q = torch.softmax(x, dim=0)
        x[q < params.min_p * q.max()] = -math.inf
    return torch.softmax(x, dim=0)
