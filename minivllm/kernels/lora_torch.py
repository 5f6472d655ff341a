"""Multi-LoRA shrink and expand in plain torch: the CPU path and the reference of the Triton kernels.

A batch mixes tokens of several adapters and of the base model. Adapter weights sit in slots: for each
slice of a layer's output (one for a plain linear layer; q, k, v or gate, up for a fused one) ``a`` is
``[num_slots, max_rank, in_features]`` and ``b`` is ``[num_slots, out_features_of_slice, max_rank]``, an
adapter of a smaller rank zero-padded, its scaling (``lora_alpha / r``, or ``/ sqrt(r)`` for rsLoRA) already
folded into ``b``. ``token_slot[t]`` is token t's slot, -1 for a token of the base model (no delta).

- shrink: ``out[i, t] = x[t] @ a[i][token_slot[t]].T`` (``[num_slices, T, max_rank]``, float32);
- expand: ``y[t, off_i:off_i + n_i] += out[i, t] @ b[i][token_slot[t]].T``.
"""

from __future__ import annotations

import torch


def _segments(token_slot: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
    """``(slot, token indices)`` for each slot present among the tokens, the base model's -1 left out."""
    return [(int(s), (token_slot == s).nonzero().squeeze(1)) for s in token_slot.unique().tolist() if s >= 0]


def lora_shrink(x: torch.Tensor, a_stacked: tuple[torch.Tensor, ...], token_slot: torch.Tensor,
                out: torch.Tensor) -> torch.Tensor:
    """Write ``x @ A.T`` of each token's adapter into ``out`` for each slice; zeros for base-model tokens.

    x: [T, H]; a_stacked[i]: [S, R, H]; token_slot: [T] int (-1: none); out: [num_slices, T, R] float32.
    """
    out.zero_()
    for slot, rows in _segments(token_slot):
        xs = x.index_select(0, rows).float()  # [t, H]
        for i, a in enumerate(a_stacked):
            out[i].index_copy_(0, rows, xs @ a[slot].float().t())  # [t, R]
    return out


def lora_expand(shrunk: torch.Tensor, b_stacked: tuple[torch.Tensor, ...], token_slot: torch.Tensor,
                y: torch.Tensor, slice_offsets: tuple[int, ...]) -> torch.Tensor:
    """Add ``shrunk[i] @ B_i.T`` of each token's adapter into the columns of slice i of ``y``, in place.

    shrunk: [num_slices, T, R] float32; b_stacked[i]: [S, N_i, R]; token_slot: [T]; y: [T, sum N_i];
    slice_offsets: the first column of each slice in ``y`` (len num_slices + 1, the last one sum N_i).
    """
    for slot, rows in _segments(token_slot):
        for i, b in enumerate(b_stacked):
            lo, hi = slice_offsets[i], slice_offsets[i + 1]
            delta = shrunk[i].index_select(0, rows) @ b[slot].float().t()  # [t, N_i]
            y[rows, lo:hi] += delta.to(y.dtype)
    return y
