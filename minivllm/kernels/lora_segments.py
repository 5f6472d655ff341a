"""A step's tokens grouped by LoRA slot, on the device: the metadata of the segmented LoRA kernels.

The Triton shrink and expand (minivllm/kernels/lora.py) give each slot its own programs, and a program needs
the tokens of its slot as one run: ``sorted_tokens`` holds the token indices slot by slot (slot 0 first, in
token order within a slot), the base model's tokens (slot -1) last; ``counts[s]`` and ``starts[s]`` are the
length and first position of slot ``s``'s run (index ``num_slots``: the base model's). Every tensor's shape
follows from the token count and the number of slots alone, and nothing is read back to the host: one
stable sort, a scatter-add and a cumsum, so that a step built around them can be captured in a CUDA graph and
replayed with another slot mapping. The runner builds it once a step and passes it to every LoRA layer.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class LoRASegments(NamedTuple):
    """Token indices sorted by slot, with each slot's run length and start (see the module docstring)."""

    sorted_tokens: torch.Tensor  # [T] int32: token indices, slot 0's first, the base model's last
    counts: torch.Tensor  # [num_slots + 1] int32: tokens of each slot, the base model's last
    starts: torch.Tensor  # [num_slots + 1] int32: first position of each slot's run in sorted_tokens
    num_slots: int


def lora_segments(token_slot: torch.Tensor, num_slots: int) -> LoRASegments:
    """Group the tokens of ``token_slot`` ([T] int, -1 for the base model) by slot, on its device.

    NOTE: a slot outside ``[-1, num_slots)`` is caught on CPU tensors only (checking a device tensor would
    sync with the host); the runner builds the mapping from slots it assigned.
    """
    if token_slot.dim() != 1 or token_slot.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"token_slot must be a [T] int32/int64 tensor, got {tuple(token_slot.shape)} "
                         f"{token_slot.dtype}")
    if num_slots < 1:
        raise ValueError(f"num_slots must be at least 1, got {num_slots}")
    if not token_slot.is_cuda and token_slot.numel() and not (
            token_slot.min() >= -1 and token_slot.max() < num_slots):
        raise ValueError(f"token_slot values must lie in [-1, {num_slots}) (num_slots {num_slots}), got "
                         f"{token_slot.min().item()}..{token_slot.max().item()}")
    # the base model's -1 becomes the last group, num_slots
    key = torch.where(token_slot < 0, num_slots, token_slot).to(torch.int32)  # [T]
    sorted_tokens = torch.sort(key, stable=True).indices.to(torch.int32)  # [T]
    counts = torch.zeros(num_slots + 1, dtype=torch.int32, device=token_slot.device)  # [num_slots + 1]
    counts.scatter_add_(0, key.long(), torch.ones_like(key))
    starts = (torch.cumsum(counts, 0, dtype=torch.int32) - counts).to(torch.int32)  # [num_slots + 1]
    return LoRASegments(sorted_tokens, counts, starts, num_slots)
