"""Token-budget scheduler (vLLM V1 style): decode first, chunked prefill, mixed steps. Pure Python."""

from __future__ import annotations

import functools
from collections import deque

from minivllm.core.block_manager import BlockManager
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.scheduler_output import NewRequestData, ScheduledRow, SchedulerOutput
from minivllm.core.sequence import PLACEHOLDER, Sequence, SequenceStatus
from minivllm.core.stop import check_stop, ends_by_length

__all__ = ["Scheduler", "SchedulerOutput"]

# a ScheduledRow (a SchedulerOutput) from a tuple of its fields in order, without the NamedTuple's
# keyword-handling __new__: one per row per step
_row = functools.partial(tuple.__new__, ScheduledRow)
_output = functools.partial(tuple.__new__, SchedulerOutput)


class Scheduler:
    """Decides, each step, which sequences compute how many tokens.

    Order within the ``max_num_batched_tokens`` budget: running decode sequences (one token
    each), then running partial prefills, then new sequences from the waiting queue (FCFS).
    A prompt that does not fit what is left of the budget (or exceeds
    ``long_prefill_threshold``) is computed in chunks; it stays RUNNING meanwhile and is
    sampled only once every token is computed. When blocks run out, the running sequence
    with the least progress is preempted: its blocks are freed and it goes back to the head
    of the waiting queue, to be recomputed (its full blocks usually come back from the
    prefix cache).

    ``schedule`` returns a frozen ``SchedulerOutput`` and accounts for the step at once (computed
    counts advance, each sampled row appends a placeholder token); ``update_from_output`` later writes
    the step's sampled tokens and finishes the sequences that stop. The output is a delta against what the
    runner already holds: the scheduler remembers how many block ids of each running sequence it has sent
    (``_runner_blocks``) and which sequences left since the last output (``_gone``).

    ``block_manager``: one ``BlockManager`` (a one-group cache), or a ``KVCacheManager`` of several KV cache
    groups; either way the scheduler works through a ``KVCacheManager`` (``self.block_manager``). Groups past the
    first send their blocks in ``NewRequestData.group_block_ids`` / ``ScheduledRow.new_group_block_ids``.

    Speculative decoding (``num_speculative_tokens > 0``): a decode row also computes its sequence's drafts
    (``Sequence.spec_token_ids``, from the previous step's output), as many as the token budget, ``max_tokens``
    and ``max_model_len`` leave room for. Their slots are allocated as lookahead and the computed count advances
    past them; ``update_from_output`` rolls the count back by the drafts rejected. No drafts are scheduled in a
    step of more than ``disable_by_batch_size`` running sequences, nor for a sequence that cannot speculate
    (``Sequence.can_speculate``), nor after a pending token. NOTE: a step with drafts must be updated before the
    next one is scheduled (the engine resolves it first): how many tokens it adds is known only then.
    """

    def __init__(self, block_manager: BlockManager | KVCacheManager, *, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int, eos_token_ids: list[int] | None = None,
                 enable_chunked_prefill: bool = True, max_num_partial_prefills: int = 1,
                 max_long_partial_prefills: int = 1, long_prefill_threshold: int = 0,
                 num_speculative_tokens: int = 0, disable_by_batch_size: int | None = None):
        if isinstance(block_manager, BlockManager):
            block_manager = KVCacheManager([block_manager])
        block_manager.check_fits(max_model_len, max_num_batched_tokens)
        self.block_manager = block_manager
        self.num_groups = block_manager.num_groups
        # a running sequence's allocation (no prefix hits): the one group's own method when there is one
        self._grow = block_manager.managers[0].allocate_slots if self.num_groups == 1 else block_manager.allocate_slots
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.eos_token_ids = set(eos_token_ids or [])
        self.enable_chunked_prefill = enable_chunked_prefill
        self.max_num_partial_prefills = max_num_partial_prefills
        self.max_long_partial_prefills = max_long_partial_prefills
        self.long_prefill_threshold = long_prefill_threshold
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.seqs: dict[int, Sequence] = {}  # every unfinished sequence, by id
        self.num_preemptions = 0
        self._runner_blocks: dict[int, int] = {}  # seq id -> block ids the runner holds (sent in earlier outputs)
        # NOTE: the runner's tables keep the ids of blocks a sliding window released since (never sent as
        # NULL_BLOCK): the kernels read no key before a query's window, so a stale id there is never read unmasked
        self._gone: list[int] = []  # sequences the runner held that left the running set since the last output
        self.num_speculative_tokens = num_speculative_tokens
        self.disable_by_batch_size = disable_by_batch_size
        self._drafts_in_flight: dict[int, int] = {}  # seq id -> drafts its row computes in the step not yet updated

    # ----------------------------------------------------------------- queues
    def add(self, seq: Sequence) -> None:
        """Queue a new sequence (FCFS)."""
        if seq.num_tokens > self.max_model_len:
            raise ValueError(f"sequence of {seq.num_tokens} tokens exceeds max_model_len {self.max_model_len}")
        if seq.seq_id in self.seqs:
            raise ValueError(f"sequence id {seq.seq_id} is already scheduled")
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)
        self.seqs[seq.seq_id] = seq

    def is_finished(self) -> bool:
        return not self.waiting and not self.running

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    # ------------------------------------------------------------- scheduling
    def _chunk_cap(self) -> int:
        return self.long_prefill_threshold if self.long_prefill_threshold > 0 else 1 << 62

    def _is_long(self, num_tokens: int) -> bool:
        return 0 < self.long_prefill_threshold < num_tokens

    def schedule(self) -> SchedulerOutput:
        """Pick this step's rows, allocate their slots (preempting if needed) and account for the step."""
        scheduled: list[tuple[Sequence, int]] = []
        preempted: list[Sequence] = []
        num_cached = num_admitted = 0
        budget = self.max_num_batched_tokens
        scheduled_ids: set[int] = set()
        num_partial = num_long_partial = 0

        decodes = [s for s in self.running if not s.is_prefilling]
        prefills = [s for s in self.running if s.is_prefilling]
        speculate = self.may_speculate()
        for seq in decodes + prefills:
            if budget <= 0:
                break
            if seq.status != SequenceStatus.RUNNING:  # preempted earlier in this loop
                continue
            if seq.num_pending_tokens and ends_by_length(seq, self.max_model_len):
                continue  # its pending token is its last one; computing it would be wasted
            remaining = seq.num_uncomputed_tokens
            num_new = min(remaining, budget, self._chunk_cap())
            num_drafts = self._num_drafts(seq, budget) if speculate and seq.spec_token_ids else 0
            seq.spec_token_ids = seq.spec_token_ids[:num_drafts]
            while not self._grow(seq, num_new, None, num_drafts):
                if num_drafts:  # drop the drafts before preempting anyone
                    num_drafts, seq.spec_token_ids = 0, []
                    continue
                victim = self._pick_victim(seq, scheduled_ids)
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            if seq.status != SequenceStatus.RUNNING:
                continue
            if num_new < remaining:
                num_partial += 1
                num_long_partial += self._is_long(remaining)
            scheduled.append((seq, num_new))
            scheduled_ids.add(seq.seq_id)
            budget -= num_new + num_drafts

        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not preempted:
            seq = self.waiting[0]
            if seq.num_pending_tokens:  # preempted while its token was in flight: wait for the value
                break
            computed = self.block_manager.get_computed_blocks(seq)
            remaining = seq.num_tokens - len(computed[0]) * self.block_manager.block_size
            num_new = min(remaining, budget, self._chunk_cap())
            if num_new < remaining:
                if not self.enable_chunked_prefill or num_partial >= self.max_num_partial_prefills:
                    break
                if self._is_long(remaining) and num_long_partial >= self.max_long_partial_prefills:
                    break
            if not self.block_manager.allocate_slots(seq, num_new, computed):
                break
            if num_new < remaining:
                num_partial += 1
                num_long_partial += self._is_long(remaining)
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            num_cached += seq.num_cached_tokens
            num_admitted += seq.num_tokens
            scheduled.append((seq, num_new))
            scheduled_ids.add(seq.seq_id)
            budget -= num_new
        return self._output(scheduled, preempted, num_cached, num_admitted)

    def may_speculate(self) -> bool:
        """Whether the next ``schedule`` may give rows drafts: speculation is on and the running batch is no
        larger than ``disable_by_batch_size``. Otherwise a step in flight need not report before it (the engine
        then keeps scheduling one step ahead)."""
        return self.num_speculative_tokens > 0 and (
            self.disable_by_batch_size is None or len(self.running) <= self.disable_by_batch_size)

    def _num_drafts(self, seq: Sequence, budget: int) -> int:
        """How many of ``seq``'s drafts a decode row computes this step: within what is left of the token budget,
        and no more than ``max_tokens`` and ``max_model_len`` leave room for after its newest token."""
        if seq.is_prefilling or seq.num_pending_tokens or not seq.can_speculate:
            return 0
        room = min(budget, self.max_model_len - seq.num_tokens)
        max_tokens = seq.sampling_params.max_tokens
        if max_tokens is not None:
            room = min(room, max_tokens - seq.num_completion_tokens)
        return max(0, min(len(seq.spec_token_ids), room - 1))

    def _output(self, scheduled: list[tuple[Sequence, int]], preempted: list[Sequence], num_cached: int,
                num_admitted: int) -> SchedulerOutput:
        """The step's frozen output of the ``(sequence, new tokens)`` rows ``scheduled``; then advance each row's
        computed count and give each sampled row a placeholder for its token (its value arrives with
        ``update_from_output``)."""
        rows: list[ScheduledRow] = []
        sampled: list[ScheduledRow] = []
        new: list[NewRequestData] = []
        num_prefill = num_decode = num_draft = 0
        tables, known = self.block_manager.block_table, self._runner_blocks
        group_tables = self.block_manager.group_tables if self.num_groups > 1 else None
        for seq, n in scheduled:
            seq_id, start, tokens = seq.seq_id, seq.num_computed_tokens, seq.token_ids
            num_tokens = len(tokens)
            prev_row = -1
            drafts = seq.spec_token_ids
            if drafts:
                if start != num_tokens - 1 or seq.num_pending_tokens:
                    raise RuntimeError(f"drafts scheduled for a sequence that is not decoding a known token: {seq}")
                ids = (tokens[start], *drafts)
                num_draft += len(drafts)
                self._drafts_in_flight[seq_id] = len(drafts)
                seq.spec_token_ids = []
            elif n == 1:
                token = tokens[start]
                if token == PLACEHOLDER:
                    if start != num_tokens - 1:
                        raise RuntimeError(f"only the newest placeholder can be an input: {seq}")
                    token, prev_row = 0, seq.pending_row
                ids = (token,)
            else:
                if start + n > num_tokens - seq.num_pending_tokens:
                    raise RuntimeError(f"a chunk of {n} tokens reaches a pending placeholder: {seq}")
                ids = tuple(tokens[start:start + n])
            if num_tokens - start > 1:
                num_prefill += n
            else:
                num_decode += n + len(ids) - 1
            table = tables(seq_id)
            held = known.get(seq_id)
            new_groups = None
            if held is None:
                new.append(self._new_request(seq, table, group_tables(seq_id)[1:] if group_tables else ()))
                new_blocks = ()
            else:
                new_blocks = table[held:] if len(table) > held else ()
                if group_tables is not None and new_blocks:  # every group's table has the same length
                    new_groups = tuple(t[held:] for t in group_tables(seq_id)[1:])
            known[seq_id] = len(table)
            seq.num_computed_tokens = start + len(ids)
            prompt_lps = seq.prompt_logprob_targets(start, n) if seq.prompt_logprobs is not None else None
            if start + n < num_tokens:
                rows.append(_row((seq_id, start, ids, new_blocks, prev_row, False, 0, None, prompt_lps, None,
                                  new_groups, 0)))
                continue
            tail = seq.output_tail() if seq.reads_output_values else None
            row = _row((seq_id, start, ids, new_blocks, prev_row, True, num_tokens - seq.num_prompt_tokens, tail,
                        prompt_lps, seq.forced_token() if seq.thinking_budget is not None else None, new_groups,
                        len(ids) - n))
            rows.append(row)
            seq.append_placeholder(len(sampled))
            sampled.append(row)
        gone = ()
        if rows:  # NOTE: an empty step is never launched, so its news would not reach the runner
            gone, self._gone = tuple(self._gone), []
        return _output((tuple(rows), tuple(sampled), tuple(new), gone, num_prefill, num_decode,
                        tuple(s.seq_id for s in preempted), num_cached, num_admitted, num_draft))

    def _new_request(self, seq: Sequence, table: tuple[int, ...],
                     group_tables: tuple[tuple[int, ...], ...]) -> NewRequestData:
        """What the runner keeps of a sequence it has not seen; the token values sampling reads only if it does,
        and every token when speculating (the proposer reads them)."""
        params = seq.sampling_params
        prompt = output = None
        if params.has_penalties:
            # all known: a sequence waits for its pending token before it runs again after a preemption
            output = tuple(seq.token_ids[seq.num_prompt_tokens:])
            if params.repetition_penalty != 1.0:
                prompt = tuple(seq.token_ids[:seq.num_prompt_tokens])
        all_ids = tuple(seq.token_ids[:seq.num_known_tokens]) if self.num_speculative_tokens else None
        return NewRequestData(seq.seq_id, params, table, prompt, output, seq.bad_words_token_ids, group_tables,
                              all_ids)

    def _pick_victim(self, seq: Sequence, scheduled_ids: set[int]) -> Sequence:
        """The unscheduled running sequence (or ``seq`` itself) with the fewest computed tokens, newest first."""
        candidates = [s for s in self.running if s.seq_id not in scheduled_ids]
        return min(candidates, key=lambda s: (s.num_computed_tokens, -s.seq_id))

    def _forget(self, seq: Sequence) -> None:
        """The runner may drop ``seq`` (it left the running set): named in the next output."""
        if self._runner_blocks.pop(seq.seq_id, None) is not None:
            self._gone.append(seq.seq_id)
        self._drafts_in_flight.pop(seq.seq_id, None)
        seq.spec_token_ids = []

    def _preempt(self, seq: Sequence) -> None:
        self._forget(seq)
        self.block_manager.free(seq)
        self.running.remove(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    # ------------------------------------------------------------ outputs
    def update_from_output(self, out: SchedulerOutput, sampled_token_ids: list[int] | list[list[int]],
                           draft_token_ids: list[list[int]] | None = None) -> list[tuple[int, Sequence]]:
        """Write a step's sampled tokens (row ``i`` -> ``out.sampled[i]``), finish stopped sequences.

        ``sampled_token_ids[i]``: the row's token, or (speculative decoding) the list of its new tokens: the drafts
        it accepted, then the token sampled after them; the computed count is rolled back by the drafts it
        rejected, and tokens after one that stops the sequence are dropped (``Sequence.num_new_tokens``: how many
        were appended). ``draft_token_ids[i]``: the drafts proposed after them, for the next step.

        Rows of sequences that finished meanwhile (a stop found one step earlier, an abort) are
        dropped. Returns ``(row, sequence)`` for each sequence that received a token.
        """
        if len(out.sampled) != len(sampled_token_ids):
            raise RuntimeError(f"{len(sampled_token_ids)} sampled tokens for {len(out.sampled)} sampled rows")
        updated: list[tuple[int, Sequence]] = []
        any_finished = False
        for row, (s, new_ids) in enumerate(zip(out.sampled, sampled_token_ids)):
            seq = self.seqs.get(s.seq_id)
            if seq is None:  # finished meanwhile
                continue
            if isinstance(new_ids, int):
                new_ids = (new_ids,)
            elif len(new_ids) - 1 > s.num_draft_tokens or not new_ids:
                raise RuntimeError(f"{len(new_ids)} new tokens for a row of {s.num_draft_tokens} drafts: {seq}")
            if s.num_draft_tokens:  # the rejected drafts' slots are computed again, with the right tokens
                self._drafts_in_flight.pop(seq.seq_id, None)
                seq.num_computed_tokens -= s.num_draft_tokens - (len(new_ids) - 1)
            updated.append((row, seq))
            reason = token_id = None
            for i, token_id in enumerate(new_ids):
                if i == 0:
                    seq.resolve_token(token_id)
                else:
                    seq.append_token(token_id)
                seq.num_new_tokens = i + 1
                reason = check_stop(seq, token_id, self.max_model_len, self.eos_token_ids)
                if reason is not None:
                    break
            if reason is not None:
                if seq.num_computed_tokens >= seq.num_tokens:  # an accepted draft stopped it
                    seq.num_computed_tokens = seq.num_tokens - 1
                if seq.status == SequenceStatus.WAITING:  # preempted while its token was in flight
                    self.waiting.remove(seq)
                self._finish(seq, reason, stop_reason=token_id if reason == "stop" else None)
                any_finished = True
            elif self.num_speculative_tokens:
                # drafts follow this token: none when another is already pending after it (a step scheduled
                # ahead), nor when the step proposed none
                usable = draft_token_ids is not None and seq.can_speculate and not seq.num_pending_tokens
                seq.spec_token_ids = list(draft_token_ids[row][:self.num_speculative_tokens]) if usable else []
        if any_finished:
            self.running = [s for s in self.running if s.status == SequenceStatus.RUNNING]
        return updated

    def _finish(self, seq: Sequence, reason: str, stop_reason: int | str | None = None) -> None:
        del self.seqs[seq.seq_id]
        seq.drop_pending()
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.stop_reason = stop_reason
        self._forget(seq)
        self.block_manager.free(seq)

    def finish(self, seq: Sequence, reason: str, stop_reason: int | str | None = None) -> None:
        """Finish a sequence from outside (a stop string, an abort) and free its blocks now."""
        if seq.status == SequenceStatus.FINISHED:
            return
        if seq.status == SequenceStatus.WAITING:
            self.waiting.remove(seq)
        else:
            self.running.remove(seq)
        self._finish(seq, reason, stop_reason)

    def check_integrity(self) -> dict[str, int]:
        """Assert queue and block invariants; returns the block manager's counts."""
        assert len(self.running) <= self.max_num_seqs
        for seq in self.running:
            assert seq.status == SequenceStatus.RUNNING
            assert 0 <= seq.num_pending_tokens <= 2, f"{seq}: {seq.num_pending_tokens} pending tokens"
            assert all(t == PLACEHOLDER for t in seq.token_ids[seq.num_known_tokens:])
            in_flight = self._drafts_in_flight.get(seq.seq_id, 0)
            assert seq.num_computed_tokens <= seq.num_tokens + in_flight - (1 if in_flight else 0), (
                f"{seq}: computed past its tokens and its {in_flight} drafts in flight")
            assert len(seq.spec_token_ids) <= self.num_speculative_tokens, f"{seq}: too many drafts"
            assert not (in_flight and seq.spec_token_ids), f"{seq}: new drafts before its drafts were verified"
            assert not (seq.num_pending_tokens and seq.spec_token_ids), f"{seq}: drafts after a pending token"
            bs = self.block_manager.block_size
            assert len(self.block_manager.block_table(seq.seq_id)) >= (seq.num_computed_tokens + bs - 1) // bs
            self.block_manager.check_window(seq)
        for seq in self.waiting:
            assert seq.status == SequenceStatus.WAITING and not self.block_manager.block_table(seq.seq_id)
            assert not seq.spec_token_ids, f"{seq}: a waiting sequence keeps drafts"
        assert self._drafts_in_flight.keys() <= {s.seq_id for s in self.running}, "drafts in flight of a gone seq"
        ids = [s.seq_id for s in self.running] + [s.seq_id for s in self.waiting]
        assert len(ids) == len(set(ids)), "a sequence is queued twice"
        assert set(ids) == self.seqs.keys(), "the id map and the queues disagree"
        holders = {s.seq_id for s in self.running}
        assert self.block_manager.seq_ids <= holders, "a sequence off the running list holds blocks"
        assert self._runner_blocks.keys() <= holders, "the runner is told of a sequence that is not running"
        assert not set(self._gone) & self._runner_blocks.keys(), "a sequence both held and gone"
        for seq_id, n in self._runner_blocks.items():
            assert n <= len(self.block_manager.block_table(seq_id)), f"sequence {seq_id}: runner holds {n} blocks"
        return self.block_manager.check_integrity()
