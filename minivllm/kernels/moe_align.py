"""``moe_align_block_size``: the ``n * top_k`` (token, pick) pairs of a MoE layer sorted by expert, each
expert's run padded to a multiple of the grouped GEMM's row tile ``BLOCK_M``, on the GPU without a host sync.

Outputs (vLLM's layout): ``sorted_token_ids`` [max_padded] int32 holds flat pair indices ``token * top_k +
pick``, expert by expert, in pair order within an expert, each run padded with the sentinel ``n * top_k``;
``expert_ids`` [cdiv(max_padded, BLOCK_M)] int32 is the expert of each row tile (-1 past the end);
``num_tokens_post_padded`` [1] int32 (a device tensor) is the padded length actually used. ``max_padded`` is
the bound ``n * top_k + min(n * top_k, E) * (BLOCK_M - 1)`` (at most that many experts have a pair, each
pads fewer than ``BLOCK_M`` rows), known on the host from the shapes alone: a grid sized by it is the same
at every call, which is what CUDA-graph capture needs; tiles past ``num_tokens_post_padded`` exit at once.

Three kernels, all deterministic (no atomics): per chunk of ``CHUNK`` pairs, the count per expert, and a
slice of ``sorted_token_ids`` filled with the sentinel (``_chunk_counts_kernel``); one program turns the counts
into each expert's padded start, each chunk's start within each expert's run and the tile -> expert map
(``_offsets_kernel``); per chunk, each pair's rank among the chunk's pairs of its expert, and its slot
(``_scatter_kernel``). At most ``CHUNK`` pairs (a decode batch) take one program doing all three
(``_align_one_chunk_kernel``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.kernels.pdl import pdl_options, pdl_wait


@triton.jit
def _expert_counts(ids, E_PAD: tl.constexpr):
    """``[E_PAD]`` int32: how many of ``ids`` (a chunk, -1 where masked) name each expert."""
    e = tl.arange(0, E_PAD)
    return tl.sum((ids[:, None] == e[None, :]).to(tl.int32), 0)


@triton.jit
def _ranks(ids, CHUNK: tl.constexpr):
    """``[CHUNK]`` int32: each pair's rank among the chunk's earlier pairs with the same expert."""
    i = tl.arange(0, CHUNK)
    before = (ids[:, None] == ids[None, :]) & (i[None, :] < i[:, None])  # [CHUNK, CHUNK]
    return tl.sum(before.to(tl.int32), 1)


@triton.jit
def _fill(ptr, first, last, value, FILL: tl.constexpr):
    """``ptr[first:last] = value`` (int32)."""
    for s0 in range(first, last, FILL):
        s = s0 + tl.arange(0, FILL)  # [FILL]
        tl.store(ptr + s, tl.zeros([FILL], dtype=tl.int32) + value, mask=s < last)


@triton.jit
def _runs(counts, BLOCK_M: tl.constexpr):
    """Each expert's padded run from its pair counts ``[E_PAD]``: ``(start [E_PAD], end [E_PAD], used)``."""
    padded = tl.cdiv(counts, BLOCK_M) * BLOCK_M  # [E_PAD]
    end = tl.cumsum(padded, 0)  # [E_PAD]
    return end - padded, end, tl.sum(padded, 0)


@triton.jit
def _tile_experts(expert_ids_ptr, end, used, E, num_tiles, BLOCK_M: tl.constexpr, E_PAD: tl.constexpr,
                  FILL: tl.constexpr):
    """``expert_ids``: a tile's expert is how many experts' runs end at or before its first row (-1 past
    ``used``; the padding lanes past E never end)."""
    e = tl.arange(0, E_PAD)
    end = tl.where(e < E, end, 1 << 30)
    for t0 in range(0, num_tiles, FILL):
        t = t0 + tl.arange(0, FILL)  # [FILL]
        first = t * BLOCK_M
        expert = tl.sum((end[None, :] <= first[:, None]).to(tl.int32), 1)  # [FILL]
        tl.store(expert_ids_ptr + t, tl.where(first < used, expert, -1), mask=t < num_tiles)


@triton.jit
def _align_one_chunk_kernel(
    ids_ptr,  # [numel] int32, numel <= CHUNK
    sorted_ptr,  # [max_padded] int32
    expert_ids_ptr,  # [num_tiles] int32
    post_pad_ptr,  # [1] int32
    numel,
    E,
    num_tiles,
    max_padded,
    BLOCK_M: tl.constexpr,
    E_PAD: tl.constexpr,
    CHUNK: tl.constexpr,
    FILL: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """The whole alignment in one program, for at most ``CHUNK`` pairs (a decode batch): one launch, not three."""
    pdl_wait(USE_PDL)
    i = tl.arange(0, CHUNK)  # [CHUNK]
    ids = tl.load(ids_ptr + i, mask=i < numel, other=-1)  # [CHUNK]
    start, end, used = _runs(_expert_counts(ids, E_PAD), BLOCK_M)
    tl.store(post_pad_ptr, used)
    _tile_experts(expert_ids_ptr, end, used, E, num_tiles, BLOCK_M, E_PAD, FILL)
    _fill(sorted_ptr, 0, max_padded, numel, FILL)
    # NOTE: the scatter below overwrites slots the fill wrote, from other threads of this program
    tl.debug_barrier()
    e = tl.arange(0, E_PAD)
    first = tl.sum(tl.where(ids[:, None] == e[None, :], start[None, :], 0), 1)  # [CHUNK] its expert's start
    tl.store(sorted_ptr + first + _ranks(ids, CHUNK), i, mask=i < numel)


@triton.jit
def _chunk_counts_kernel(
    ids_ptr,  # [numel] int32, the flat topk_ids
    counts_ptr,  # [num_chunks, E_PAD] int32
    sorted_ptr,  # [max_padded] int32: filled with the sentinel here, a slice a program
    numel,
    max_padded,
    fill_per_program,
    E_PAD: tl.constexpr,
    CHUNK: tl.constexpr,
    FILL: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_wait(USE_PDL)
    c = tl.program_id(0)
    offs = c * CHUNK + tl.arange(0, CHUNK)  # [CHUNK]
    ids = tl.load(ids_ptr + offs, mask=offs < numel, other=-1)  # [CHUNK]
    tl.store(counts_ptr + c * E_PAD + tl.arange(0, E_PAD), _expert_counts(ids, E_PAD))
    first = c * fill_per_program
    _fill(sorted_ptr, first, tl.minimum(first + fill_per_program, max_padded), numel, FILL)


@triton.jit
def _offsets_kernel(
    counts_ptr,  # [num_chunks, E_PAD] int32: in, the counts; out, each chunk's first slot per expert
    expert_ids_ptr,  # [num_tiles] int32
    post_pad_ptr,  # [1] int32
    E,
    num_chunks,
    num_tiles,
    BLOCK_M: tl.constexpr,
    E_PAD: tl.constexpr,
    FILL: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_wait(USE_PDL)
    e = tl.arange(0, E_PAD)  # [E_PAD]
    total = tl.zeros([E_PAD], dtype=tl.int32)
    for c in range(num_chunks):
        total += tl.load(counts_ptr + c * E_PAD + e)
    start, end, used = _runs(total, BLOCK_M)
    # each chunk's pairs of expert e start after the earlier chunks' pairs of e
    running = start
    for c in range(num_chunks):
        here = tl.load(counts_ptr + c * E_PAD + e)
        tl.store(counts_ptr + c * E_PAD + e, running)
        running += here
    tl.store(post_pad_ptr, used)
    _tile_experts(expert_ids_ptr, end, used, E, num_tiles, BLOCK_M, E_PAD, FILL)


@triton.jit
def _scatter_kernel(
    ids_ptr,  # [numel] int32
    offsets_ptr,  # [num_chunks, E_PAD] int32: each chunk's first slot per expert
    sorted_ptr,  # [max_padded] int32
    numel,
    E_PAD: tl.constexpr,
    CHUNK: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_wait(USE_PDL)
    c = tl.program_id(0)
    offs = c * CHUNK + tl.arange(0, CHUNK)  # [CHUNK]
    mask = offs < numel
    ids = tl.load(ids_ptr + offs, mask=mask, other=-1)  # [CHUNK]
    first = tl.load(offsets_ptr + c * E_PAD + ids, mask=mask, other=0)  # [CHUNK]
    tl.store(sorted_ptr + first + _ranks(ids, CHUNK), offs, mask=mask)


def max_padded_len(numel: int, num_experts: int, block_m: int) -> int:
    """The most slots ``sorted_token_ids`` can need for ``numel`` pairs over ``num_experts`` experts."""
    return numel + min(numel, num_experts) * (block_m - 1)


def moe_align_block_size(topk_ids: torch.Tensor, block_m: int,
                         num_experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``topk_ids`` [n, top_k] (int32, ids in ``[0, num_experts)``) -> ``(sorted_token_ids [max_padded] int32,
    expert_ids [cdiv(max_padded, block_m)] int32, num_tokens_post_padded [1] int32)`` (see the module doc)."""
    if topk_ids.dim() != 2 or topk_ids.dtype != torch.int32:
        raise ValueError(f"topk_ids must be [n, top_k] int32, got {tuple(topk_ids.shape)} {topk_ids.dtype}")
    if block_m < 1 or block_m & (block_m - 1):
        raise ValueError(f"block_m must be a power of two, got {block_m}")
    ids = topk_ids.contiguous().view(-1)  # [numel]
    numel, dev = ids.numel(), ids.device
    max_padded = max_padded_len(numel, num_experts, block_m)
    num_tiles = triton.cdiv(max_padded, block_m)
    sorted_ids = torch.empty(max_padded, dtype=torch.int32, device=dev)
    expert_ids = torch.empty(num_tiles, dtype=torch.int32, device=dev)
    post_pad = torch.zeros(1, dtype=torch.int32, device=dev)
    if numel == 0:
        return sorted_ids, expert_ids.fill_(-1), post_pad
    e_pad = triton.next_power_of_2(num_experts)
    chunk = max(16, min(128, 16384 // e_pad))  # [CHUNK, E_PAD] and [CHUNK, CHUNK] compares in registers
    num_chunks = triton.cdiv(numel, chunk)
    counts = torch.empty(num_chunks, e_pad, dtype=torch.int32, device=dev)  # [num_chunks, E_PAD]
    pdl = pdl_options(topk_ids)
    fill = max(16, min(256, 8192 // e_pad))  # [FILL, E_PAD] compares
    if num_chunks == 1:
        _align_one_chunk_kernel[(1,)](ids, sorted_ids, expert_ids, post_pad, numel, num_experts, num_tiles, max_padded,
                                      BLOCK_M=block_m, E_PAD=e_pad, CHUNK=chunk, FILL=fill, num_warps=4, **pdl)
        return sorted_ids, expert_ids, post_pad
    _chunk_counts_kernel[(num_chunks,)](ids, counts, sorted_ids, numel, max_padded, triton.cdiv(max_padded, num_chunks),
                                        E_PAD=e_pad, CHUNK=chunk, FILL=512, num_warps=4, **pdl)
    _offsets_kernel[(1,)](counts, expert_ids, post_pad, num_experts, num_chunks, num_tiles, BLOCK_M=block_m,
                          E_PAD=e_pad, FILL=fill, num_warps=4, **pdl)
    _scatter_kernel[(num_chunks,)](ids, counts, sorted_ids, numel, E_PAD=e_pad, CHUNK=chunk, num_warps=4, **pdl)
    return sorted_ids, expert_ids, post_pad
