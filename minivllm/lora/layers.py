"""LoRA slots of one linear layer (column, merged, QKV or row parallel), applied after its base matmul.

A layer that takes adapters gets ``layer.lora = LoRALinear(layer, ...)``: ``LinearBase.matmul`` then adds
``x @ A.T @ B.T`` of each token's adapter to its output. The slots are stacked per output slice (q, k, v of a
fused QKV projection; gate, up of a merged one; one slice otherwise), an adapter of a smaller rank zero-padded
to ``max_rank``, its scaling folded into B.

Tensor parallel: a column-parallel layer keeps all of A (its input is whole) and this rank's rows of each
slice's B, cut as the layer cuts its weight (its own ``weight_loader``); a row-parallel layer keeps this rank's
columns of A and all of B: its shrink is a partial sum over the input features, and since ``@ B.T`` is linear
the expanded partial sums add up in the layer's all-reduce (or the next norm's), with no extra communication.
"""

from __future__ import annotations

import torch

from minivllm.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from minivllm.lora.ops import lora_expand, lora_shrink, uses_triton


class LoRAState:
    """The step's adapter slot of every token (``token_slot``: ``[num_tokens]`` int64, -1 for the base model;
    None when no token of the step has an adapter), shared by every LoRA layer of one model. Under a CUDA graph
    it is the whole static buffer and each layer reads its first ``num_tokens`` entries."""

    def __init__(self):
        self.token_slot: torch.Tensor | None = None
        self._segments = None  # (num_tokens, LoRASegments) of this step, built by its first LoRA layer

    def reset(self, token_slot: torch.Tensor | None) -> None:
        """A new step's slot mapping (or the static buffer a CUDA graph reads)."""
        self.token_slot, self._segments = token_slot, None

    def segments(self, token_slot: torch.Tensor, num_slots: int):
        """The step's tokens grouped by slot for the Triton kernels, built once a step by the first layer that
        asks (under a CUDA graph: inside the captured forward, so each replay regroups its own mapping)."""
        n = token_slot.shape[0]
        if self._segments is None or self._segments[0] != n:
            from minivllm.kernels.lora_segments import lora_segments  # here: the Triton path only

            self._segments = (n, lora_segments(token_slot, num_slots))
        return self._segments[1]


class LoRALinear:
    """The ``max_loras`` adapter slots of ``layer`` (see the module docstring): ``a_stacked[i]``
    ``[max_loras, max_rank, in_features]`` and ``b_stacked[i]`` ``[max_loras, out_i, max_rank]`` for output
    slice i (this rank's sizes)."""

    def __init__(self, layer, max_loras: int, max_rank: int, state: LoRAState, device: torch.device,
                 dtype: torch.dtype):
        self.layer, self.state, self.max_rank = layer, state, max_rank
        if isinstance(layer, QKVParallelLinear):
            q, kv = layer.num_heads * layer.head_dim, layer.num_kv_heads * layer.head_dim
            self.shard_ids, sizes = ("q", "k", "v"), (q, kv, kv)
        elif isinstance(layer, MergedColumnParallelLinear):
            self.shard_ids = tuple(range(len(layer.output_sizes)))
            sizes = tuple(s // layer.tp_size for s in layer.output_sizes)
        else:
            self.shard_ids, sizes = (None,), (layer.weight.shape[0],)
        self.row_parallel = isinstance(layer, RowParallelLinear)
        offsets = [0]
        for n in sizes:
            offsets.append(offsets[-1] + n)
        self.slice_offsets = tuple(offsets)  # len num_slices + 1, the last one this rank's output features
        in_features = layer.weight.shape[1]
        self.a_stacked = tuple(torch.zeros(max_loras, max_rank, in_features, dtype=dtype, device=device)
                               for _ in sizes)  # each [slots, R, in]
        self.b_stacked = tuple(torch.zeros(max_loras, n, max_rank, dtype=dtype, device=device)
                               for n in sizes)  # each [slots, out_i, R]

    @property
    def num_slices(self) -> int:
        return len(self.shard_ids)

    def shard(self, index: int, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's part of slice ``index``'s full ``a`` ``[r, in_full]`` and scaled ``b`` ``[out_full, r]``,
        cut by the layer's own weight loader: ``([r, in], [out_index, r])``."""
        layer, r = self.layer, a.shape[0]
        if self.row_parallel:  # A's columns split like the weight's; B whole
            a_part = torch.empty(r, layer.weight.shape[1], dtype=a.dtype)
            layer.weight_loader(a_part, a)
            return a_part, b
        full = torch.zeros(layer.weight.shape[0], r, dtype=b.dtype)  # [out of this rank, r]
        if self.shard_ids[index] is None:
            layer.weight_loader(full, b)
        else:
            layer.weight_loader(full, b, self.shard_ids[index])
        lo, hi = self.slice_offsets[index], self.slice_offsets[index + 1]
        return a, full[lo:hi]

    def set_slot(self, slot: int, weights: list[tuple[torch.Tensor, torch.Tensor] | None]) -> None:
        """Write slot ``slot``: slice i from ``weights[i]`` (this rank's ``(a [r, in], b [out_i, r])``, r at most
        ``max_rank``), zeros where it is None or past its rank."""
        for i, w in enumerate(weights):
            a_slot, b_slot = self.a_stacked[i][slot], self.b_stacked[i][slot]  # [R, in], [out_i, R]
            a_slot.zero_()
            b_slot.zero_()
            if w is not None:
                a, b = w
                r = a.shape[0]
                a_slot[:r].copy_(a, non_blocking=True)
                b_slot[:, :r].copy_(b, non_blocking=True)

    def apply(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Add each token's adapter delta of ``x`` ([T, in]) to the layer's output ``y`` ([T, out]) in place."""
        token_slot = self.state.token_slot
        if token_slot is None:
            return
        n = x.shape[0]
        shrunk = torch.empty(self.num_slices, n, self.max_rank, dtype=torch.float32,
                             device=x.device)  # [slices, T, R]
        token_slot = token_slot[:n]  # [T]
        segments = self.state.segments(token_slot, self.a_stacked[0].shape[0]) if uses_triton(x.device) else None
        lora_shrink(x, self.a_stacked, token_slot, shrunk, segments)
        lora_expand(shrunk, self.b_stacked, token_slot, y, self.slice_offsets, segments)
