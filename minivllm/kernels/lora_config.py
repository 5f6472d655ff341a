"""Tiles of the multi-LoRA shrink and expand (minivllm/kernels/lora.py) by the batch's token count.

The shrink reads each present slot's ``A`` ([R, H] per slice) once; with few tokens that read is the whole cost,
and what matters is how many programs share it: the FMA variant gives each program a few of the ``R`` rank
rows, the MMA variant splits the walk over ``H`` (``split_k``, atomic adds into a zeroed output). Past a few
hundred tokens the row tiles alone give enough programs. The defaults are reasoned from that, not tuned on a
GPU: ``benchmarks/kernels/bench_lora.py --shrink-config/--expand-config`` times others.
"""

from __future__ import annotations

from typing import NamedTuple

import triton

FMA_MAX_TOKENS = 16  # the shrink's FMA variant up to this many tokens in the batch


class ShrinkConfig(NamedTuple):
    """Tiles of the shrink: tokens and ``H`` per step, programs sharing one ``H`` walk (MMA variant), rank rows
    a program (``fma_rows`` > 0: the FMA variant, ``split_k`` 1), warps."""

    block_m: int
    block_k: int
    split_k: int
    fma_rows: int
    num_warps: int


class ExpandConfig(NamedTuple):
    """Tiles of the expand kernel: tokens and output columns per program, warps."""

    block_m: int
    block_n: int
    num_warps: int


def _block_m(num_tokens: int) -> int:
    """Rows of a token tile: 16 (the smallest ``tl.dot`` tile) up to 64, by the batch's token count."""
    return min(64, max(16, triton.next_power_of_2(num_tokens)))


def shrink_config(num_tokens: int, hidden: int, rank: int, num_slices: int) -> ShrinkConfig:
    """The shrink's variant and tiles for ``num_tokens`` tokens (see the module docstring).

    Up to ``FMA_MAX_TOKENS`` tokens: FMAs, the rank rows spread over at least 64 programs per slot where the
    rank allows. Above: the tensor cores, ``H`` split over up to 64 programs per slot while the row tiles and
    slices alone give fewer.
    """
    if num_tokens <= FMA_MAX_TOKENS:
        bm = triton.next_power_of_2(max(1, num_tokens))
        rows = 1
        while rank % (2 * rows) == 0 and rank // (2 * rows) * num_slices >= 64:
            rows *= 2
        return ShrinkConfig(bm, max(32, min(512, 4096 // (bm * rows))), 1, rows, 4)
    bm = _block_m(num_tokens)
    bk = 128 if num_tokens <= 64 else 64
    k_steps = triton.cdiv(hidden, bk)
    row_tiles = triton.cdiv(num_tokens, bm)
    split_k = 1
    while split_k * 2 <= k_steps and split_k * row_tiles * num_slices < 64:
        split_k *= 2
    return ShrinkConfig(bm, bk, split_k, 0, 4)


def expand_config(num_tokens: int, max_cols: int) -> ExpandConfig:
    """The expand's tiles: 128 output columns a program (64 for narrow slices)."""
    return ExpandConfig(_block_m(num_tokens), 64 if max_cols <= 1024 else 128, 4)
