"""The scheduler's step as a frozen ``SchedulerOutput``, and the accounting that goes with it. Pure Python."""

from __future__ import annotations

import functools
from collections.abc import Callable

from minivllm.core.scheduler_output import ScheduledSeq, SchedulerOutput
from minivllm.core.sequence import PLACEHOLDER, Sequence

# NOTE: a ScheduledSeq (a SchedulerOutput) from a tuple of its fields in order, without the NamedTuple's
# keyword-handling __new__ (twice as fast; one per row per step)
_row = functools.partial(tuple.__new__, ScheduledSeq)
_output = functools.partial(tuple.__new__, SchedulerOutput)


def snapshot(scheduled: list[tuple[Sequence, int]], preempted: list[Sequence], num_cached: int, num_admitted: int,
             tables: Callable[[int], tuple[int, ...]]) -> SchedulerOutput:
    """The step's frozen output of the ``(sequence, new tokens)`` rows ``scheduled``; then advance each row's
    computed count and give each sampled row a placeholder for its token (its value arrives with
    ``Scheduler.update_from_output``). ``tables(seq_id)``: a sequence's block table."""
    rows: list[ScheduledSeq] = []
    sampled: list[ScheduledSeq] = []
    num_prefill = num_decode = 0
    for seq, n in scheduled:
        start, tokens = seq.num_computed_tokens, seq.token_ids
        num_tokens = len(tokens)
        prev_row = -1
        if n == 1:
            new = (tokens[start],)
            if new[0] == PLACEHOLDER:
                if start != num_tokens - 1:
                    raise RuntimeError(f"only the newest placeholder can be an input: {seq}")
                new, prev_row = (0,), seq.pending_row
        else:
            if start + n > num_tokens - seq.num_pending_tokens:
                raise RuntimeError(f"a chunk of {n} tokens reaches a pending placeholder: {seq}")
            new = tuple(tokens[start:start + n])
        if num_tokens - start > 1:
            num_prefill += n
        else:
            num_decode += n
        seq.num_computed_tokens = start + n
        prompt_lps = seq.prompt_logprob_targets(start, n) if seq.prompt_logprobs is not None else None
        if start + n < num_tokens:
            rows.append(_row((seq.seq_id, start, new, tables(seq.seq_id), prev_row, None, 0, None, prompt_lps)))
            continue
        params = seq.sampling_params
        penalty_ids = ((tuple(tokens[:seq.num_prompt_tokens]), tuple(tokens[seq.num_prompt_tokens:]))
                       if params.needs_output_tokens else None)
        row = _row((seq.seq_id, start, new, tables(seq.seq_id), prev_row, params,
                    num_tokens - seq.num_prompt_tokens, penalty_ids, prompt_lps))
        rows.append(row)
        seq.append_placeholder(len(sampled))
        sampled.append(row)
    return _output((tuple(rows), tuple(sampled), num_prefill, num_decode,
                    tuple(s.seq_id for s in preempted), num_cached, num_admitted))
