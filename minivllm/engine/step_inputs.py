"""Host-side inputs of one forward step, built from a SchedulerOutput with numpy (no torch).

This is what rank 0 hands to every tensor-parallel rank: plain arrays, cheap to pickle.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minivllm.engine.scheduler import SchedulerOutput
from minivllm.engine.sequence import PLACEHOLDER


@dataclass
class StepInputs:
    input_ids: np.ndarray  # [num_tokens] int64
    positions: np.ndarray  # [num_tokens] int64
    slot_mapping: np.ndarray  # [num_tokens] int64
    cu_seqlens_q: np.ndarray  # [num_rows + 1] int32
    context_lens: np.ndarray  # [num_rows] int32
    block_tables: np.ndarray  # [num_rows, max_blocks] int32, -1 padded
    sample_indices: np.ndarray  # [num_sampled] int64, flat token index of each sampled row's last token
    max_seqlen_q: int
    max_context_len: int
    is_decode: bool
    is_fresh_prefill: bool
    # NOTE: asynchronous scheduling: input_ids[prev_token_index[i]] is a placeholder whose value
    # is row prev_token_src[i] of the previous step's sampled-token tensor (on the device).
    prev_token_index: np.ndarray | None = None  # [num_placeholders] int64
    prev_token_src: np.ndarray | None = None  # [num_placeholders] int64
    # NOTE: tensor parallel: set by rank 0 when every rank samples its own vocabulary slice this
    # step (minivllm.layers.sharded_sampling); None: rank 0 gathers the logits and samples.
    sample_temperatures: np.ndarray | None = None  # [num_sampled] float32, 0.0 on greedy rows

    @property
    def num_rows(self) -> int:
        return len(self.context_lens)


def build_step_inputs(out: SchedulerOutput, block_size: int) -> StepInputs:
    """Flatten the scheduled rows: tokens ``[num_computed, num_computed + n)`` of each sequence."""
    num_rows = len(out.scheduled)
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    cu = [0]
    ctx: list[int] = []
    sample: list[int] = []
    ph_index: list[int] = []
    ph_src: list[int] = []
    max_blocks = 0
    fresh = True
    for seq, n in out.scheduled:
        start = seq.num_computed_tokens
        end = start + n
        table = seq.block_table
        if n == 1:
            token = seq.token_ids[start]
            if token == PLACEHOLDER:
                if start != seq.num_tokens - 1:
                    raise RuntimeError(f"only the newest placeholder can be an input: {seq}")
                ph_index.append(len(input_ids))
                ph_src.append(seq.pending_row)
            input_ids.append(token)
            positions.append(start)
            slots.append(table[start // block_size] * block_size + start % block_size)
        else:
            if end > seq.num_known_tokens:
                raise RuntimeError(f"a chunk of {n} tokens reaches a pending placeholder: {seq}")
            input_ids.extend(seq.token_ids[start:end])
            pos = np.arange(start, end)
            positions.extend(pos.tolist())
            slots.extend((np.asarray(table, dtype=np.int64)[pos // block_size] * block_size
                          + pos % block_size).tolist())
        fresh &= start == 0
        cu.append(cu[-1] + n)
        ctx.append(end)
        if end == seq.num_tokens:
            sample.append(cu[-1] - 1)
        max_blocks = max(max_blocks, len(table))
    # NOTE: one numpy call for the whole padded table (a per-row slice assignment costs ~1 us a row)
    block_tables = np.array([seq.block_table + [-1] * (max_blocks - len(seq.block_table))
                             for seq, _ in out.scheduled], dtype=np.int32).reshape(num_rows, max_blocks)
    cu_arr = np.asarray(cu, dtype=np.int32)
    q_lens = np.diff(cu_arr)
    return StepInputs(
        input_ids=np.asarray(input_ids, dtype=np.int64),
        positions=np.asarray(positions, dtype=np.int64),
        slot_mapping=np.asarray(slots, dtype=np.int64),
        cu_seqlens_q=cu_arr,
        context_lens=np.asarray(ctx, dtype=np.int32),
        block_tables=block_tables,
        sample_indices=np.asarray(sample, dtype=np.int64),
        max_seqlen_q=int(q_lens.max()) if num_rows else 0,
        max_context_len=max(ctx) if ctx else 0,
        is_decode=bool(num_rows) and bool((q_lens == 1).all()),
        is_fresh_prefill=fresh,
        prev_token_index=np.asarray(ph_index, dtype=np.int64) if ph_index else None,
        prev_token_src=np.asarray(ph_src, dtype=np.int64) if ph_src else None,
    )
