"""The model runner's speculative-decoding step (rank 0): verify each sampled row's drafts against the target,
keep the rows' token history, and ask the proposer for the next step's drafts.

A row with ``d`` drafts owns ``d + 1`` consecutive positions of the step's logits: the target's distribution
after its newest token and after each draft. Every position is sampled as the plain sampler samples one row,
with the row's parameters and the position's own step number (``num_output_tokens + j``: seeded rows draw what
the same request draws without speculation, and ``min_tokens`` counts the drafts before it); penalties count the
drafts before the position as generated tokens. The row then keeps its drafts while each equals the token the
target sampled at its position, and the target's token at the first position where they differ (or after the
last draft): for a deterministic proposer (n-gram: each draft has probability 1) this is exactly rejection
sampling (a draft ``t`` is accepted with probability ``p(t)``, and on a rejection the token is drawn from ``p``
without ``t``, renormalized), so greedy outputs are the target's token for token and random ones keep its
distribution.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from minivllm.sample.metadata import build_sampling_metadata
from minivllm.spec_decode.proposer import DraftProposal, Proposer, ProposerInputs, no_drafts
from minivllm.worker.input_batch import InputBatch, StepInputs
from minivllm.worker.outputs import SampledTokens


def position_layout(num_drafts: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(row [P], j [P], starts [rows + 1])`` of a step whose row ``r`` owns ``num_drafts[r] + 1`` positions: each
    position's row and index within it, and each row's first position."""
    counts = np.asarray(num_drafts, dtype=np.int64) + 1  # [rows]
    starts = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    rows = np.repeat(np.arange(len(counts)), counts)  # [P]
    j = np.arange(int(starts[-1]), dtype=np.int64) - starts[rows]  # [P]
    return rows, j, starts


def accepted_lengths(target: Sequence[int], drafts: Sequence[Sequence[int]], starts: np.ndarray) -> list[int]:
    """Each row's new-token count: ``1 +`` the drafts that equal the target's token at their position, up to the
    first that does not (``target``: the token sampled at each position)."""
    out = []
    for r, row_drafts in enumerate(drafts):
        s, m = int(starts[r]), 0
        while m < len(row_drafts) and row_drafts[m] == target[s + m]:
            m += 1
        out.append(m + 1)
    return out


class SpeculativeStep:
    """Rank 0's speculative sampling and proposing (see the module docstring); the runner calls ``sample`` in
    place of its plain sampling when a proposer is configured."""

    def __init__(self, proposer: Proposer, batch: InputBatch, disable_by_batch_size: int | None):
        self.proposer = proposer
        self.batch = batch
        self.k = proposer.num_speculative_tokens
        self.disable_by_batch_size = disable_by_batch_size

    def sample(self, runner, fwd, inp: StepInputs, grammar=None) -> SampledTokens:
        """Verify the step's drafts, record the new tokens and propose the next drafts: the step's host results.
        ``runner``: the ``ModelRunner`` (its sampler, penalties, generator and batch)."""
        rows = fwd.out.sampled
        num_drafts = [r.num_draft_tokens for r in rows]
        drafts = [r.token_ids[len(r.token_ids) - r.num_draft_tokens:] for r in rows]
        pos_row, pos_j, starts = position_layout(num_drafts)
        pos_row, pos_j = pos_row.tolist(), pos_j.tolist()
        seq_ids = [r.seq_id for r in rows]
        params = [fwd.params[r] for r in pos_row]
        penalized = any(p.has_penalties for p in fwd.params)
        grammar_arg = None
        if grammar is not None:  # NOTE: a row under a grammar has no drafts: its one position is its first
            grammar_arg = ([int(starts[r]) for r in grammar.rows], grammar.bitmask)
        md = build_sampling_metadata(
            params, [()] * len(params), [rows[r].output_tail or () for r in pos_row], runner.eos_token_ids,
            runner.device, runner.vocab_size, runner.generator, grammar=grammar_arg,
            bad_words=[fwd.bad_words[r] for r in pos_row] if fwd.bad_words is not None else None,
            num_generated=[rows[r].num_output_tokens + j for r, j in zip(pos_row, pos_j)],
            penalty_tensors=self._penalties(runner, seq_ids, pos_row, pos_j, drafts) if penalized else None,
            watermark=runner.watermark,
            forced_tokens=[rows[r].forced_token for r in pos_row]
            if any(s.forced_token is not None for s in rows) else None)
        res = runner.sampler(fwd.logits, md)
        target = res.sampled_token_ids.tolist()  # [P]
        lengths = accepted_lengths(target, drafts, starts)
        keep = [int(starts[r]) + j for r, n in enumerate(lengths) for j in range(n)]  # positions of new tokens
        new_ids = [target[p] for p in keep]
        row_starts = [0]
        for n in lengths:
            row_starts.append(row_starts[-1] + n)
        if runner.penalties.rows:
            runner.penalties.record([seq_ids[pos_row[p]] for p in keep], torch.tensor(new_ids, dtype=torch.int64,
                                                                                        device=runner.device))
        out = SampledTokens(new_ids, row_starts=row_starts, num_draft_tokens=sum(num_drafts),
                            num_drafts=sum(1 for d in num_drafts if d))
        out.accepted_per_pos = [sum(1 for d, n in zip(num_drafts, lengths) if d > i and n > i + 1)
                                for i in range(self.k)]
        if res.logprobs is not None and any(p.num_logprobs is not None for p in fwd.params):
            self._logprobs(out, res, keep, fwd.params)
        for r, seq_id in enumerate(seq_ids):
            self.batch.append_tokens(self.batch.slots[seq_id], out.tokens_of(r))
        proposal = self._propose(runner, fwd, inp, lengths, out)
        out.draft_token_ids = [proposal.token_ids[i, :n].tolist() for i, n in enumerate(proposal.num_drafts)
                               if fwd.out.rows[i].sampled]
        return out

    @staticmethod
    def _penalties(runner, seq_ids: list[int], pos_row: np.ndarray, pos_j: np.ndarray,
                   drafts: list[tuple[int, ...]]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(output_counts [P, V], prompt_mask [P, V])`` of each position: its row's, with the drafts before it
        counted as generated."""
        counts, prompt_mask = runner.penalties.gather([seq_ids[r] for r in pos_row])
        at = [(p, t) for p, (r, j) in enumerate(zip(pos_row, pos_j)) for t in drafts[r][:j]]
        if at:
            index = torch.tensor(at, dtype=torch.int64, device=counts.device)  # [n, 2]
            counts.index_put_((index[:, 0], index[:, 1]), torch.ones(len(at), device=counts.device), accumulate=True)
        return counts, prompt_mask

    @staticmethod
    def _logprobs(out: SampledTokens, res, keep: list[int], params) -> None:
        """The logprobs of the kept positions (each row's ``logprob_token_ids`` or top alternatives)."""
        index = torch.tensor(keep, dtype=torch.int64, device=res.logprobs.device)
        out.logprobs = res.logprobs[index].tolist()
        out.num_top = [p.num_logprobs for p in params]
        out.top_ids = res.top_logprobs_ids[index].tolist() if res.top_logprobs_ids is not None else [[]] * len(keep)
        out.top_logprobs = res.top_logprobs[index].tolist() if res.top_logprobs is not None else [[]] * len(keep)
        out.chosen_ids = [p.logprob_token_ids for p in params]
        if res.token_id_logprobs is not None:
            out.chosen_logprobs = res.token_id_logprobs[index].tolist()

    def catch_up(self, runner, fwd) -> None:
        """A step without sampled rows (prefill chunks): a model-based proposer still computes its tokens into
        its own KV cache (it drafts nothing)."""
        self._propose(runner, fwd, fwd.inputs, [], None)

    def _propose(self, runner, fwd, inp: StepInputs, lengths: list[int], out: SampledTokens | None) -> DraftProposal:
        """The proposer's drafts for every row of the step (none for rows not sampled, nor past
        ``disable_by_batch_size``: a model-based proposer is still called then, to keep its KV cache)."""
        all_rows = fwd.out.rows
        n = len(all_rows)
        disabled = self.disable_by_batch_size is not None and n > self.disable_by_batch_size
        if n == 0 or (disabled and not runner.proposer_layers):
            return no_drafts(n, self.k)
        batch = self.batch
        slots = np.fromiter((batch.slots[r.seq_id] for r in all_rows), dtype=np.int64, count=n)
        sampled = np.fromiter((r.sampled for r in all_rows), dtype=bool, count=n)
        accepted = np.zeros(n, dtype=np.int32)
        next_ids = np.full(n, -1, dtype=np.int64)
        accepted[sampled] = np.asarray(lengths, dtype=np.int32) - 1
        if lengths:
            next_ids[sampled] = [out.tokens_of(r)[-1] for r in range(len(lengths))]
        device = runner.device
        inputs = ProposerInputs(
            seq_ids=tuple(r.seq_id for r in all_rows), slots=slots, token_ids=batch.token_ids,
            num_tokens=batch.num_tokens[slots], num_accepted=accepted, next_token_ids=next_ids,
            max_drafts=np.where(sampled & (not disabled), self.k, 0).astype(np.int32),
            input_ids=torch.from_numpy(inp.input_ids).to(device), positions=torch.from_numpy(inp.positions).to(device),
            slot_mapping=torch.from_numpy(inp.slot_mapping).to(device), cu_seqlens_q=inp.cu_seqlens_q,
            block_tables=inp.block_tables, hidden_states=fwd.hidden_states)
        return self.proposer.propose(inputs)
