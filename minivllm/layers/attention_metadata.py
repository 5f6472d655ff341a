"""Attention metadata: the per-step description of a flattened batch.

One step's batch is a list of rows (sequences). Row ``b`` contributes ``q_len[b]`` new
query tokens (1 for a decode row, a chunk for a prefill row) whose keys are the first
``context_lens[b]`` tokens of that sequence: ``context_lens[b] - q_len[b]`` already in the
paged cache plus the ``q_len[b]`` new ones written this step. The new token ``i`` of row
``b`` sits at absolute position ``context_lens[b] - q_len[b] + i`` and attends causally.

The object travels explicitly through ``model.forward(..., attn_metadata)``; there is no
module-level "current context".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64, cache slot of each new token; -1 = do not store
    cu_seqlens_q: torch.Tensor  # [num_rows + 1] int32, query offsets of each row in the flat batch
    context_lens: torch.Tensor  # [num_rows] int32, keys per row (cached + new)
    block_tables: torch.Tensor  # [num_rows, max_blocks] int32, physical block ids, padded with -1
    max_seqlen_q: int  # longest query chunk of the step
    max_context_len: int  # longest context of the step
    is_decode: bool = False  # every row has exactly one query token
    num_rows: int = 0  # rows that are real (CUDA graph replays pad the tensors past this)
    # Host copies, used by the torch backend to avoid device syncs.
    cu_seqlens_q_cpu: list[int] | None = None
    context_lens_cpu: list[int] | None = None
    # Fresh prefill only (no cached prefix in any row): cu_seqlens for keys == cu_seqlens_q.
    is_fresh_prefill: bool = False
    # a hybrid model's KV cache groups past the first (``minivllm.core.kv_cache_spec``), in group order: the
    # same step over that group's blocks (its own slot_mapping and block_tables, the rest shared)
    group_metas: list[AttentionMetadata] = field(default_factory=list)

    def for_group(self, group: int) -> AttentionMetadata:
        """The metadata of KV cache group ``group`` (0: this one)."""
        return self if group == 0 else self.group_metas[group - 1]
