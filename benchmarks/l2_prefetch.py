"""Warm the L2 cache with the start of a weight matrix before the GEMM that reads it.

A decode step's linear layers stream their weights from HBM, and each one pays a fixed cost
(~4 us on an H200: launch, the first loads' latency, the last wave's tail) on top of its bytes.
Between two GEMMs run kernels that hardly touch HBM (all-reduces, norms, RoPE, SiLU-and-mul), so
a prefetch of the next weight's first bytes, launched on a side stream when the previous GEMM
ends, can run in that idle time and the GEMM then starts on L2 hits.

Three ways to issue it (``mode``):

* ``"line"``: ``prefetch.global.L2::evict_last`` per 128-byte line, from every thread;
* ``"bulk"``: ``cp.async.bulk.prefetch.L2.global`` (Hopper's TMA), one instruction per ``CHUNK`` bytes;
* ``"load"``: plain loads with the ``evict_last`` policy, summed so the compiler keeps them.

NOTE: the prefetched tensor must not be written while the GEMM may read it (weights are read-only
during a forward), and the prefetch changes no value anywhere: it is a hint, so it needs no wait
before the GEMM and no PDL wait of its own.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LINE = 128  # bytes per prefetched L2 line
CHUNK = 16384  # bytes per bulk prefetch instruction
MODES = ("line", "bulk", "load")


@triton.jit
def _prefetch_lines_kernel(base_ptr, n_lines, LINES_PER_PROGRAM: tl.constexpr, BLOCK: tl.constexpr):
    start = tl.program_id(0) * LINES_PER_PROGRAM
    for i in tl.range(0, LINES_PER_PROGRAM, BLOCK):
        line = start + i + tl.arange(0, BLOCK)  # [BLOCK]
        ptrs = base_ptr + line.to(tl.int64) * 128  # NOTE: base_ptr is a byte (uint8) pointer
        ptrs = tl.where(line < n_lines, ptrs, base_ptr)
        tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _prefetch_bulk_kernel(base_ptr, n_chunks, CHUNK_BYTES: tl.constexpr, CHUNKS_PER_PROGRAM: tl.constexpr):
    chunk = tl.program_id(0) * CHUNKS_PER_PROGRAM + tl.arange(0, CHUNKS_PER_PROGRAM)  # [CHUNKS_PER_PROGRAM]
    ptrs = base_ptr + chunk.to(tl.int64) * CHUNK_BYTES
    size = tl.where(chunk < n_chunks, CHUNK_BYTES, 0).to(tl.int32)
    ptrs = tl.where(chunk < n_chunks, ptrs, base_ptr)
    tl.inline_asm_elementwise(
        "{\n\t.reg .pred p;\n\tsetp.ne.s32 p, $2, 0;\n\t@p cp.async.bulk.prefetch.L2.global [$1], $2;\n\t}"
        "\n\tmov.u32 $0, 0;", "=r,l,r", [ptrs, size], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _prefetch_load_kernel(base_ptr, sink_ptr, n_words, WORDS_PER_PROGRAM: tl.constexpr, BLOCK: tl.constexpr):
    start = tl.program_id(0) * WORDS_PER_PROGRAM
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for i in tl.range(0, WORDS_PER_PROGRAM, BLOCK):
        word = start + i + tl.arange(0, BLOCK)  # [BLOCK]
        acc ^= tl.load(base_ptr + word, mask=word < n_words, other=0, eviction_policy="evict_last")
    total = tl.reduce(acc, 0, _xor)
    tl.store(sink_ptr, total, mask=total == 0x7F3A5C1D)  # NOTE: keeps the loads; almost never stores


@triton.jit
def _xor(a, b):
    return a ^ b


def l2_prefetch(weight: torch.Tensor, nbytes: int, mode: str = "line", programs: int = 16) -> None:
    """Prefetch the first ``nbytes`` bytes of ``weight`` (contiguous, on a GPU) into L2 with ``programs``
    programs, on the current stream; returns at once (the GPU does the work)."""
    if mode not in MODES:
        raise ValueError(f"l2_prefetch mode must be one of {MODES}, not {mode!r}")
    if not weight.is_cuda or not weight.is_contiguous():
        raise ValueError("l2_prefetch needs a contiguous CUDA tensor")
    nbytes = min(nbytes, weight.numel() * weight.element_size())
    if nbytes <= 0 or programs <= 0:
        return
    flat = weight.view(-1).view(torch.uint8)  # [bytes]
    if mode == "line":
        n = triton.cdiv(nbytes, LINE)
        per = max(256, triton.next_power_of_2(triton.cdiv(n, programs)))
        _prefetch_lines_kernel[(triton.cdiv(n, per),)](flat, n, LINES_PER_PROGRAM=per, BLOCK=256, num_warps=4)
    elif mode == "bulk":
        n = nbytes // CHUNK  # NOTE: whole chunks only (16-byte aligned sizes and addresses)
        if n == 0:
            return
        per = max(32, triton.next_power_of_2(triton.cdiv(n, programs)))
        _prefetch_bulk_kernel[(triton.cdiv(n, per),)](flat, n, CHUNK_BYTES=CHUNK, CHUNKS_PER_PROGRAM=per,
                                                       num_warps=1)
    else:
        words = flat[: nbytes - nbytes % 4].view(torch.int32)  # [nbytes / 4]
        n = words.numel()
        per = max(4096, triton.next_power_of_2(triton.cdiv(n, programs)))
        sink = torch.empty(1, dtype=torch.int32, device=weight.device)
        _prefetch_load_kernel[(triton.cdiv(n, per),)](words, sink, n, WORDS_PER_PROGRAM=per, BLOCK=4096,
                                                       num_warps=8)
