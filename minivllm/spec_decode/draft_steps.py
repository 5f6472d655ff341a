"""What the model-based proposers (EAGLE-3 heads, draft models) share: their own paged KV cache over the
target's block ids, and the inputs of their two kinds of forward.

The proposer's cache holds the same block ids as the target's (so its block tables, prefix-cache hits and freed
blocks need no bookkeeping of their own), plus scratch blocks: a draft runs ahead of the tokens the target has
computed, into positions whose blocks the scheduler has not allocated yet. Each step a proposer first *catches
up*: it computes the step's accepted tokens into their real slots (``catch_up``). It then drafts one token per
forward (``ahead_tables`` / ``draft_step_meta``): in a table whose blocks from the first position past the
accepted ones are the row's scratch blocks, the first a copy of the real block (whose earlier positions hold
accepted tokens). What it writes there is never read once the target has verified the drafts: the next catch-up
computes the accepted positions again, into the real blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from minivllm.layers.attention import Attention
from minivllm.layers.attention_metadata import AttentionMetadata
from minivllm.spec_decode.proposer import ProposerInputs
from minivllm.worker.kv_cache import bind_cache, new_cache


@dataclass(frozen=True)
class CatchUp:
    """A step's accepted tokens, per row: the first computed position ``start`` [rows] and the count ``count``
    [rows] (the row's computed tokens that are now part of its sequence: drafts past the first rejected one
    are not), and their flat indices in the step (``index`` [n]) and positions (``positions`` [n])."""

    start: np.ndarray  # [rows] int64
    count: np.ndarray  # [rows] int64
    index: np.ndarray  # [n] int64
    positions: np.ndarray  # [n] int64

    @classmethod
    def of(cls, inputs: ProposerInputs) -> CatchUp:
        cu = inputs.cu_seqlens_q.astype(np.int64)
        q = np.diff(cu)  # [rows]
        start = inputs.positions[torch.from_numpy(cu[:-1]).to(inputs.positions.device)].cpu().numpy()  # [rows]
        # a sampled row: its newest token (sampled this step) is not computed yet, everything before it is
        # accepted; a prefill chunk that samples nothing: all of it
        sampled = inputs.next_token_ids >= 0
        count = np.where(sampled, np.clip(np.minimum(q, inputs.num_tokens.astype(np.int64) - 1 - start), 0, None), q)
        offsets = np.repeat(np.cumsum(count) - count, count)  # [n]
        within = np.arange(int(count.sum()), dtype=np.int64) - offsets
        rows = np.repeat(np.arange(len(count)), count)
        return cls(start, count, cu[:-1][rows] + within, start[rows] + within)

    def tokens(self, inputs: ProposerInputs, shift: int) -> np.ndarray:
        """[n] each accepted position's token ``shift`` positions on, from the rows' histories."""
        rows = np.repeat(np.arange(len(self.count)), self.count)
        return inputs.token_ids[inputs.slots[rows], self.positions + shift].astype(np.int64)

    def last(self) -> np.ndarray:
        """[rows] index in the catch-up tokens of each row's last one (meaningless for a row without any)."""
        return np.cumsum(self.count) - 1


class DraftKVCache:
    """A proposer's paged KV cache (see the module docstring): ``num_blocks`` blocks that mirror the target's,
    then ``scratch`` blocks per row for ``max_rows`` drafting rows; bound to the proposer's ``layers``."""

    def __init__(self, layers: list[Attention], num_blocks: int, block_size: int, k: int, max_rows: int,
                 dtype: torch.dtype, device: torch.device):
        self.block_size, self.num_blocks, self.device = block_size, num_blocks, device
        # a row drafts into positions [p, p + k): at most two blocks more than k fills
        self.scratch = k // block_size + 2
        self.cache = new_cache(layers, num_blocks + max_rows * self.scratch, block_size, dtype, device)
        bind_cache(layers, self.cache)

    def _meta(self, slot_mapping: torch.Tensor, q_lens: np.ndarray, context_lens: np.ndarray,
              block_tables: np.ndarray) -> AttentionMetadata:
        cu = np.zeros(len(q_lens) + 1, dtype=np.int32)
        np.cumsum(q_lens, out=cu[1:])
        dev = self.device
        return AttentionMetadata(
            slot_mapping=slot_mapping, cu_seqlens_q=torch.from_numpy(cu).to(dev),
            context_lens=torch.from_numpy(context_lens.astype(np.int32)).to(dev),
            block_tables=torch.from_numpy(np.ascontiguousarray(block_tables, dtype=np.int32)).to(dev),
            max_seqlen_q=int(q_lens.max()), max_context_len=int(context_lens.max()),
            is_decode=bool((q_lens == 1).all()), num_rows=len(q_lens), cu_seqlens_q_cpu=cu.tolist(),
            context_lens_cpu=context_lens.astype(np.int32).tolist(), is_fresh_prefill=False)

    def catch_up_meta(self, inputs: ProposerInputs, cu: CatchUp) -> AttentionMetadata:
        """Metadata of the catch-up forward over the rows that accepted tokens (their real slots and tables)."""
        rows = np.flatnonzero(cu.count > 0)
        slots = inputs.slot_mapping[torch.from_numpy(cu.index).to(inputs.slot_mapping.device)]
        return self._meta(slots, cu.count[rows], cu.start[rows] + cu.count[rows], inputs.block_tables[rows])

    def ahead_tables(self, block_tables: np.ndarray, first: np.ndarray) -> np.ndarray:
        """[rows, width] tables of drafting rows whose positions from ``first`` [rows] on go to their scratch
        blocks (row ``i``: scratch ``i``); copies each row's real block holding ``first`` (when it has one, and
        positions before ``first`` in it) into its first scratch block."""
        bs, n = self.block_size, len(first)
        b0 = first // bs  # [rows]: the first block past the accepted tokens
        width = int(b0.max()) + self.scratch
        tables = np.zeros((n, width), dtype=np.int64)
        have = min(width, block_tables.shape[1])
        tables[:, :have] = block_tables[:, :have]
        scratch = self.num_blocks + np.arange(n)[:, None] * self.scratch + np.arange(self.scratch)  # [rows, S]
        cols = b0[:, None] + np.arange(self.scratch)  # [rows, S]
        real = np.where(b0 < block_tables.shape[1], block_tables[np.arange(n), np.minimum(b0, have - 1)], -1)
        copy = (real >= 0) & (first % bs != 0)
        tables[np.arange(n)[:, None], cols] = scratch
        np.maximum(tables, 0, out=tables)  # past a row's blocks: never read, but a valid id
        if copy.any():
            src = torch.from_numpy(real[copy]).to(self.device)
            dst = torch.from_numpy(scratch[copy, 0]).to(self.device)
            self.cache[:, :, dst] = self.cache[:, :, src]  # [2, layers, blocks, block_size, kv_heads, head_dim]
        return tables

    def draft_step_meta(self, tables: np.ndarray, positions: np.ndarray) -> AttentionMetadata:
        """Metadata of one drafting forward: one token per row at ``positions`` [rows], in ``tables``."""
        bs = self.block_size
        slots = tables[np.arange(len(positions)), positions // bs] * bs + positions % bs
        return self._meta(torch.from_numpy(slots.astype(np.int64)).to(self.device), np.ones(len(positions),
                          dtype=np.int64), positions + 1, tables)
