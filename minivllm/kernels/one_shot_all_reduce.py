"""One-shot all-reduce for small messages (Triton), over buffers every rank can address.

Each rank writes its input into its slot of every peer's exchange buffer (remote stores are
posted, so NVLink bandwidth, not latency, bounds them), raises a flag on each peer, waits for the
peers' flags, then sums the ``world`` slots of its own buffer, all local now. One kernel, one
round of flags, which beats a NCCL all-reduce on the 8 KB messages of tensor-parallel decoding (the idea
of vLLM's, SGLang's and TensorRT-LLM's custom all-reduce). Figures: docs/performance-notes.md; measured by
``PYTHONPATH=. python benchmarks/kernels/all_reduce.py --world 2``.

``ptrs`` (int64, on the kernel's device) holds the addresses: ``ptrs[0:W]`` every rank's data
buffer (two halves of ``W`` slots of ``cap`` elements), ``ptrs[W:2W]`` every rank's flags (int32,
one row of ``W`` per program), ``ptrs[2W]`` an abort flag (pinned host memory on GPUs) that ends
the waits.

NOTE (the protocol):
* program ``pid`` of every rank handles the same chunks (the grid is the same on every rank and
  every call), so it only waits for program ``pid`` of the peers;
* ``counters[pid]`` (this rank's, local) counts the calls, so call ``e`` raises the flags to ``e``
  and waits until they are ``>= e``: flags are never reset;
* call ``e`` writes buffer half ``e % 2``. A peer can still be reading its half ``e % 2`` of call
  ``e - 2`` only if it has not finished that kernel, but this rank's call ``e - 1`` waited for
  that peer's call ``e - 1``, which starts after its call ``e - 2`` ends: no end barrier needed;
* the sum runs in rank order in float32, so every rank gets the same bits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.kernels.pdl import pdl_options, pdl_wait

try:
    from triton.language.extra.cuda import globaltimer
except ImportError:  # pragma: no cover - older Triton: the abort flag is read every CHECK_EVERY polls
    globaltimer = None

# NOTE: a wait reads the abort flag (pinned host memory) every this many polls of the peers' flags, and
# on GPUs only once it has lasted ABORT_CHECK_AFTER_NS. Every thread of every program reads it: frequent
# host reads make a rank late for the next call, its peer's wait then reaches its own host reads, and the
# two sustain each other, slowing every call (docs/performance-notes.md, "All-reduce abort-flag polling").
SPIN_CHECK_ABORT_EVERY = 1024
ABORT_CHECK_AFTER_NS = tl.constexpr(20_000_000)  # a wait this long (20 ms) means a peer is stuck or dead


@triton.jit
def _push_row(x, ptrs, dst_off, mask, half, cap, RANK: tl.constexpr, WORLD: tl.constexpr):
    """Store ``x`` at ``dst_off`` of slot RANK of every peer's buffer half ``half``."""
    for p in tl.static_range(WORLD):
        if p != RANK:
            dst = tl.load(ptrs + p).to(tl.pointer_type(x.dtype))
            tl.store(dst + half + RANK * cap + dst_off, x, mask=mask)


@triton.jit
def _signal_and_wait(ptrs, pid, epoch, RANK: tl.constexpr, WORLD: tl.constexpr, CHECK_EVERY: tl.constexpr,
                     TIMED_ABORT: tl.constexpr):
    """Raise this program's flag on every peer to ``epoch``, then wait until every peer's program
    ``pid`` has raised its flag here (or the abort flag is set; with ``TIMED_ABORT`` it is read only
    once the wait has lasted ABORT_CHECK_AFTER_NS)."""
    tl.debug_barrier()  # NOTE: every thread's stores happen before the release below
    flags = tl.load(ptrs + WORLD + RANK).to(tl.pointer_type(tl.int32)) + pid * WORLD
    for p in tl.static_range(WORLD):
        if p != RANK:
            peer_flags = tl.load(ptrs + WORLD + p).to(tl.pointer_type(tl.int32)) + pid * WORLD
            tl.atomic_xchg(peer_flags + RANK, epoch, sem="release", scope="sys")
    abort = tl.load(ptrs + 2 * WORLD).to(tl.pointer_type(tl.int32))
    t0 = tl.zeros([], dtype=tl.int64)
    if TIMED_ABORT:
        t0 = globaltimer()
    for p in tl.static_range(WORLD):
        if p != RANK:
            # spin on plain volatile loads (a sys-scope acquire per poll, from every program,
            # slowed the peers' incoming stores), then one acquire once the flag is up
            seen = tl.load(flags + p, volatile=True)
            stop = tl.zeros([], dtype=tl.int32)
            spins = tl.zeros([], dtype=tl.int32)
            while (seen < epoch) & (stop == 0):
                seen = tl.load(flags + p, volatile=True)
                spins += 1
                if spins % CHECK_EVERY == 0:
                    if TIMED_ABORT:
                        if globaltimer() - t0 > ABORT_CHECK_AFTER_NS:
                            stop = tl.load(abort, volatile=True)
                    else:
                        stop = tl.load(abort, volatile=True)
            tl.atomic_add(flags + p, 0, sem="acquire", scope="sys")
    tl.debug_barrier()  # NOTE: the peers' data is read after the acquire above


@triton.jit
def _sum_slots(x_ptr, own, off, mask, cap, RANK: tl.constexpr, WORLD: tl.constexpr):
    """float32 sum, in rank order, of this rank's input and the peers' slots at ``off``."""
    acc = tl.zeros(off.shape, dtype=tl.float32)
    for p in tl.static_range(WORLD):
        if p == RANK:
            acc += tl.load(x_ptr + off, mask=mask, other=0.0).to(tl.float32)
        else:
            acc += tl.load(own + p * cap + off, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
    return acc


@triton.jit
def _one_shot_all_reduce_kernel(
    x_ptr,  # [n] this rank's input
    out_ptr,  # [n] the sum (may be x_ptr)
    n,
    cap,  # elements in each slot of a data buffer
    ptrs,  # [2W + 1] int64 addresses, see the module docstring
    counters,  # [grid] int32, this rank's call count per program
    RANK: tl.constexpr,
    WORLD: tl.constexpr,
    BLOCK: tl.constexpr,
    CHECK_EVERY: tl.constexpr,
    TIMED_ABORT: tl.constexpr,  # read the abort flag only after long waits (GPUs: globaltimer)
    USE_PDL: tl.constexpr,
):
    pdl_wait(USE_PDL)
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    epoch = tl.load(counters + pid) + 1
    half = (epoch % 2).to(tl.int64) * WORLD * cap
    for start in range(pid * BLOCK, n, step):  # push: my input into slot RANK of every peer's buffer
        offs = start + tl.arange(0, BLOCK)  # [BLOCK]
        mask = offs < n
        _push_row(tl.load(x_ptr + offs, mask=mask), ptrs, offs, mask, half, cap, RANK, WORLD)
    _signal_and_wait(ptrs, pid, epoch, RANK, WORLD, CHECK_EVERY, TIMED_ABORT)
    own = tl.load(ptrs + RANK).to(tl.pointer_type(x_ptr.dtype.element_ty)) + half
    for start in range(pid * BLOCK, n, step):  # every slot is local now: sum them in rank order
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        acc = _sum_slots(x_ptr, own, offs, mask, cap, RANK, WORLD)
        tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(counters + pid, epoch)


@triton.jit
def _one_shot_all_reduce_add_rms_norm_kernel(
    x_ptr,  # [M, D] this rank's partial sums; overwritten with the normalised rows
    res_ptr,  # [M, D] the residual; overwritten with (sum + residual)
    w_ptr,  # [D] the norm's weight
    M,
    D,
    eps,
    cap,
    ptrs,
    counters,
    RANK: tl.constexpr,
    WORLD: tl.constexpr,
    BLOCK_D: tl.constexpr,
    ROWS: tl.constexpr,  # rows a program handles at once (a [ROWS, BLOCK_D] tile)
    CHECK_EVERY: tl.constexpr,
    TIMED_ABORT: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_wait(USE_PDL)
    # NOTE: the same flags, halves and per-program epochs as _one_shot_all_reduce_kernel (the two
    # interleave on one buffer), but program pid owns whole rows pid, pid + grid, ..., ROWS of them a tile
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    dt = x_ptr.dtype.element_ty
    epoch = tl.load(counters + pid) + 1
    half = (epoch % 2).to(tl.int64) * WORLD * cap
    offs = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    d_mask = offs < D
    tile = tl.arange(0, ROWS) * nprog  # [ROWS] row offsets of a tile
    for base in range(pid, M, nprog * ROWS):
        rows = base + tile  # [ROWS]
        mask = (rows < M)[:, None] & d_mask[None, :]  # [ROWS, BLOCK_D]
        off = rows[:, None] * D + offs[None, :]  # [ROWS, BLOCK_D] (< cap: int32 is enough)
        _push_row(tl.load(x_ptr + off, mask=mask), ptrs, off, mask, half, cap, RANK, WORLD)
    _signal_and_wait(ptrs, pid, epoch, RANK, WORLD, CHECK_EVERY, TIMED_ABORT)
    own = tl.load(ptrs + RANK).to(tl.pointer_type(dt)) + half
    w = tl.load(w_ptr + offs, mask=d_mask, other=0.0).to(tl.float32)[None, :]  # [1, BLOCK_D]
    for base in range(pid, M, nprog * ROWS):
        rows = base + tile
        mask = (rows < M)[:, None] & d_mask[None, :]
        off = rows[:, None] * D + offs[None, :]
        total = _sum_slots(x_ptr, own, off, mask, cap, RANK, WORLD).to(dt)  # the all-reduce's result
        # then fused_norm's ops: h = sum + residual in x's dtype, normalised rounded first
        h = (total.to(tl.float32) + tl.load(res_ptr + off, mask=mask, other=0.0).to(tl.float32)).to(dt)
        tl.store(res_ptr + off, h, mask=mask)
        hf = h.to(tl.float32)  # [ROWS, BLOCK_D]
        rstd = 1.0 / tl.sqrt(tl.sum(hf * hf, axis=1) / D + eps)  # [ROWS]
        normed = (hf * rstd[:, None]).to(dt).to(tl.float32)
        tl.store(x_ptr + off, (normed * w).to(dt), mask=mask)
    tl.store(counters + pid, epoch)


def _timed_abort(x: torch.Tensor) -> bool:
    """GPUs read the abort flag only after long waits (the interpreter, on CPU tensors, has no timer)."""
    return x.is_cuda and globaltimer is not None


def one_shot_all_reduce(x: torch.Tensor, out: torch.Tensor, ptrs: torch.Tensor, counters: torch.Tensor,
                        cap: int, rank: int, world: int, block: int = 2048, num_warps: int = 8) -> None:
    """Launch the kernel with one program per entry of ``counters`` (the same count on every rank).

    ``cap``: elements of ``x``'s dtype in one slot of a data buffer.
    """
    _one_shot_all_reduce_kernel[(counters.numel(),)](
        x, out, x.numel(), cap, ptrs, counters, RANK=rank, WORLD=world, BLOCK=block,
        CHECK_EVERY=SPIN_CHECK_ABORT_EVERY, TIMED_ABORT=_timed_abort(x), num_warps=num_warps, **pdl_options(x))


def norm_tile_rows(m: int, d: int, programs: int, max_tile: int = 8192) -> int:
    """Rows a program of the fused kernel handles at once: enough for its share of ``m`` rows, at most
    ``max_tile`` elements a tile (a power of two)."""
    share = triton.next_power_of_2(max(1, triton.cdiv(m, programs)))
    return max(1, min(share, max_tile // triton.next_power_of_2(d)))


def one_shot_all_reduce_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                                     ptrs: torch.Tensor, counters: torch.Tensor, cap: int, rank: int, world: int,
                                     rows: int | None = None) -> None:
    """In place: ``residual = sum_ranks(x) + residual``, ``x = rms_norm(residual) * weight`` (``fused_norm``'s
    numerics) for contiguous ``[M, D]`` ``x`` and ``residual``; the same buffers and counters as
    ``one_shot_all_reduce``. ``rows``: a program's tile height (default ``norm_tile_rows``; the result
    does not depend on it)."""
    d = x.shape[-1]
    m = x.numel() // d
    block_d = triton.next_power_of_2(d)
    rows = rows or norm_tile_rows(m, d, counters.numel())
    _one_shot_all_reduce_add_rms_norm_kernel[(counters.numel(),)](
        x, residual, weight, m, d, eps, cap, ptrs, counters,
        RANK=rank, WORLD=world, BLOCK_D=block_d, ROWS=rows, CHECK_EVERY=SPIN_CHECK_ABORT_EVERY,
        TIMED_ABORT=_timed_abort(x),
        num_warps=max(1, min(16, block_d // 256)), **pdl_options(x))
