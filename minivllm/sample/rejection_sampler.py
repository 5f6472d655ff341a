"""Rejection sampling of draft tokens (speculative decoding): the tokens a row emits from one target forward
over its drafts, distributed exactly as the plain sampler would have drawn them one at a time.

Row ``r`` with drafts ``d_0 .. d_{k-1}`` owns ``k + 1`` consecutive positions of the target's logits: position
``j`` holds the logits after the row's last accepted token (``j = 0``) and its drafts ``d_0 .. d_{j-1}``. Every
position is processed with the row's sampling parameters as the plain sampler (``minivllm.sample.sampler``)
processes one row, the drafts before it counting as generated tokens (``minivllm.sample.spec_metadata`` builds
that metadata, one row per position). With ``q_j`` the distribution position ``j`` draws from:

- **greedy rows**: ``t_j = argmax`` of the processed logits; drafts are accepted while ``d_j == t_j``, and the
  first position that is not accepted (a mismatch, or the last position) emits ``t_j``: exactly the greedy chain.
- **random rows** (Leviathan et al., 2023): draft ``d_j`` proposed with probability ``p_j(d_j)`` is accepted
  iff ``u_j * p_j(d_j) < q_j(d_j)`` with ``u_j ~ U[0, 1)``, i.e. with probability ``min(1, q_j(d_j) / p_j(d_j))``;
  at the first rejection the row emits a token drawn from the residual ``max(0, q_j - p_j)`` (normalized); if
  every draft is accepted, a bonus token drawn from ``q_k``. A deterministic proposer (n-gram: ``draft_probs``
  None) has ``p_j = onehot(d_j)``: acceptance with probability ``q_j(d_j)``, residual ``q_j`` without ``d_j``.
  Each emitted token is then distributed as ``q_j`` given the tokens before it.

Draws use the exponential race (``argmax(r / E)``, ``E ~ Exp(1)``, unnormalized ``r``) and the acceptance
uniforms from the batch generator, or for a seeded row's position from that position's own generator (keyed by
the request's seed and the position's step): the tokens depend only on the request and its drafts.

Vectorized over positions: no per-row loop and no host synchronization inside (the layout comes from the host
``num_drafts`` or, given as a device tensor, is computed on the device).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from minivllm.sample.metadata import SamplingMetadata, _to_device
from minivllm.sample.sampler import (
    _exponential_race,
    apply_sampling_filters,
    gather_logprobs,
    modifies_logits,
    process_logits,
)
from minivllm.sample.spec_metadata import position_rows


@dataclass
class SpecSamplerOutput:
    """The rejection sampler's answer, on the logits' device, per position (``P = sum(num_drafts + 1)``).

    Row ``r`` emits the tokens of its first ``num_accepted[r] + 1`` positions: its accepted drafts, then the one
    recovered (after a rejection) or bonus (all accepted) token. The logprob tensors (None where no row asked)
    have the plain sampler's meaning at each position; read them at the emitted positions.
    """

    sampled_token_ids: torch.Tensor  # [P] int64: the token each position emits if its row gets that far
    num_accepted: torch.Tensor  # [R] int64: accepted drafts per row
    emitted: torch.Tensor  # [P] bool: the position's token is emitted
    last_token_ids: torch.Tensor  # [R] int64: each row's last emitted token (the recovered or bonus one)
    num_drafts: torch.Tensor  # [R] int64
    logprobs: torch.Tensor | None = None  # [P] float32, raw log_softmax at sampled_token_ids
    top_logprobs_ids: torch.Tensor | None = None  # [P, k] int64, sorted by descending logprob
    top_logprobs: torch.Tensor | None = None  # [P, k] float32
    token_id_logprobs: torch.Tensor | None = None  # [P, M] float32, at metadata.logprob_token_ids

    def token_id_lists(self) -> list[list[int]]:
        """Each row's emitted token ids (1 .. num_drafts + 1 of them), with one copy to the host."""
        host = torch.cat([self.sampled_token_ids, self.num_accepted, self.num_drafts]).tolist()
        num_pos = self.sampled_token_ids.shape[0]
        rows = self.num_accepted.shape[0]
        accepted = host[num_pos:num_pos + rows]
        out, start = [], 0
        for r, n in enumerate(host[num_pos + rows:]):
            out.append(host[start:start + accepted[r] + 1])
            start += n + 1
        return out


@dataclass
class _Layout:
    """Where each row's positions and drafts lie among the ``P`` positions (device tensors)."""

    row: torch.Tensor  # [P] int64: the row of each position
    offset: torch.Tensor  # [P] int64: j, the position's index within its row
    is_draft: torch.Tensor  # [P] bool: a draft follows the position's context (j < num_drafts[row])
    draft_position: torch.Tensor  # [D] int64: the position that verifies each draft
    num_drafts: torch.Tensor  # [R] int64
    start: torch.Tensor  # [R] int64: each row's first position


def _layout(num_drafts: Sequence[int] | torch.Tensor, num_positions: int, device: torch.device) -> _Layout:
    if isinstance(num_drafts, torch.Tensor):  # on the device: no host read, the sizes come from num_positions
        nd = num_drafts.to(device=device, dtype=torch.int64)  # [R]
        rows = nd.shape[0]
        row = torch.repeat_interleave(torch.arange(rows, device=device), nd + 1, output_size=num_positions)
        start = torch.cumsum(nd + 1, 0) - (nd + 1)  # [R]
        offset = torch.arange(num_positions, device=device) - start[row]  # [P]
        # the d-th draft overall is verified at position d + (its row): one bonus position per earlier row
        draft_rows = torch.repeat_interleave(torch.arange(rows, device=device), nd,
                                             output_size=num_positions - rows)
        draft_position = torch.arange(num_positions - rows, device=device) + draft_rows  # [D]
        return _Layout(row, offset, offset < nd[row], draft_position, nd, start)
    counts = np.asarray(num_drafts, dtype=np.int64)
    if counts.ndim != 1 or (counts < 0).any():
        raise ValueError("num_drafts must be a list of non-negative counts, one per row")
    if int(counts.sum()) + len(counts) != num_positions:
        raise ValueError(f"logits has {num_positions} positions but num_drafts {counts.tolist()} needs "
                         f"{int(counts.sum()) + len(counts)} (num_drafts[r] + 1 per row)")
    row = position_rows(counts)  # [P]
    start = np.cumsum(counts + 1) - (counts + 1)  # [R]
    offset = np.arange(num_positions) - start[row]  # [P]
    is_draft = offset < counts[row]  # [P]
    # one copy to the device: [row, offset, is_draft] (3P), then [num_drafts, start] (2R), then the D draft positions
    flat = _to_device(np.concatenate([row, offset, is_draft, counts, start, np.flatnonzero(is_draft)]),
                      torch.int64, device)
    P, R = num_positions, len(counts)
    return _Layout(flat[:P], flat[P:2 * P], flat[2 * P:3 * P].bool(), flat[3 * P + 2 * R:], flat[3 * P:3 * P + R],
                   flat[3 * P + R:3 * P + 2 * R])


def _uniforms(md: SamplingMetadata, n: int, device: torch.device) -> torch.Tensor:
    """[n] float32 in [0, 1): from the batch generator, and for each seeded position from its own."""
    u = torch.rand(n, device=device, generator=md.generator) if len(md.seeded) < n else torch.empty(n, device=device)
    for pos, gen in md.seeded:  # a Python loop over the SEEDED positions only
        u[pos:pos + 1] = torch.rand(1, device=device, generator=gen)
    return u


def _accept_and_recover(x: torch.Tensor, draft_at: torch.Tensor, draft_probs: torch.Tensor | None,
                        layout: _Layout, md: SamplingMetadata) -> tuple[torch.Tensor, torch.Tensor]:
    """Random positions: ``(accepted [P] bool, recovered [P] int64)`` from processed logits ``x`` ([P, V]): the
    acceptance test of each position's draft, and a draw from its residual (from ``q`` itself at a position
    without a draft, the bonus)."""
    q = torch.softmax(apply_sampling_filters(x, md), dim=-1)  # [P, V]
    q_draft = q.gather(1, draft_at.unsqueeze(1)).squeeze(1)  # [P]
    u = _uniforms(md, q.shape[0], q.device)  # [P]
    if draft_probs is None:  # p = onehot(draft): accept with probability q(draft); the residual is q without it
        accepted = u < q_draft
        kept = torch.where(layout.is_draft, torch.zeros_like(q_draft), q_draft)  # [P]
        residual = q.scatter_(1, draft_at.unsqueeze(1), kept.unsqueeze(1))  # [P, V], in place of q
    else:
        p = torch.zeros_like(q)  # [P, V]: the proposer's distribution at each draft's position, 0 at the bonus
        p.index_copy_(0, layout.draft_position, draft_probs.to(torch.float32))
        accepted = u * p.gather(1, draft_at.unsqueeze(1)).squeeze(1) < q_draft
        residual = q.sub(p).clamp_min_(0.0)  # [P, V]
        # q <= p everywhere means q == p up to rounding (acceptance ~1): a rejection then draws from q itself
        empty = (residual.amax(dim=-1) <= 0).to(q.dtype)  # [P]
        residual.addcmul_(empty.unsqueeze(1), q)
    return accepted, _exponential_race(residual, md)


def rejection_sample(
    logits: torch.Tensor,
    num_drafts: Sequence[int] | torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    md: SamplingMetadata,
    *,
    triton: bool = False,
) -> SpecSamplerOutput:
    """Verify the rows' drafts against the target's ``logits`` ([P, V], ``P = sum(num_drafts[r] + 1)``, row
    ``r``'s positions consecutive) and draw the tokens each row emits.

    ``num_drafts``: drafts per row, a host list or an int tensor [R] (then read on the device only).
    ``draft_token_ids``: [D] int64, the drafts of all rows in order (``D = sum(num_drafts)``). ``draft_probs``:
    [D, V], the proposer's distribution each draft was drawn from, or None for a deterministic proposer (each
    draft had probability 1). ``md``: one row per position (``spec_metadata.build_spec_sampling_metadata``).
    ``triton``: apply grammar masks with the Triton kernel (where Triton runs).
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [num_positions, V], got {tuple(logits.shape)}")
    num_positions, vocab = logits.shape
    if md.batch_size != num_positions:
        raise ValueError(f"the sampling metadata has {md.batch_size} rows but logits has {num_positions} positions: "
                         "build it with one row per position (minivllm.sample.spec_metadata)")
    if md.watermark_rows is not None:
        raise ValueError("watermarked rows cannot be verified by rejection sampling (the watermark's keyed noise "
                         "decides their tokens): sample them without drafts")
    layout = _layout(num_drafts, num_positions, logits.device)
    num_draft_tokens = layout.draft_position.shape[0]
    if draft_token_ids.shape != (num_draft_tokens,):
        raise ValueError(f"draft_token_ids must be [{num_draft_tokens}] (sum of num_drafts), got "
                         f"{tuple(draft_token_ids.shape)}")
    if draft_probs is not None and draft_probs.shape != (num_draft_tokens, vocab):
        raise ValueError(f"draft_probs must be [{num_draft_tokens}, {vocab}] or None, got {tuple(draft_probs.shape)}")

    draft_at = torch.zeros(num_positions, dtype=torch.int64, device=logits.device)  # [P]: 0 at bonus positions
    draft_at.index_copy_(0, layout.draft_position, draft_token_ids.to(torch.int64))
    x = logits if md.all_greedy and not modifies_logits(md) else process_logits(logits, md, triton)  # [P, V]
    if md.all_greedy:
        recovered = torch.argmax(x, dim=-1)  # [P]
        accepted = recovered == draft_at
    else:
        greedy = torch.argmax(x, dim=-1) if md.greedy_mask is not None else None  # [P], before the filters
        accepted, recovered = _accept_and_recover(x, draft_at, draft_probs, layout, md)
        if greedy is not None:
            accepted = torch.where(md.greedy_mask, greedy == draft_at, accepted)
            recovered = torch.where(md.greedy_mask, greedy, recovered)

    # a row accepts its drafts up to the first rejection: the smallest offset that stops it (its last always does)
    stop_at = torch.where(layout.is_draft & accepted, num_positions, layout.offset)  # [P]
    num_accepted = torch.full_like(layout.num_drafts, num_positions).scatter_reduce_(
        0, layout.row, stop_at, "amin")  # [R]
    reached = num_accepted.index_select(0, layout.row)  # [P]
    tokens = torch.where(layout.offset < reached, draft_at, recovered)  # [P]
    lp = gather_logprobs(logits, tokens, md)  # the same fields as the plain sampler's, per position
    return SpecSamplerOutput(sampled_token_ids=tokens, num_accepted=num_accepted, emitted=layout.offset <= reached,
                             last_token_ids=tokens.index_select(0, layout.start + num_accepted),
                             num_drafts=layout.num_drafts, **(vars(lp) if lp is not None else {}))
