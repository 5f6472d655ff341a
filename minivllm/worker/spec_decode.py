"""The model runner's speculative-decoding step (rank 0): verify each sampled row's drafts against the target,
keep the rows' token history, and ask the proposer for the next step's drafts.

A row with ``d`` drafts owns ``d + 1`` consecutive positions of the step's logits: the target's distribution
after its newest token and after each draft. ``rejection_sample`` (``minivllm.sample.rejection_sampler``) decides
what each row emits, its metadata built with one row per position (``minivllm.sample.spec_metadata``: the
drafts before a position count as generated tokens); greedy rows get the target's tokens exactly, random ones its
distribution.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import torch

from minivllm.sample.rejection_sampler import rejection_sample
from minivllm.sample.spec_metadata import build_spec_sampling_metadata
from minivllm.spec_decode.proposer import DraftProposal, Proposer, ProposerInputs, no_drafts
from minivllm.worker.input_batch import InputBatch, StepInputs
from minivllm.worker.kv_cache import block_bytes
from minivllm.worker.outputs import SampledTokens
from minivllm.worker.step_handle import StepHandle


def proposer_block_bytes(step: SpeculativeStep | None, block_size: int, dtype: torch.dtype, num_groups: int) -> int:
    """What a model-based proposer's cache (which mirrors KV cache group 0's blocks) adds to each block of the
    target's (0 without speculation or without a model)."""
    if step is None or not step.proposer_layers:
        return 0
    if num_groups > 1:
        raise ValueError("a model-based speculative method needs a target of one KV cache group (no "
                         "sliding-window layers)")
    return block_bytes(step.proposer_layers, block_size, dtype)


class SpeculativeStep:
    """Rank 0's speculative sampling and proposing (see the module docstring); the runner calls ``sample`` in
    place of its plain sampling when a proposer is configured."""

    def __init__(self, proposer: Proposer, batch: InputBatch, disable_by_batch_size: int | None):
        self.proposer = proposer
        self.batch = batch
        self.k = proposer.num_speculative_tokens
        self.disable_by_batch_size = disable_by_batch_size
        self.needs_every_step = getattr(proposer, "needs_every_step", True)
        # a model-based proposer's attention layers: their own KV cache mirrors group 0's blocks
        self.proposer_layers = proposer.attention_layers() if hasattr(proposer, "attention_layers") else []
        # seq id -> [n, V] the distributions its pending drafts were drawn from (a proposer that samples them)
        self.draft_probs: dict[int, torch.Tensor] = {}
        # steps sampled without speculation (above disable_by_batch_size), oldest first: {seq id: row} and the
        # step's handle, whose tokens join the history once they reach the host
        self.deferred: deque[tuple[dict[int, int], StepHandle]] = deque()

    def init_proposer_cache(self, num_blocks: int, block_size: int, max_num_seqs: int, dtype: torch.dtype) -> None:
        """Allocate a model-based proposer's cache over the target's ``num_blocks`` block ids (a no-op else)."""
        if self.proposer_layers:
            self.proposer.init_kv_cache(num_blocks, block_size, max_num_seqs, dtype)

    def verifies(self, out) -> bool:
        """Whether a step goes through ``sample``: it has drafts to verify, or its batch may propose. A larger
        batch without drafts is sampled by the plain sampler (the host does not wait for its tokens)."""
        limit = self.disable_by_batch_size
        return out.num_draft_tokens > 0 or self.needs_every_step or limit is None or len(out.rows) <= limit

    def defer(self, sampled_rows, handle: StepHandle) -> None:
        """A step sampled without speculation: its tokens join the history later (those already on the host now)."""
        self.deferred.append(({r.seq_id: i for i, r in enumerate(sampled_rows)}, handle))
        while self.deferred and self.deferred[0][1].resolved:
            self._drain_one()

    def forget_deferred(self, seq_ids) -> None:
        """Sequences the runner got whole again (their history included): their deferred tokens are not added."""
        if self.deferred:
            for seq_id in seq_ids:
                for rows, _ in self.deferred:
                    rows.pop(seq_id, None)

    def _drain_one(self) -> None:
        rows, handle = self.deferred.popleft()
        token_ids, slots = handle.result().token_ids, self.batch.slots
        for seq_id, i in rows.items():
            if seq_id in slots:
                self.batch.append_tokens(slots[seq_id], (token_ids[i],))

    def sample(self, runner, fwd, inp: StepInputs, grammar=None) -> SampledTokens:
        """Verify the step's drafts, record the new tokens and propose the next drafts: the step's host results.
        ``runner``: the ``ModelRunner`` (its sampler, penalties, generator and batch)."""
        while self.deferred:  # the history is whole before anything is proposed from it
            self._drain_one()
        rows = fwd.out.sampled
        num_drafts = [r.num_draft_tokens for r in rows]
        drafts = [r.token_ids[len(r.token_ids) - r.num_draft_tokens:] for r in rows]
        starts = np.cumsum([0] + [d + 1 for d in num_drafts]).tolist()  # [rows + 1]: each row's first position
        seq_ids = [r.seq_id for r in rows]
        penalized = any(p.has_penalties for p in fwd.params)
        md = build_spec_sampling_metadata(
            fwd.params, [()] * len(rows), [r.output_tail or () for r in rows], drafts, runner.eos_token_ids,
            runner.device, runner.vocab_size, runner.generator,
            grammar=(grammar.rows, grammar.bitmask) if grammar is not None else None,  # by position
            bad_words=fwd.bad_words, num_generated=[r.num_output_tokens for r in rows],
            penalty_tensors=runner.penalties.gather(seq_ids) if penalized else None,
            forced_tokens=[r.forced_token for r in rows] if any(r.forced_token is not None for r in rows) else None)
        flat = torch.tensor([t for d in drafts for t in d], dtype=torch.int64).to(runner.device)  # [D]
        probs = self._verified_probs(seq_ids, num_drafts, drafts, fwd.logits.shape[1])
        res = rejection_sample(fwd.logits, num_drafts, flat, probs, md, triton=runner.sampler.fused)
        tokens = res.token_id_lists()  # one copy to the host
        runner.prev_sampled = res.last_token_ids  # [rows]: a step scheduled ahead reads them (no drafts then)
        if runner.penalties.rows:
            runner.penalties.record(seq_ids, res.sampled_token_ids, num_drafts, res.emitted)
        lengths = [len(t) for t in tokens]
        row_starts = np.cumsum([0] + lengths).tolist()
        out = SampledTokens([t for ts in tokens for t in ts], row_starts=row_starts,
                            num_draft_tokens=sum(num_drafts), num_drafts=sum(1 for d in num_drafts if d))
        out.accepted_per_pos = [sum(1 for d, n in zip(num_drafts, lengths) if d > i and n > i + 1)
                                for i in range(self.k)]
        if res.logprobs is not None and any(p.num_logprobs is not None for p in fwd.params):
            self._logprobs(out, res, [starts[r] + j for r, n in enumerate(lengths) for j in range(n)], fwd.params)
        for r, seq_id in enumerate(seq_ids):
            self.batch.append_tokens(self.batch.slots[seq_id], tokens[r])
        proposal = self._propose(runner, fwd, inp, lengths, out)
        out.draft_token_ids = [proposal.token_ids[i, :n].tolist() for i, n in enumerate(proposal.num_drafts)
                               if fwd.out.rows[i].sampled]
        for i, row in enumerate(fwd.out.rows):  # every sampled row's drafts are new: so are their distributions
            if row.sampled:
                n = int(proposal.num_drafts[i])
                if proposal.probs is not None and n:
                    self.draft_probs[row.seq_id] = proposal.probs[i, :n]
                else:
                    self.draft_probs.pop(row.seq_id, None)
        return out

    def update(self, out) -> None:
        """A step's news (a ``SchedulerOutput``, as the batch takes it): drop what is kept of the sequences that
        left, the proposer's too; the new ones' token history came whole."""
        for seq_id in out.finished_seq_ids:
            self.draft_probs.pop(seq_id, None)
        if out.finished_seq_ids:
            self.proposer.remove(out.finished_seq_ids)
        if out.new_requests:
            self.forget_deferred(r.seq_id for r in out.new_requests)

    def _verified_probs(self, seq_ids: list[int], num_drafts: list[int], drafts: list[tuple[int, ...]],
                        vocab: int) -> torch.Tensor | None:
        """``[D, V]`` the distributions the step's drafts were drawn from (the scheduler may have cut a row's
        drafts: its first ones), or None when every draft is deterministic. A deterministic draft among sampled
        ones has a one-hot distribution."""
        kept = [self.draft_probs.get(s) if d else None for s, d in zip(seq_ids, num_drafts)]
        given = [k for k in kept if k is not None]
        if not given:
            return None
        parts = []
        for k, d, ids in zip(kept, num_drafts, drafts):
            if not d:
                continue
            if k is None:
                k = torch.zeros(d, vocab, dtype=torch.float32, device=given[0].device)  # [d, V]
                k[torch.arange(d), torch.tensor(ids)] = 1.0
            parts.append(k[:d].to(torch.float32))
        return torch.cat(parts)  # [D, V]

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
        ``disable_by_batch_size``: a proposer that needs every step still sees it, asked for no drafts)."""
        all_rows = fwd.out.rows
        n = len(all_rows)
        disabled = self.disable_by_batch_size is not None and n > self.disable_by_batch_size
        if n == 0 or (disabled and not self.needs_every_step):
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
