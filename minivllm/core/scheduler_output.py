"""What the scheduler decides for one step, as a frozen snapshot: the runner reads it, never a ``Sequence``.

Pure Python. The runner keeps a persistent batch (``worker/input_batch.py``), so a step carries only what
changed since the last one, as in vLLM V1: a sequence the runner has not seen comes whole, once
(``NewRequestData``: its parameters and its whole block table); every scheduled row, new or running, carries
its delta (``ScheduledRow``: the tokens it computes this step and the blocks added since the runner's last
view, vLLM's ``CachedRequestData``); and sequences that left the running set (finished, aborted or
preempted) are named once in ``finished_seq_ids`` so the runner can forget them. Built by
``Scheduler.schedule`` after the step's rows are allocated and accounted for, so the sequences may change
afterwards without touching it.
"""

from __future__ import annotations

from typing import NamedTuple

from minivllm.sampling_params import SamplingParams


class NewRequestData(NamedTuple):
    """A sequence the runner has not seen: new, or running again after a preemption. Sent once."""

    seq_id: int
    params: SamplingParams  # the engine's copy of the request's parameters
    block_ids: tuple[int, ...]  # its whole block table after this step's allocation
    # the token ids sampling reads, only when it reads them: the prompt's for a repetition penalty, the
    # generated ones for any penalty (a sequence back from a preemption); None otherwise
    prompt_token_ids: tuple[int, ...] | None
    output_token_ids: tuple[int, ...] | None
    # each bad word's token ids (derived by the engine's tokenizer from ``params.bad_words``)
    bad_words_token_ids: tuple[tuple[int, ...], ...] = ()
    # the whole block table of each KV cache group past the first (a hybrid model), in group order; a sliding
    # window's released blocks are ``NULL_BLOCK`` (-1)
    group_block_ids: tuple[tuple[int, ...], ...] = ()
    # every token id it holds (speculative decoding: the n-gram proposer reads the runner's copy); None otherwise
    all_token_ids: tuple[int, ...] | None = None


class ScheduledRow(NamedTuple):
    """One row of the step: a sequence computing ``len(token_ids)`` new tokens."""

    seq_id: int
    num_computed_tokens: int  # tokens whose K/V are already cached: the first new token's position
    token_ids: tuple[int, ...]  # the new tokens (0 where ``prev_sampled_row`` gives the value)
    new_block_ids: tuple[int, ...]  # blocks added to its table since the runner's last view
    prev_sampled_row: int  # >= 0: the one new token is that row of the previous step's sampled tokens
    sampled: bool  # every token is computed after this step: the row's last token is sampled
    num_output_tokens: int  # tokens generated before this step's (the seed's step, min_tokens)
    # the newest generated tokens, for a sampled row that reads them (``Sequence.output_tail``: multi-token bad
    # words, the watermark); None otherwise
    output_tail: tuple[int, ...] | None = None
    # (k, targets): the row's new tokens at positions p with p + 1 < prompt length also give the logprob of
    # prompt token p + 1 (``targets``, in order) and its k most likely alternatives (-1: all of them); None: no
    # prompt logprobs
    prompt_logprobs: tuple[int, tuple[int, ...]] | None = None
    # the token a sampled row must take (``thinking_token_budget`` forcing the end of its reasoning); None: free
    forced_token: int | None = None
    # the blocks added to each KV cache group's table past the first (a hybrid model) since the runner's last
    # view; None: no group past the first, or no block added
    new_group_block_ids: tuple[tuple[int, ...], ...] | None = None
    # speculative decoding: the last ``num_draft_tokens`` of ``token_ids`` are drafts after the sequence's newest
    # token; the row is verified at each of its last ``num_draft_tokens + 1`` positions
    num_draft_tokens: int = 0


class SchedulerOutput(NamedTuple):
    """One step: ``rows`` in batch order, the ``sampled`` ones among them (the order of the step's sampled
    tokens), the sequences the runner sees for the first time, the ones it may forget, and the step's counts.
    Immutable (a tuple)."""

    rows: tuple[ScheduledRow, ...] = ()
    sampled: tuple[ScheduledRow, ...] = ()
    new_requests: tuple[NewRequestData, ...] = ()
    finished_seq_ids: tuple[int, ...] = ()  # left the running set since the last step (before ``new_requests``)
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    preempted_seq_ids: tuple[int, ...] = ()
    num_cached_tokens: int = 0  # prefix-cache hit tokens of the sequences admitted this step
    num_admitted_tokens: int = 0  # tokens of the sequences admitted this step (hit-rate denominator)
    num_draft_tokens: int = 0  # speculative drafts among the decode tokens

    @property
    def num_batched_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def is_decode_only(self) -> bool:
        return self.num_prefill_tokens == 0 and self.num_decode_tokens > 0

    @property
    def is_empty(self) -> bool:
        return not self.rows
