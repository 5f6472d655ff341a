"""The runner's persistent batch, and the host-side inputs of one forward step built from it (numpy, no torch).

``InputBatch`` keeps what a step's ``SchedulerOutput`` no longer repeats: each running sequence's block table
(a row of one array, extended by the step's new block ids), its sampling parameters and bad words. A step then
costs host work in proportion to its rows and new tokens, not to the context its sequences hold.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from minivllm.core.scheduler_output import NewRequestData, ScheduledRow, SchedulerOutput
from minivllm.sampling_params import SamplingParams


@dataclass(frozen=True)
class StepInputs:
    """One step's flattened batch as numpy arrays (the same on every tensor-parallel rank)."""

    input_ids: np.ndarray  # [num_tokens] int64
    positions: np.ndarray  # [num_tokens] int64
    slot_mapping: np.ndarray  # [num_tokens] int64
    cu_seqlens_q: np.ndarray  # [num_rows + 1] int32
    context_lens: np.ndarray  # [num_rows] int32
    block_tables: np.ndarray  # [num_rows, max_blocks] int32, -1 padded
    # [num_sampled] int64, flat token index of each sampled row's last token (a row with d drafts: of its last
    # d + 1 tokens, in order)
    sample_indices: np.ndarray
    max_seqlen_q: int
    max_context_len: int
    is_decode: bool
    is_fresh_prefill: bool
    # asynchronous scheduling: input_ids[prev_token_index[i]] is a placeholder whose value
    # is row prev_token_src[i] of the previous step's sampled-token tensor (on the device).
    prev_token_index: np.ndarray | None = None  # [num_placeholders] int64
    prev_token_src: np.ndarray | None = None  # [num_placeholders] int64
    # flat token indices whose logits give prompt logprobs (rows' ``prompt_logprobs``, in row order); None: none
    prompt_logprob_index: np.ndarray | None = None  # [num_prompt_positions] int64
    # each KV cache group's past the first (a hybrid model), in group order: its slot mapping and block tables
    group_slot_mappings: tuple[np.ndarray, ...] = ()  # each [num_tokens] int64
    group_block_tables: tuple[np.ndarray, ...] = ()  # each [num_rows, max_blocks] int32, -1 padded

    @property
    def num_rows(self) -> int:
        return len(self.context_lens)


class InputBatch:
    """The running sequences as the runner knows them, one slot each: ``update`` applies a step's news (who
    left, who is new, which blocks were added), ``prepare_inputs`` flattens the step's rows.

    ``max_num_seqs`` slots of ``ceil(max_model_len / block_size)`` block ids each, in each of ``num_groups`` KV
    cache groups (``block_table``: group 0's; ``group_block_tables``: the others', positions aligned). A sliding
    window's released block (``NULL_BLOCK``) is stored as block 0: a real block, which the kernels never read
    unmasked (it lies before every query's window).

    ``track_tokens`` (speculative decoding): each slot also keeps its sequence's token ids (``token_ids``, its
    first ``num_tokens`` entries), sent whole when the sequence is new to the runner and extended with each step's
    new tokens (``append_tokens``); the n-gram proposer reads them.
    """

    def __init__(self, max_num_seqs: int, max_model_len: int, block_size: int, num_groups: int = 1,
                 track_tokens: bool = False):
        self.block_size = block_size
        self.max_blocks = -(-max_model_len // block_size)
        self.block_table = np.full((max_num_seqs, self.max_blocks), -1, dtype=np.int32)  # [slots, max_blocks]
        self.group_block_tables = [np.full_like(self.block_table, -1) for _ in range(num_groups - 1)]
        self.num_blocks = np.zeros(max_num_seqs, dtype=np.int64)  # [slots]
        self.slots: dict[int, int] = {}  # seq id -> slot
        self.params: dict[int, SamplingParams] = {}  # seq id -> its sampling parameters
        self.bad_words: dict[int, tuple[tuple[int, ...], ...]] = {}  # seq id -> its bad words' token ids
        self._free = list(range(max_num_seqs - 1, -1, -1))
        self.token_ids = np.zeros((max_num_seqs, max_model_len), dtype=np.int32) if track_tokens else None
        self.num_tokens = np.zeros(max_num_seqs, dtype=np.int32)  # [slots]: tokens held in ``token_ids``

    def update(self, out: SchedulerOutput) -> None:
        """Forget the sequences that left, take the new ones whole, extend the block tables of the others."""
        for seq_id in out.finished_seq_ids:
            slot = self.slots.pop(seq_id, None)
            if slot is None:
                continue
            for table in (self.block_table, *self.group_block_tables):
                table[slot, :self.num_blocks[slot]] = -1
            self.num_blocks[slot] = 0
            self._free.append(slot)
            self.params.pop(seq_id, None)
            self.bad_words.pop(seq_id, None)
        for req in out.new_requests:
            if req.seq_id in self.slots:
                raise RuntimeError(f"sequence {req.seq_id} is new to the runner but holds a slot")
            if not self._free:
                raise RuntimeError("the runner's batch is full: the scheduler ran more than max_num_seqs sequences")
            slot = self.slots[req.seq_id] = self._free.pop()
            self._append_blocks(slot, req.block_ids, req.group_block_ids)
            if self.token_ids is not None:
                if req.all_token_ids is None:
                    raise RuntimeError(f"sequence {req.seq_id} came without its token ids, which the batch keeps")
                self.num_tokens[slot] = 0
                self.append_tokens(slot, req.all_token_ids)
            self.params[req.seq_id] = req.params
            if req.bad_words_token_ids:
                self.bad_words[req.seq_id] = req.bad_words_token_ids
        for row in out.rows:
            if row.new_block_ids:
                self._append_blocks(self.slots[row.seq_id], row.new_block_ids, row.new_group_block_ids or ())

    def append_tokens(self, slot: int, token_ids) -> None:
        """Extend slot ``slot``'s token ids (``track_tokens``) by ``token_ids``, up to ``max_model_len``."""
        n = int(self.num_tokens[slot])
        k = min(len(token_ids), self.token_ids.shape[1] - n)
        self.token_ids[slot, n:n + k] = token_ids[:k]
        self.num_tokens[slot] = n + k

    def _append_blocks(self, slot: int, block_ids: tuple[int, ...],
                       group_block_ids: tuple[tuple[int, ...], ...] = ()) -> None:
        n, k = int(self.num_blocks[slot]), len(block_ids)
        if n + k > self.max_blocks:
            raise RuntimeError(f"a block table of {n + k} blocks exceeds max_model_len")
        if len(group_block_ids) != len(self.group_block_tables):
            raise RuntimeError(f"block ids of {len(group_block_ids) + 1} KV cache groups for "
                               f"{len(self.group_block_tables) + 1}")
        for table, ids in zip((self.block_table, *self.group_block_tables), (block_ids, *group_block_ids)):
            if len(ids) != k:
                raise RuntimeError("the KV cache groups' block tables differ in length")
            table[slot, n:n + k] = ids
            np.maximum(table[slot, n:n + k], 0, out=table[slot, n:n + k])  # NULL_BLOCK -> block 0
        self.num_blocks[slot] = n + k

    def prepare_inputs(self, out: SchedulerOutput) -> StepInputs:
        """Flatten the step's rows: tokens ``[num_computed, num_computed + n)`` of each sequence."""
        rows = out.rows
        num_rows = len(rows)
        slots = np.fromiter((self.slots[r.seq_id] for r in rows), dtype=np.int64, count=num_rows)  # [rows]
        starts = np.fromiter((r.num_computed_tokens for r in rows), dtype=np.int64, count=num_rows)  # [rows]
        q_lens = np.fromiter((len(r.token_ids) for r in rows), dtype=np.int64, count=num_rows)  # [rows]
        cu = np.zeros(num_rows + 1, dtype=np.int64)
        np.cumsum(q_lens, out=cu[1:])
        total = int(cu[-1])
        if total == num_rows:  # one token a row
            input_ids = np.fromiter((r.token_ids[0] for r in rows), dtype=np.int64, count=num_rows)
            positions = starts
            token_slots = slots
        else:
            input_ids = np.fromiter(itertools.chain.from_iterable(r.token_ids for r in rows), dtype=np.int64,
                                    count=total)
            positions = np.arange(total, dtype=np.int64) + np.repeat(starts - cu[:-1], q_lens)  # [tokens]
            token_slots = np.repeat(slots, q_lens)  # [tokens]
        bs = self.block_size
        block_index, offset = positions // bs, positions % bs  # [tokens]
        slot_mapping = self.block_table[token_slots, block_index].astype(np.int64) * bs + offset
        context_lens = starts + q_lens
        width = int(self.num_blocks[slots].max()) if num_rows else 0
        block_tables = self.block_table[slots, :width]  # [rows, width]; fancy indexing copies
        group_slots = tuple(t[token_slots, block_index].astype(np.int64) * bs + offset
                            for t in self.group_block_tables)
        group_tables = tuple(t[slots, :width] for t in self.group_block_tables)
        if out.num_draft_tokens:  # a row with drafts is verified at its last 1 + drafts positions
            sample_indices = np.fromiter(
                itertools.chain.from_iterable(range(cu[i + 1] - 1 - r.num_draft_tokens, cu[i + 1])
                                              for i, r in enumerate(rows) if r.sampled), dtype=np.int64)
        else:
            sample_indices = np.fromiter((cu[i + 1] - 1 for i, r in enumerate(rows) if r.sampled), dtype=np.int64)
        ph = [(cu[i], r.prev_sampled_row) for i, r in enumerate(rows) if r.prev_sampled_row >= 0]
        prompt_index: list[int] = []
        for i, r in enumerate(rows):
            if r.prompt_logprobs is not None:
                prompt_index.extend(range(cu[i], cu[i] + len(r.prompt_logprobs[1])))
        return StepInputs(
            input_ids=input_ids,
            positions=positions,
            slot_mapping=slot_mapping,
            cu_seqlens_q=cu.astype(np.int32),
            context_lens=context_lens.astype(np.int32),
            block_tables=block_tables,
            sample_indices=sample_indices,
            max_seqlen_q=int(q_lens.max()) if num_rows else 0,
            max_context_len=int(context_lens.max()) if num_rows else 0,
            is_decode=bool(num_rows) and total == num_rows,
            is_fresh_prefill=bool((starts == 0).all()),
            prev_token_index=np.asarray([i for i, _ in ph], dtype=np.int64) if ph else None,
            prev_token_src=np.asarray([s for _, s in ph], dtype=np.int64) if ph else None,
            prompt_logprob_index=np.asarray(prompt_index, dtype=np.int64) if prompt_index else None,
            group_slot_mappings=group_slots,
            group_block_tables=group_tables,
        )

    def check_integrity(self) -> None:
        """Slots are held once, free slots hold nothing, and every table is -1 past its length."""
        held = list(self.slots.values())
        assert len(set(held)) == len(held) and not set(held) & set(self._free), "a slot is held twice or also free"
        assert len(held) + len(self._free) == self.block_table.shape[0], "a slot is lost"
        assert self.params.keys() == self.slots.keys() and self.bad_words.keys() <= self.slots.keys()
        for table in (self.block_table, *self.group_block_tables):
            for slot in range(table.shape[0]):
                n = int(self.num_blocks[slot])
                assert (table[slot, n:] == -1).all(), f"slot {slot} holds block ids past its length"
                assert (table[slot, :n] >= 0).all(), f"slot {slot} has an unset block id"


def dummy_prefill_inputs(num_seqs: int, seq_len: int, block_size: int, num_groups: int = 1) -> StepInputs:
    """The inputs of ``num_seqs`` fresh prompts of ``seq_len`` tokens (id 0) over blocks ``0, 1, ...`` (in every KV
    cache group), every row sampled: the profiling forward's, which sizes the KV cache."""
    per_seq = -(-seq_len // block_size)
    batch = InputBatch(num_seqs, seq_len, block_size, num_groups)
    params = SamplingParams()
    tables = [tuple(range(i * per_seq, (i + 1) * per_seq)) for i in range(num_seqs)]
    new = tuple(NewRequestData(i, params, tables[i], None, None, (), (tables[i],) * (num_groups - 1))
                for i in range(num_seqs))
    rows = tuple(ScheduledRow(i, 0, (0,) * seq_len, (), -1, True, 0) for i in range(num_seqs))
    out = SchedulerOutput(rows, rows, new)
    batch.update(out)
    return batch.prepare_inputs(out)
