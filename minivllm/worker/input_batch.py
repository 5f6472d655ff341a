"""Host-side inputs of one forward step, built from a SchedulerOutput with numpy (no torch).

This is what rank 0 hands to every tensor-parallel rank: plain arrays, cheap to pickle.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from minivllm.core.scheduler_output import SchedulerOutput


@dataclass(frozen=True)
class StepInputs:
    """One step's flattened batch as numpy arrays (the same on every tensor-parallel rank)."""

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
    # step (minivllm.sample.sharded); None: rank 0 gathers the logits and samples.
    sample_temperatures: np.ndarray | None = None  # [num_sampled] float32, 0.0 on greedy rows
    # flat token indices whose logits give prompt logprobs (rows' ``prompt_logprobs``, in row order); None: none
    prompt_logprob_index: np.ndarray | None = None  # [num_prompt_positions] int64

    @property
    def num_rows(self) -> int:
        return len(self.context_lens)


def build_step_inputs(out: SchedulerOutput, block_size: int,
                      sample_temperatures: np.ndarray | None = None) -> StepInputs:
    """Flatten the scheduled rows: tokens ``[num_computed, num_computed + n)`` of each sequence."""
    num_rows = len(out.rows)
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    cu = [0]
    ctx: list[int] = []
    sample: list[int] = []
    ph_index: list[int] = []
    ph_src: list[int] = []
    prompt_index: list[int] = []
    max_blocks = 0
    fresh = True
    for row in out.rows:
        start, table = row.num_computed_tokens, row.block_ids
        n = len(row.token_ids)
        end = start + n
        if n == 1:
            if row.prev_sampled_row >= 0:
                ph_index.append(len(input_ids))
                ph_src.append(row.prev_sampled_row)
            input_ids.append(row.token_ids[0])
            positions.append(start)
            slots.append(table[start // block_size] * block_size + start % block_size)
        else:
            input_ids.extend(row.token_ids)
            pos = np.arange(start, end)
            positions.extend(pos.tolist())
            slots.extend((np.asarray(table, dtype=np.int64)[pos // block_size] * block_size
                          + pos % block_size).tolist())
        fresh &= start == 0
        if row.prompt_logprobs is not None:
            prompt_index.extend(range(cu[-1], cu[-1] + len(row.prompt_logprobs[1])))
        cu.append(cu[-1] + n)
        ctx.append(end)
        if row.sampled:
            sample.append(cu[-1] - 1)
        max_blocks = max(max_blocks, len(table))
    block_tables = _padded_block_tables([row.block_ids for row in out.rows], max_blocks)
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
        sample_temperatures=sample_temperatures,
        prompt_logprob_index=np.asarray(prompt_index, dtype=np.int64) if prompt_index else None,
    )


def _padded_block_tables(tables: list[tuple[int, ...]], width: int) -> np.ndarray:  # -> [rows, width] int32
    """The tables as one -1-padded array. NOTE: from 16 rows on, one flat copy and a masked fill (1.5x faster
    than a padded Python row each at 256 rows); below, the padded rows (5x faster at one row)."""
    if len(tables) < 16:
        return np.array([t + (-1,) * (width - len(t)) for t in tables], dtype=np.int32).reshape(len(tables), width)
    lens = np.fromiter(map(len, tables), dtype=np.int64, count=len(tables))  # [rows]
    flat = np.fromiter(itertools.chain.from_iterable(tables), dtype=np.int32, count=int(lens.sum()))
    out = np.full((len(tables), width), -1, dtype=np.int32)
    out[np.arange(width) < lens[:, None]] = flat
    return out
