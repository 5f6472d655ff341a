"""What the scheduler decides for one step, as a frozen snapshot: the runner reads it, never a ``Sequence``.

Pure Python. Built by ``Scheduler.schedule`` after the step's rows are allocated and accounted for, so the
sequences may change afterwards (the next step's scheduling, a stop, an abort) without touching it.
"""

from __future__ import annotations

from typing import NamedTuple

from minivllm.sampling_params import SamplingParams


class ScheduledSeq(NamedTuple):
    """One row of the step: a sequence computing ``len(token_ids)`` new tokens.

    A sampled row (``params`` set) also carries what sampling needs; only rows that read token
    values (``penalty_token_ids``: the prompt's and the output's), since only penalties and bad words of
    several tokens read them.
    """

    seq_id: int
    num_computed_tokens: int  # tokens whose K/V are already cached: the first new token's position
    token_ids: tuple[int, ...]  # the new tokens (0 where ``prev_sampled_row`` gives the value)
    block_ids: tuple[int, ...]  # the sequence's whole block table after this step's allocation
    prev_sampled_row: int  # >= 0: the one new token is that row of the previous step's sampled tokens
    params: SamplingParams | None  # None: not sampled (a chunk of a prompt that goes on)
    num_output_tokens: int  # tokens generated before this step's (the seed's step, min_tokens)
    penalty_token_ids: tuple[tuple[int, ...], tuple[int, ...]] | None
    # (k, targets): the row's new tokens at positions p with p + 1 < prompt length also give the logprob of
    # prompt token p + 1 (``targets``, in order) and its k most likely alternatives; None: no prompt logprobs
    prompt_logprobs: tuple[int, tuple[int, ...]] | None = None

    @property
    def sampled(self) -> bool:
        """Every token is computed after this step: the row's last token is sampled."""
        return self.params is not None


class SchedulerOutput(NamedTuple):
    """One step: ``rows`` in batch order, the ``sampled`` ones among them (the order of the step's sampled
    tokens), and the step's counts. Immutable (a tuple)."""

    rows: tuple[ScheduledSeq, ...] = ()
    sampled: tuple[ScheduledSeq, ...] = ()
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    preempted_seq_ids: tuple[int, ...] = ()
    num_cached_tokens: int = 0  # prefix-cache hit tokens of the sequences admitted this step
    num_admitted_tokens: int = 0  # tokens of the sequences admitted this step (hit-rate denominator)

    @property
    def num_batched_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def is_decode_only(self) -> bool:
        return self.num_prefill_tokens == 0 and self.num_decode_tokens > 0

    @property
    def is_empty(self) -> bool:
        return not self.rows
