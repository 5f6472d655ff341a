"""The one dispatch point of the multi-LoRA ops: the Triton kernels (``minivllm.kernels.lora``) on CUDA where
they are installed, the plain torch reference (``minivllm.kernels.lora_torch``) otherwise. Both share one
signature (see ``lora_torch``'s docstring)."""

from __future__ import annotations

import importlib.util

import torch

from minivllm.kernels import lora_torch


def _find(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


#: whether the Triton kernels can run (triton installed and the kernels' module present)
HAS_TRITON_LORA = _find("triton") and _find("minivllm.kernels.lora")


def uses_triton(device: torch.device) -> bool:
    """Whether the ops run the Triton kernels on ``device`` (they are the ones a CUDA graph can capture)."""
    return HAS_TRITON_LORA and device.type == "cuda"


def lora_shrink(x: torch.Tensor, a_stacked: tuple[torch.Tensor, ...], token_slot: torch.Tensor,
                out: torch.Tensor, segments=None) -> torch.Tensor:
    """``out[i, t] = x[t] @ a_stacked[i][token_slot[t]].T`` (zeros where ``token_slot`` is -1); out: float32
    ``[num_slices, T, max_rank]``. ``segments``: the step's ``lora_segments`` (Triton only; built when None)."""
    if uses_triton(x.device):
        from minivllm.kernels.lora import lora_shrink as kernel  # here: the kernels need triton

        return kernel(x, a_stacked, token_slot, out, segments=segments)
    return lora_torch.lora_shrink(x, a_stacked, token_slot, out)


def lora_expand(shrunk: torch.Tensor, b_stacked: tuple[torch.Tensor, ...], token_slot: torch.Tensor,
                y: torch.Tensor, slice_offsets: tuple[int, ...], segments=None) -> torch.Tensor:
    """``y[t, off_i:off_i+n_i] += shrunk[i, t] @ b_stacked[i][token_slot[t]].T``, in place (``segments``: as
    for ``lora_shrink``)."""
    if uses_triton(y.device):
        from minivllm.kernels.lora import lora_expand as kernel

        return kernel(shrunk, b_stacked, token_slot, y, slice_offsets, segments=segments)
    return lora_torch.lora_expand(shrunk, b_stacked, token_slot, y, slice_offsets)
