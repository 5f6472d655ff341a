"""Random multi-LoRA batches and the checks of the Triton shrink and expand against the torch reference
(minivllm/kernels/lora_torch.py), shared by tests/test_lora_kernels.py (interpreter) and tests/gpu.

A batch: ``num_slots`` adapter slots of padded rank ``rank``, each slot's adapter of its own rank (the rest of
``A``'s rows and ``B``'s columns zero, as the loader pads them), ``num_adapters`` of the slots given to the
tokens, a quarter of the tokens (at random) left to the base model (slot -1).

Tolerances follow the dtype (``u``: a dtype's unit roundoff), elementwise, ``bound`` being the same op over
absolute values: the kernel's expand rounds ``shrunk`` to ``b``'s dtype before the tensor cores and its sum
once to ``y``'s dtype, the reference rounds the delta and the sum (up to ``2u |y| + (u + u_b) bound``, twice the
``u_b`` term allowed); float32 sums in another order (split-K, tiles) differ by a few float32 roundoffs of the
sum of the terms' magnitudes. NOTE: the interpreter truncates float32 -> bfloat16 (tests/test_lora_kernels.py
patches it to round to nearest even, as GPUs do).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from minivllm.kernels import lora_torch

#: unit roundoff of each dtype (half the spacing of floats in [1, 2))
UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
#: float32 sums in another order (split-K, tile order), relative to the sum of the terms' magnitudes
SUM_ORDER = 2.0**-16


class LoRACase(NamedTuple):
    """One batch's inputs (see the module docstring)."""

    x: torch.Tensor  # [T, H]
    a_stacked: tuple[torch.Tensor, ...]  # [S, R, H] per slice
    b_stacked: tuple[torch.Tensor, ...]  # [S, N_i, R] per slice
    token_slot: torch.Tensor  # [T] int32, -1: base model
    slice_offsets: tuple[int, ...]  # len num_slices + 1

    @property
    def width(self) -> int:
        """Columns of the layer's output: the sum of the slices' widths."""
        return self.slice_offsets[-1]


def random_slots(num_tokens: int, num_slots: int, num_adapters: int, gen: torch.Generator,
                 base_frac: float = 0.25) -> torch.Tensor:
    """``[num_tokens]`` int32: one of ``num_adapters`` random slots per token, -1 for about ``base_frac``."""
    chosen = torch.randperm(num_slots, generator=gen)[:num_adapters]  # [num_adapters]
    slots = chosen[torch.randint(0, num_adapters, (num_tokens,), generator=gen)]  # [T]
    base = torch.rand(num_tokens, generator=gen) < base_frac
    return torch.where(base, -1, slots).to(torch.int32)


def lora_case(num_tokens: int, hidden: int, widths: tuple[int, ...], rank: int, num_slots: int,
              num_adapters: int, dtype: torch.dtype, device: str = "cpu", seed: int = 0) -> LoRACase:
    """A random batch (see the module docstring); ``B`` scaled so that the LoRA delta is about ``x``'s size."""
    gen = torch.Generator().manual_seed(seed)
    ranks = torch.randint(1, rank + 1, (num_slots,), generator=gen)  # [S]: each slot's adapter rank
    ranks[0] = rank  # the padded rank in use
    live = torch.arange(rank)[None, :] < ranks[:, None]  # [S, R]
    a_stacked, b_stacked = [], []
    for n in widths:
        a = torch.randn(num_slots, rank, hidden, generator=gen) / hidden**0.5 * live[:, :, None]  # [S, R, H]
        b = torch.randn(num_slots, n, rank, generator=gen) / rank**0.5 * live[:, None, :]  # [S, N, R]
        a_stacked.append(a.to(device, dtype))
        b_stacked.append(b.to(device, dtype))
    x = torch.randn(num_tokens, hidden, generator=gen).to(device, dtype)  # [T, H]
    token_slot = random_slots(num_tokens, num_slots, num_adapters, gen).to(device)  # [T]
    offsets = [0]
    for n in widths:
        offsets.append(offsets[-1] + n)
    return LoRACase(x, tuple(a_stacked), tuple(b_stacked), token_slot, tuple(offsets))


def shrink_out(case: LoRACase) -> torch.Tensor:
    """An output buffer for the shrink, filled with NaN (an element the op leaves unwritten shows)."""
    rank = case.a_stacked[0].shape[1]
    return torch.full((len(case.a_stacked), case.x.shape[0], rank), float("nan"), device=case.x.device)


def check_shrink(out: torch.Tensor, case: LoRACase) -> None:
    """``out`` (the kernel's shrink of ``case``) against the reference; base-model rows exactly zero."""
    ref = lora_torch.lora_shrink(case.x, case.a_stacked, case.token_slot, shrink_out(case))
    bound = lora_torch.lora_shrink(case.x.abs(), tuple(a.abs() for a in case.a_stacked), case.token_slot,
                                   shrink_out(case))
    assert out.shape == ref.shape and out.dtype == torch.float32
    assert torch.isfinite(out).all(), "an element of out left unwritten"
    assert (out[:, case.token_slot < 0] == 0).all(), "a base-model token's shrunk row is not zero"
    err = (out - ref).abs()
    ok = err <= SUM_ORDER * bound
    assert ok.all(), f"shrink: {int((~ok).sum())} elements off, worst {err.max().item():.3e}"


def check_expand(y: torch.Tensor, y0: torch.Tensor, shrunk: torch.Tensor, case: LoRACase) -> None:
    """``y`` (``y0`` after the kernel's expand of ``shrunk``) against the reference; base rows untouched."""
    ref = lora_torch.lora_expand(shrunk, case.b_stacked, case.token_slot, y0.clone(), case.slice_offsets)
    zeros = torch.zeros(y0.shape, dtype=torch.float32, device=y0.device)
    bound = lora_torch.lora_expand(shrunk.abs(), tuple(b.abs() for b in case.b_stacked), case.token_slot, zeros,
                                   case.slice_offsets)
    assert y.shape == y0.shape and y.dtype == y0.dtype
    base = case.token_slot < 0
    assert torch.equal(y[base], y0[base]), "a base-model token's row changed"
    u = UNIT_ROUNDOFF[y.dtype]
    b_u = UNIT_ROUNDOFF[case.b_stacked[0].dtype]
    err = (y.double() - ref.double()).abs()
    tol = 2 * u * ref.double().abs() + (u + 2 * b_u + SUM_ORDER) * bound.double()
    ok = err <= tol
    assert ok.all(), f"expand: {int((~ok).sum())} elements off, worst {err.max().item():.3e}"
