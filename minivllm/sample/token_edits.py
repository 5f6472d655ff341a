"""Per-token edits of a row's logits: ``logit_bias``, ``allowed_token_ids`` and ``bad_words`` (vLLM's semantics).

Built on the host for the rows that ask for them, as sparse index lists, so a batch in which no row does
builds and applies nothing. A bad word of one token is banned outright; a longer one bans its last token
when the completion so far ends with the rest of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from minivllm.sampling_params import SamplingParams


@dataclass
class TokenEdits:
    """The device side of a step's edits; each part ``None`` when no row has it."""

    bias_rows: torch.Tensor | None = None  # [M] int64
    bias_cols: torch.Tensor | None = None  # [M] int64
    bias_values: torch.Tensor | None = None  # [M] float32
    allowed_rows: torch.Tensor | None = None  # [R] int64: the rows restricted to a set of tokens
    allowed_mask: torch.Tensor | None = None  # [R, V] bool: True where a restricted row's token is NOT allowed


def bad_word_bans(bad_words: Sequence[Sequence[int]], output_tail: Sequence[int]) -> list[int]:
    """The token ids the bad words (each one's token ids) ban after a completion that ends with ``output_tail``
    (its newest tokens, at least as many as the longest bad word has minus one, or the whole completion)."""
    bans = []
    for word in bad_words:
        prefix = list(word[:-1])
        if not prefix or (len(output_tail) >= len(prefix) and list(output_tail[len(output_tail) - len(prefix):]) == prefix):
            bans.append(word[-1])
    return bans


def build_token_edits(params: Sequence[SamplingParams], vocab_size: int, device: torch.device,
                      to_device) -> TokenEdits | None:
    """The edits of the rows with ``logit_bias`` or ``allowed_token_ids`` (bad words go with the bans of
    ``min_tokens``); ``to_device(data, dtype, device)`` moves host lists."""
    edits = TokenEdits()
    rows, cols, vals = [], [], []
    allowed_rows, allowed_local, allowed_cols = [], [], []
    for i, p in enumerate(params):
        if p.logit_bias:
            for tid, bias in p.logit_bias.items():
                if tid < vocab_size:
                    rows.append(i)
                    cols.append(tid)
                    vals.append(bias)
        if p.allowed_token_ids:
            ids = [t for t in p.allowed_token_ids if t < vocab_size]
            allowed_local.extend([len(allowed_rows)] * len(ids))
            allowed_cols.extend(ids)
            allowed_rows.append(i)
    if not rows and not allowed_rows:
        return None
    if rows:
        edits.bias_rows = to_device(rows, torch.int64, device)
        edits.bias_cols = to_device(cols, torch.int64, device)
        edits.bias_values = to_device(vals, torch.float32, device)
    if allowed_rows:
        edits.allowed_rows = to_device(allowed_rows, torch.int64, device)
        mask = torch.ones(len(allowed_rows), vocab_size, dtype=torch.bool, device=device)  # [R, V]
        mask[to_device(allowed_local, torch.int64, device), to_device(allowed_cols, torch.int64, device)] = False
        edits.allowed_mask = mask
    return edits


def apply_token_edits(logits: torch.Tensor, edits: TokenEdits | None) -> torch.Tensor:
    """``logits`` ([B, V] float32, in place): restricted rows keep only their allowed tokens, then the biases
    are added."""
    if edits is None:
        return logits
    if edits.allowed_rows is not None:
        restricted = logits[edits.allowed_rows].masked_fill_(edits.allowed_mask, float("-inf"))  # [R, V]
        logits[edits.allowed_rows] = restricted
    if edits.bias_rows is not None:
        logits.index_put_((edits.bias_rows, edits.bias_cols), edits.bias_values, accumulate=True)
    return logits
