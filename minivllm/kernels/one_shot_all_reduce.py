"""One-shot all-reduce for small messages (Triton), over buffers every rank can address.

Each rank writes its input into its slot of every peer's exchange buffer (remote stores are
posted, so NVLink bandwidth, not latency, bounds them), raises a flag on each peer, waits for the
peers' flags, then sums the ``world`` slots of its own buffer, all local now. One kernel, one
round of flags: a few microseconds for the 8 KB messages of tensor-parallel decoding, where a
NCCL all-reduce takes tens (the idea of vLLM's, SGLang's and TensorRT-LLM's custom all-reduce).

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

try:
    from triton.language.extra.cuda import globaltimer
except ImportError:  # pragma: no cover - older Triton: no wait records
    globaltimer = None

SPIN_CHECK_ABORT_EVERY = 1024


@triton.jit
def _one_shot_all_reduce_kernel(
    x_ptr,  # [n] this rank's input
    out_ptr,  # [n] the sum (may be x_ptr)
    n,
    cap,  # elements in each slot of a data buffer
    ptrs,  # [2W + 1] int64 addresses, see the module docstring
    counters,  # [grid] int32, this rank's call count per program
    waits,  # [WAIT_RING] int64: program 0's wait for the peers' flags, ns, at call % WAIT_RING
    RANK: tl.constexpr,
    WORLD: tl.constexpr,
    BLOCK: tl.constexpr,
    CHECK_EVERY: tl.constexpr,
    WAIT_RING: tl.constexpr,  # 0: no records (a diagnostic; GPUs only)
):
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    dt = x_ptr.dtype.element_ty
    epoch = tl.load(counters + pid) + 1
    half = (epoch % 2).to(tl.int64) * WORLD * cap
    for start in range(pid * BLOCK, n, step):  # push: my input into slot RANK of every peer's buffer
        offs = start + tl.arange(0, BLOCK)  # [BLOCK]
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        for p in tl.static_range(WORLD):
            if p != RANK:
                dst = tl.load(ptrs + p).to(tl.pointer_type(dt))
                tl.store(dst + half + RANK * cap + offs, x, mask=mask)
    tl.debug_barrier()  # NOTE: every thread's stores happen before the release below
    flags = tl.load(ptrs + WORLD + RANK).to(tl.pointer_type(tl.int32)) + pid * WORLD
    for p in tl.static_range(WORLD):
        if p != RANK:
            peer_flags = tl.load(ptrs + WORLD + p).to(tl.pointer_type(tl.int32)) + pid * WORLD
            tl.atomic_xchg(peer_flags + RANK, epoch, sem="release", scope="sys")
    abort = tl.load(ptrs + 2 * WORLD).to(tl.pointer_type(tl.int32))
    t0 = tl.zeros([], dtype=tl.int64)
    if WAIT_RING > 0:
        t0 = globaltimer()
    for p in tl.static_range(WORLD):
        if p != RANK:
            # NOTE: spin on plain volatile loads (a sys-scope acquire per poll, from every program,
            # slowed the peers' incoming stores), then one acquire once the flag is up
            seen = tl.load(flags + p, volatile=True)
            stop = tl.zeros([], dtype=tl.int32)
            spins = tl.zeros([], dtype=tl.int32)
            while (seen < epoch) & (stop == 0):
                seen = tl.load(flags + p, volatile=True)
                spins += 1
                if spins % CHECK_EVERY == 0:
                    stop = tl.load(abort, volatile=True)
            tl.atomic_add(flags + p, 0, sem="acquire", scope="sys")
    if WAIT_RING > 0:
        if pid == 0:
            tl.store(waits + epoch % WAIT_RING, globaltimer() - t0)
    tl.debug_barrier()  # NOTE: the peers' data is read after the acquire above
    own = tl.load(ptrs + RANK).to(tl.pointer_type(dt)) + half
    for start in range(pid * BLOCK, n, step):  # every slot is local now: sum them in rank order
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for p in tl.static_range(WORLD):
            if p == RANK:
                acc += tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            else:
                acc += tl.load(own + p * cap + offs, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
        tl.store(out_ptr + offs, acc.to(dt), mask=mask)
    tl.store(counters + pid, epoch)


def one_shot_all_reduce(x: torch.Tensor, out: torch.Tensor, ptrs: torch.Tensor, counters: torch.Tensor,
                        cap: int, rank: int, world: int, block: int = 2048, num_warps: int = 8,
                        waits: torch.Tensor | None = None) -> None:
    """Launch the kernel with one program per entry of ``counters`` (the same count on every rank).

    ``cap``: elements of ``x``'s dtype in one slot of a data buffer. ``waits`` (int64, GPUs): a ring
    that records how long each call waited for the peers (program 0, ns), indexed by call count.
    """
    ring = 0 if waits is None or globaltimer is None or not x.is_cuda else waits.numel()
    _one_shot_all_reduce_kernel[(counters.numel(),)](
        x, out, x.numel(), cap, ptrs, counters, waits if ring else counters, RANK=rank, WORLD=world, BLOCK=block,
        CHECK_EVERY=SPIN_CHECK_ABORT_EVERY, WAIT_RING=ring, num_warps=num_warps)
