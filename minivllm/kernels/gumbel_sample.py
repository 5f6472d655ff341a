"""One-pass random sampling from logits: ``argmax(l / T + Gumbel noise)`` per row (Triton).

The Gumbel-max trick draws token ``t`` with probability ``softmax(l / T)[t]``, the same
distribution as the sampler's exponential race (``argmax(p / E)`` with ``E ~ Exp(1)`` is
``argmax(log p + G)`` with ``G = -log E ~ Gumbel(0, 1)``), but it needs no softmax and no noise
tensor: the programs of a row each scan ``block_v`` of its tokens, draw ``G`` with Philox from the
row's seed and the token index and keep their maximum; a second small kernel picks the row's best
chunk. (One program a row, scanning the vocabulary alone, was slower at 256 rows and left all but
one SM idle for one row: docs/performance-notes.md; ``PYTHONPATH=. python benchmarks/kernels/sampler.py
--fused`` times the pass.) Rows with temperature 0 take the plain argmax.

Randomness: row ``b`` uses ``seeds[b]`` (int64) as the Philox key and the token id as the counter,
so a row's draw depends only on its seed, never on its batch or position.

Tensor parallelism (``gumbel_sample_shard`` + ``pick_across_shards``): each rank scans its own
vocabulary slice with the GLOBAL token id as the counter, so its noise is exactly the unsharded
pass's on those tokens; it keeps one (best noisy value, token id) pair a row, and the best pair over
the ranks (the lowest rank on ties) is the token ``gumbel_sample`` draws from the whole row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _gumbel_chunk_kernel(
    logits_ptr,  # [B, >= V] any float dtype
    stride_b,
    temperature_ptr,  # [B] float32 (read if HAS_TEMPERATURE)
    seeds_ptr,  # [B] int64 (read if NOISY)
    best_ptr,  # [B, C] float32: each chunk's best noisy logit
    idx_ptr,  # [B, C] int32: its global token id
    V,  # columns scanned (a padded tail beyond them is skipped)
    C,
    vocab_start,  # global token id of column 0 (a tensor-parallel rank's slice; else 0)
    HAS_TEMPERATURE: tl.constexpr,
    NOISY: tl.constexpr,  # False: the plain argmax of every row (an all-greedy batch; no seeds read)
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    inv_t = 1.0
    noisy = True
    if HAS_TEMPERATURE:
        t = tl.load(temperature_ptr + row)
        noisy = t > 0.0
        inv_t = tl.where(noisy, 1.0 / tl.maximum(t, 1e-30), 1.0)
    offs = chunk * BLOCK_V + tl.arange(0, BLOCK_V)  # [BLOCK_V] local columns
    mask = offs < V
    x = tl.load(logits_ptr + row.to(tl.int64) * stride_b + offs, mask=mask, other=-float("inf")).to(tl.float32) * inv_t
    if NOISY:
        seed = tl.load(seeds_ptr + row)
        if noisy:
            # NOTE: the counter is the GLOBAL token id: a vocabulary slice draws the unsharded noise
            u = tl.rand(seed, vocab_start + offs)  # [BLOCK_V] uniform in [0, 1)
            x = x - tl.log(-tl.log(u))  # u = 0 gives -inf: that token cannot win
    x = tl.where(mask, x, -float("inf"))
    # argmax takes the first of equal values: ties keep the lower token id, as torch.argmax
    tl.store(best_ptr + row * C + chunk, tl.max(x, 0))
    tl.store(idx_ptr + row * C + chunk, vocab_start + chunk * BLOCK_V + tl.argmax(x, 0))


@triton.jit
def _gumbel_pick_kernel(best_ptr, idx_ptr, out_ptr, C, BLOCK_C: tl.constexpr, PAIR: tl.constexpr):
    """Each row's best chunk: ``out[row]`` its token id (int64), or with ``PAIR`` ``out[row] = (best noisy
    value, token id)`` as float64 [B, 2] (both exact in float64)."""
    row = tl.program_id(0)
    c = tl.arange(0, BLOCK_C)  # [BLOCK_C]
    best = tl.load(best_ptr + row * C + c, mask=c < C, other=-float("inf"))
    win = tl.argmax(best, 0)  # the first chunk of equal bests: the lowest token id
    idx = tl.load(idx_ptr + row * C + win)
    if PAIR:
        tl.store(out_ptr + row * 2, tl.load(best_ptr + row * C + win).to(tl.float64))
        tl.store(out_ptr + row * 2 + 1, idx.to(tl.float64))
    else:
        tl.store(out_ptr + row, idx.to(tl.int64))


def _check_inputs(logits: torch.Tensor, seeds: torch.Tensor | None, block_v: int) -> None:
    if logits.dim() != 2 or logits.stride(-1) != 1:
        raise ValueError("logits must be a [B, V] tensor with contiguous rows")
    if block_v < 1 or block_v & (block_v - 1):
        raise ValueError(f"block_v must be a power of two, got {block_v}")
    if seeds is not None and (seeds.shape != (logits.shape[0],) or seeds.dtype != torch.int64):
        raise ValueError("seeds must be an int64 tensor with one seed per row")


def _chunk_pass(logits: torch.Tensor, seeds: torch.Tensor | None, temperature: torch.Tensor | None,
                valid: int, vocab_start: int, block_v: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each chunk's best: ([B, C] float32 noisy value, [B, C] int32 global id) over columns ``[0, valid)``."""
    batch = logits.shape[0]
    has_t = temperature is not None and seeds is not None
    temps = temperature.to(torch.float32).contiguous() if has_t else logits  # (unused pointer when not has_t)
    block_v = min(block_v, triton.next_power_of_2(max(valid, 1)))
    chunks = max(1, triton.cdiv(valid, block_v))  # one all-masked chunk for an empty slice: (-inf, vocab_start)
    best = torch.empty(batch, chunks, dtype=torch.float32, device=logits.device)
    idx = torch.empty(batch, chunks, dtype=torch.int32, device=logits.device)
    _gumbel_chunk_kernel[(batch, chunks)](
        logits, logits.stride(0), temps, seeds.contiguous() if seeds is not None else idx, best, idx, valid,
        chunks, vocab_start, HAS_TEMPERATURE=has_t, NOISY=seeds is not None, BLOCK_V=block_v)
    return best, idx


def gumbel_sample(logits: torch.Tensor, seeds: torch.Tensor, temperature: torch.Tensor | None = None,
                  block_v: int = 4096) -> torch.Tensor:
    """Sample one token id per row of ``logits`` ([B, V]); ``seeds`` [B] int64, ``temperature`` [B] or None (1.0).

    ``block_v``: tokens a program scans (a power of two); the result does not depend on it.
    """
    _check_inputs(logits, seeds, block_v)
    batch, vocab = logits.shape
    out = torch.empty(batch, dtype=torch.int64, device=logits.device)
    if batch == 0:
        return out
    best, idx = _chunk_pass(logits, seeds, temperature, vocab, 0, block_v)
    chunks = best.shape[1]
    _gumbel_pick_kernel[(batch,)](best, idx, out, chunks, BLOCK_C=triton.next_power_of_2(chunks), PAIR=False)
    return out


def gumbel_sample_shard(logits: torch.Tensor, seeds: torch.Tensor | None, temperature: torch.Tensor | None,
                        vocab_start: int, vocab_size: int, block_v: int = 4096) -> torch.Tensor:
    """One vocabulary slice's part of ``gumbel_sample``: [B, 2] float64 (best noisy value, global token id) a row.

    ``logits`` [B, W] holds the global ids ``vocab_start .. vocab_start + W - 1``; ids ``>= vocab_size``
    (the padded tail of the last tensor-parallel slice) are skipped. ``seeds`` None: every row is
    greedy (the plain argmax; ``temperature`` unused); else rows with temperature 0 are. The noise
    of each token is ``gumbel_sample``'s, so ``pick_across_shards`` of all slices is its token.
    """
    _check_inputs(logits, seeds, block_v)
    if vocab_start < 0 or vocab_size < 1:
        raise ValueError(f"need vocab_start >= 0 and vocab_size >= 1, got {vocab_start} and {vocab_size}")
    batch = logits.shape[0]
    out = torch.empty(batch, 2, dtype=torch.float64, device=logits.device)
    if batch == 0:
        return out
    valid = max(0, min(logits.shape[1], vocab_size - vocab_start))  # [vocab_start, vocab_size) only
    best, idx = _chunk_pass(logits, seeds, temperature, valid, vocab_start, block_v)
    chunks = best.shape[1]
    _gumbel_pick_kernel[(batch,)](best, idx, out, chunks, BLOCK_C=triton.next_power_of_2(chunks), PAIR=True)
    return out


def pick_across_shards(parts: list[torch.Tensor]) -> torch.Tensor:
    """[B] int64 token ids from every slice's ``gumbel_sample_shard`` result (slice order = vocabulary order).

    Ties go to the first slice (``argmax`` keeps the first of equal values): the lowest token
    id, as the unsharded pass and ``torch.argmax``.
    """
    pairs = torch.stack(parts)  # [N, B, 2] float64
    win = pairs[:, :, 0].argmax(dim=0)  # [B]
    return pairs[:, :, 1].gather(0, win.unsqueeze(0)).squeeze(0).to(torch.int64)  # [B]
