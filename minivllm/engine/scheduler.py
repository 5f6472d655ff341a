"""Token-budget scheduler (vLLM V1 style): decode first, chunked prefill, mixed steps. Pure Python."""

from __future__ import annotations

from collections import deque

from minivllm.engine.block_manager import BlockManager
from minivllm.engine.scheduler_output import SchedulerOutput
from minivllm.engine.sequence import PLACEHOLDER, Sequence, SequenceStatus

__all__ = ["Scheduler", "SchedulerOutput"]


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
    """

    def __init__(self, block_manager: BlockManager, *, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int, eos_token_ids: list[int] | None = None,
                 enable_chunked_prefill: bool = True, max_num_partial_prefills: int = 1,
                 max_long_partial_prefills: int = 1, long_prefill_threshold: int = 0):
        if block_manager.num_blocks * block_manager.block_size < max_model_len:
            raise ValueError(
                f"the KV cache holds {block_manager.num_blocks} blocks x {block_manager.block_size} tokens = "
                f"{block_manager.num_blocks * block_manager.block_size} tokens, fewer than max_model_len "
                f"({max_model_len}): one sequence could never finish; raise num_kvcache_blocks or "
                f"lower max_model_len")
        self.block_manager = block_manager
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
        self.num_preemptions = 0

    # ----------------------------------------------------------------- queues
    def add(self, seq: Sequence) -> None:
        """Queue a new sequence (FCFS)."""
        if seq.num_tokens > self.max_model_len:
            raise ValueError(f"sequence of {seq.num_tokens} tokens exceeds max_model_len {self.max_model_len}")
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

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
        """Pick this step's rows; allocates their slots and may preempt. See the class docstring."""
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        scheduled_ids: set[int] = set()
        num_partial = num_long_partial = 0

        decodes = [s for s in self.running if not s.is_prefilling]
        prefills = [s for s in self.running if s.is_prefilling]
        for seq in decodes + prefills:
            if budget <= 0:
                break
            if seq.status != SequenceStatus.RUNNING:  # preempted earlier in this loop
                continue
            if seq.num_pending_tokens and self._ends_by_length(seq):
                continue  # NOTE: its pending token is its last one; computing it would be wasted
            remaining = seq.num_uncomputed_tokens
            num_new = min(remaining, budget, self._chunk_cap())
            while not self.block_manager.allocate_slots(seq, num_new):
                victim = self._pick_victim(seq, scheduled_ids)
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
            if seq.status != SequenceStatus.RUNNING:
                continue
            if num_new < remaining:
                num_partial += 1
                num_long_partial += self._is_long(remaining)
            self._add_row(out, seq, num_new)
            scheduled_ids.add(seq.seq_id)
            budget -= num_new

        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not out.preempted:
            seq = self.waiting[0]
            if seq.num_pending_tokens:  # preempted while its token was in flight: wait for the value
                break
            computed = self.block_manager.get_computed_blocks(seq)
            remaining = seq.num_tokens - len(computed) * self.block_manager.block_size
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
            out.num_cached_tokens += seq.num_cached_tokens
            out.num_admitted_tokens += seq.num_tokens
            self._add_row(out, seq, num_new)
            scheduled_ids.add(seq.seq_id)
            budget -= num_new
        return out

    @staticmethod
    def _add_row(out: SchedulerOutput, seq: Sequence, num_new: int) -> None:
        out.scheduled.append((seq, num_new))
        if seq.is_prefilling:
            out.num_prefill_tokens += num_new
        else:
            out.num_decode_tokens += num_new

    def _pick_victim(self, seq: Sequence, scheduled_ids: set[int]) -> Sequence:
        """The unscheduled running sequence (or ``seq`` itself) with the fewest computed tokens, newest first."""
        candidates = [s for s in self.running if s.seq_id not in scheduled_ids]
        return min(candidates, key=lambda s: (s.num_computed_tokens, -s.seq_id))

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        self.running.remove(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    # ---------------------------------------------------------- postprocess
    def postprocess(self, out: SchedulerOutput, sampled_token_ids: list[int]) -> list[Sequence]:
        """``advance`` then ``resolve`` in one go (synchronous scheduling); returns the updated sequences."""
        return [seq for _, seq in self.resolve(self.advance(out), sampled_token_ids)]

    def advance(self, out: SchedulerOutput) -> list[Sequence]:
        """Account for a launched step: advance computed counts, append a placeholder per sampled row.

        Returns the sampled sequences in row order (the order of the step's sampled tokens).
        """
        sampled: list[Sequence] = []
        for seq, num_new in out.scheduled:
            seq.num_computed_tokens += num_new
            if seq.num_computed_tokens == seq.num_tokens:
                seq.append_placeholder(len(sampled))
                sampled.append(seq)
        return sampled

    def resolve(self, seqs: list[Sequence], sampled_token_ids: list[int]) -> list[tuple[int, Sequence]]:
        """Write a step's sampled tokens (row ``i`` -> ``seqs[i]``), finish stopped sequences.

        Rows of sequences that finished meanwhile (a stop found one step earlier, an abort) are
        dropped. Returns ``(row, sequence)`` for each sequence that received a token.
        """
        if len(seqs) != len(sampled_token_ids):
            raise RuntimeError(f"{len(sampled_token_ids)} sampled tokens for {len(seqs)} sampled rows")
        updated: list[tuple[int, Sequence]] = []
        any_finished = False
        for row, (seq, token_id) in enumerate(zip(seqs, sampled_token_ids)):
            if seq.status == SequenceStatus.FINISHED:
                continue
            seq.resolve_token(token_id)
            updated.append((row, seq))
            reason = self._check_stop(seq, token_id)
            if reason is not None:
                if seq.status == SequenceStatus.WAITING:  # preempted while its token was in flight
                    self.waiting.remove(seq)
                self._finish(seq, reason, stop_reason=token_id if reason == "stop" else None)
                any_finished = True
        if any_finished:
            self.running = [s for s in self.running if s.status == SequenceStatus.RUNNING]
        return updated

    def _ends_by_length(self, seq: Sequence) -> bool:
        """Whether the sequence, with its pending tokens, has reached max_tokens or max_model_len."""
        max_tokens = seq.sampling_params.max_tokens
        return ((max_tokens is not None and seq.num_completion_tokens >= max_tokens)
                or seq.num_tokens >= self.max_model_len)

    def _check_stop(self, seq: Sequence, token_id: int) -> str | None:
        """Why ``seq`` stops at its newest known token ``token_id`` (None: it goes on)."""
        params = seq.sampling_params
        num_completion = seq.num_known_completion_tokens
        if num_completion >= params.min_tokens:
            if token_id in params.stop_token_ids:
                return "stop"
            if not params.ignore_eos and token_id in self.eos_token_ids:
                return "stop"
        if params.max_tokens is not None and num_completion >= params.max_tokens:
            return "length"
        if seq.num_known_tokens >= self.max_model_len:
            return "length"
        return None

    def _finish(self, seq: Sequence, reason: str, stop_reason: int | str | None = None) -> None:
        seq.drop_pending()
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.stop_reason = stop_reason
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
            assert seq.num_computed_tokens <= seq.num_tokens
            bs = self.block_manager.block_size
            assert len(seq.block_table) >= (seq.num_computed_tokens + bs - 1) // bs
        for seq in self.waiting:
            assert seq.status == SequenceStatus.WAITING and not seq.block_table
        ids = [s.seq_id for s in self.running] + [s.seq_id for s in self.waiting]
        assert len(ids) == len(set(ids)), "a sequence is queued twice"
        return self.block_manager.check_integrity(self.running)
