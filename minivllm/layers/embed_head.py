"""Vocabulary-parallel embedding and LM head."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minivllm.distributed.group import TPGroup, rank_and_size
from minivllm.layers.linear import linear


class VocabParallelEmbedding(nn.Module):
    """Each rank holds a contiguous slice of the vocabulary rows; lookups are summed across ranks."""

    def __init__(self, num_embeddings: int, embedding_dim: int, tp_group: TPGroup | None = None):
        super().__init__()
        self.tp_group = tp_group
        self.tp_rank, self.tp_size = rank_and_size(tp_group)
        self.num_embeddings = num_embeddings
        self.per_rank = (num_embeddings + self.tp_size - 1) // self.tp_size
        self.vocab_start = self.per_rank * self.tp_rank
        self.vocab_end = min(self.vocab_start + self.per_rank, num_embeddings)
        self.weight = nn.Parameter(torch.empty(self.per_rank, embedding_dim), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        rows = loaded[self.vocab_start:self.vocab_end]
        param.data.zero_()
        param.data[: rows.shape[0]].copy_(rows)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [num_tokens] -> [num_tokens, hidden]
        if self.tp_size == 1:
            return F.embedding(x, self.weight)
        mask = (x >= self.vocab_start) & (x < self.vocab_end)
        y = F.embedding((x - self.vocab_start) * mask, self.weight)
        y = y * mask.unsqueeze(1).to(y.dtype)
        self.tp_group.all_reduce(y)
        return y


class ParallelLMHead(VocabParallelEmbedding):
    """Projects hidden states to logits; each rank computes its vocab slice, rank 0 gathers them.

    ``gather=False`` leaves every rank its own ``[num_rows, per_rank]`` slice (global ids from
    ``vocab_start``; on the last rank the columns from ``num_embeddings`` on are zero padding).
    """

    def forward(self, x: torch.Tensor, gather: bool = True) -> torch.Tensor | None:  # [rows, hidden] -> [rows, vocab]
        logits = linear(x, self.weight, None)  # [num_rows, per_rank] (one-row decoding: the Triton GEMV)
        if self.tp_size == 1 or not gather:
            return logits
        parts = self.tp_group.gather(logits, dst=0)  # outside any CUDA graph (sampled rows only)
        if parts is None:
            return None
        return torch.cat(parts, dim=-1)[:, : self.num_embeddings]
