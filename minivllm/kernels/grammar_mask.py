"""Grammar masks on logits: every token a row's packed bitmask leaves out becomes ``-inf`` (Triton).

The bitmask is the grammar engine's: int32 words, token ``t`` allowed iff bit ``t % 32`` of word ``t // 32``
is set. Program ``(j, c)`` reads ``BLOCK_W`` words of constrained row ``j`` and writes the ``32 * BLOCK_W``
logits they cover in row ``rows[j]`` of the batch, so only the constrained rows are touched and the mask is
never unpacked into memory. ``apply_grammar_bitmask_ref`` (in ``minivllm.kernels.torch_backend``) is the plain
torch reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _grammar_mask_kernel(
    logits_ptr,  # [B, V] float32
    stride_b,
    rows_ptr,  # [R] int64: the batch row of each mask row
    mask_ptr,  # [R, W] int32
    stride_m,
    V,
    W,
    BLOCK_W: tl.constexpr,
):
    j = tl.program_id(0)
    c = tl.program_id(1)
    row = tl.load(rows_ptr + j)
    words = c * BLOCK_W + tl.arange(0, BLOCK_W)  # [BLOCK_W]
    packed = tl.load(mask_ptr + j.to(tl.int64) * stride_m + words, mask=words < W, other=-1)  # [BLOCK_W] int32
    bit = tl.arange(0, 32)  # [32]
    allowed = ((packed[:, None] >> bit[None, :]) & 1) != 0  # [BLOCK_W, 32]
    cols = words[:, None] * 32 + bit[None, :]  # [BLOCK_W, 32] token ids
    ptrs = logits_ptr + row * stride_b + cols
    tl.store(ptrs, tl.full([BLOCK_W, 32], float("-inf"), tl.float32), mask=(cols < V) & ~allowed)


def apply_grammar_bitmask(logits: torch.Tensor, rows: torch.Tensor, bitmask: torch.Tensor,
                          block_w: int = 64) -> torch.Tensor:
    """``logits`` ([B, V] float32, in place): row ``rows[j]`` keeps only the tokens ``bitmask[j]`` allows."""
    if logits.dtype != torch.float32 or logits.stride(1) != 1:
        raise ValueError("logits must be contiguous float32 rows")
    R, W = bitmask.shape
    if R == 0:
        return logits
    V = logits.shape[1]
    grid = (R, triton.cdiv(W, block_w))
    _grammar_mask_kernel[grid](logits, logits.stride(0), rows, bitmask, bitmask.stride(0), V, W, BLOCK_W=block_w)
    return logits
