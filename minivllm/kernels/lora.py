"""Multi-LoRA shrink and expand in Triton: a batch's tokens of several adapters (and of the base model) in
two launches per LoRA layer, segmented by adapter slot (Punica's and S-LoRA's segmented gather matmul;
docs/lora-kernels.md).

The ops have the signatures and semantics of the torch reference (minivllm/kernels/lora_torch.py: slots of
``a`` ``[S, R, H]`` and ``b`` ``[S, N_i, R]`` per slice, ranks zero-padded to ``R``, scaling folded into ``b``,
token slot -1 for the base model). Tokens are grouped by slot on the device (minivllm/kernels/lora_segments.py;
once a step when the runner passes ``segments``, else in each call). A grid's first axis runs over the
batch's row tiles, each slot's run of tokens cut in tiles one slot after another (times the column tiles or
the ``H`` split); a program finds its slot and tile from the slots' token counts, and the grid is sized for
the most tiles any mapping of the batch's tokens can need (each slot's run ends in at most one partial tile),
so its size depends on the shapes alone: no host sync, and a captured CUDA graph replays with any slot
mapping; programs past the batch's tiles return at once.

- shrink, its ``A`` walk over ``H`` spread three ways by the batch's token count (minivllm/kernels/lora_config.py):
  few tokens (a decode step), the FMA variant: each program takes ``fma_rows`` rows of its slot's ``A`` (of one
  slice) for its slot's tokens, float32 FMAs; more tokens, the MMA variant: each program gathers up to
  ``BLOCK_M`` tokens of its slot and multiplies them by all ``R`` rows of ``A`` on the tensor cores, its ``H``
  walk split over ``SPLIT_K`` programs that add their parts atomically into a zeroed ``out`` while the row tiles
  alone leave the GPU idle. Without a split, the programs of the base model's tiles (its run comes last) write
  its zero rows, so that ``out`` needs no separate zeroing.
- expand: each program takes ``BLOCK_M`` tokens of its slot and ``BLOCK_N`` columns of one slice, one
  ``[BLOCK_M, R] @ [R, BLOCK_N]`` product, and adds it into those columns of ``y`` in place (a token's
  columns belong to exactly one program: no atomics).

bf16/fp16 inputs go through the tensor cores with float32 accumulation (the expand's float32 ``shrunk`` is
rounded to ``b``'s dtype first); float32 inputs use IEEE float32 products (no TF32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.kernels.lora_config import ExpandConfig, ShrinkConfig, expand_config, shrink_config
from minivllm.kernels.lora_segments import LoRASegments, lora_segments
from minivllm.kernels.pdl import pdl_options, pdl_wait

MAX_SLICES = 3  # a plain linear layer 1, gate-up 2, QKV 3
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@triton.jit
def _tile_slot(counts_ptr, tile, num_groups, BLOCK_M: tl.constexpr, G_PAD: tl.constexpr):
    """``(slot, pid_m)``: the group (slot, or ``num_slots`` for the base model) whose run holds the batch's row
    tile ``tile`` when each of the first ``num_groups`` groups' runs is cut in tiles of ``BLOCK_M`` tokens, one
    group after another, and its tile index there; slot ``num_groups`` for a tile past the last run."""
    g = tl.arange(0, G_PAD)  # [G_PAD]
    tiles = tl.cdiv(tl.load(counts_ptr + g, mask=g < num_groups, other=0), BLOCK_M)  # [G_PAD]
    end = tl.where(g < num_groups, tl.cumsum(tiles, 0), 1 << 30)  # [G_PAD]: padding lanes never end
    slot = tl.sum((end <= tile).to(tl.int32), 0)
    return slot, tile - tl.sum(tl.where(g < slot, tiles, 0), 0)


@triton.jit
def _slot_rows(sorted_ptr, counts_ptr, starts_ptr, slot, pid_m, BLOCK_M: tl.constexpr):
    """Row tile ``pid_m`` of ``slot``'s run: ``(token indices [BLOCK_M], which are real [BLOCK_M])``."""
    count = tl.load(counts_ptr + slot)
    start = tl.load(starts_ptr + slot)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M]
    real = rm < count
    tokens = tl.load(sorted_ptr + start + rm, mask=real, other=0)  # [BLOCK_M]
    return tokens.to(tl.int64), real


@triton.jit
def _slice_ptr(p0, p1, p2, pid_slice):
    """The pointer of slice ``pid_slice`` (0, 1 or 2)."""
    p = p0
    if pid_slice == 1:
        p = p1
    if pid_slice == 2:
        p = p2
    return p


@triton.jit
def _lora_shrink_kernel(
    x_ptr,  # [T, H]
    a0_ptr,  # [S, R, H]: slice 0
    a1_ptr,  # [S, R, H]: slice 1 (slice 0 again when absent)
    a2_ptr,  # [S, R, H]: slice 2 (slice 0 again when absent)
    out_ptr,  # [num_slices, T, R] float32 (zeroed when SPLIT_K > 1)
    sorted_ptr,  # [T] int32: token indices, slot by slot, the base model's last
    counts_ptr,  # [S + 1] int32
    starts_ptr,  # [S + 1] int32
    H,
    num_slots,
    num_inner,  # programs per row tile: SPLIT_K, or (FMA) the rank's blocks of BLOCK_R rows
    stride_xm,
    stride_a_slot,
    stride_a_row,
    stride_out_slice,
    stride_out_t,
    MAX_RANK: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    FMA: tl.constexpr,
    DOT_F32: tl.constexpr,
    IEEE: tl.constexpr,
    G_PAD: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """``BLOCK_M`` tokens of a slot a program. MMA variant (``FMA`` False): all the rank's columns
    (``BLOCK_R`` >= R) on the tensor cores, 1/SPLIT_K of the ``H`` walk. FMA variant: ``BLOCK_R`` rank rows,
    the whole ``H`` walk in float32 FMAs."""
    pdl_wait(USE_PDL)
    pid_inner = tl.program_id(0) % num_inner
    pid_slice = tl.program_id(1)
    # num_slots: the base model's tokens
    slot, pid_m = _tile_slot(counts_ptr, tl.program_id(0) // num_inner, num_slots + 1, BLOCK_M, G_PAD)
    if slot > num_slots:
        return  # a tile past the batch's (the grid is sized for the most tiles any mapping needs)
    tokens, real = _slot_rows(sorted_ptr, counts_ptr, starts_ptr, slot, pid_m, BLOCK_M)
    if FMA:
        rr = pid_inner * BLOCK_R + tl.arange(0, BLOCK_R)  # [BLOCK_R]
        k_first = 0
    else:
        rr = tl.arange(0, BLOCK_R)  # [BLOCK_R]
        k_first = pid_inner * BLOCK_K
    out = out_ptr + pid_slice * stride_out_slice + tokens[:, None] * stride_out_t + rr[None, :]  # [BM, BR]
    mask = real[:, None] & (rr[None, :] < MAX_RANK)
    acc = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
    if slot < num_slots:  # else the base model's rows: zeros
        a_ptr = _slice_ptr(a0_ptr, a1_ptr, a2_ptr, pid_slice)
        rk = tl.arange(0, BLOCK_K)  # [BLOCK_K]
        x_rows = x_ptr + tokens[:, None] * stride_xm  # [BLOCK_M, 1]
        a_rows = a_ptr + slot.to(tl.int64) * stride_a_slot + rr[:, None] * stride_a_row  # [BLOCK_R, 1]
        for k in range(k_first, H, SPLIT_K * BLOCK_K):
            kk = k + rk  # [BLOCK_K]
            x = tl.load(x_rows + kk[None, :], mask=real[:, None] & (kk[None, :] < H), other=0.0)  # [BM, BK]
            a = tl.load(a_rows + kk[None, :], mask=(rr[:, None] < MAX_RANK) & (kk[None, :] < H),
                        other=0.0)  # [BR, BK]
            if FMA:
                acc += tl.sum(x.to(tl.float32)[:, None, :] * a.to(tl.float32)[None, :, :], axis=2)  # [BM, BR]
            else:
                if DOT_F32:  # the interpreter's bf16/fp16 dot is wrong; float32 tiles there
                    x = x.to(tl.float32)
                    a = a.to(tl.float32)
                if IEEE:
                    acc += tl.dot(x, tl.trans(a), input_precision="ieee")  # [BM, BR]
                else:
                    acc += tl.dot(x, tl.trans(a))  # [BM, BR]
    if SPLIT_K == 1:
        tl.store(out, acc, mask=mask)
    elif slot < num_slots:  # out was zeroed: the base model's rows are already
        tl.atomic_add(out, acc, mask=mask, sem="relaxed")


@triton.jit
def _lora_expand_kernel(
    s_ptr,  # [num_slices, T, R] float32: the shrink's output
    b0_ptr,  # [S, N_0, R]
    b1_ptr,  # [S, N_1, R] (slice 0 again when absent)
    b2_ptr,  # [S, N_2, R] (slice 0 again when absent)
    y_ptr,  # [T, >= sum N_i]: updated in place
    sorted_ptr,  # [T] int32: token indices, slot by slot
    counts_ptr,  # [S + 1] int32
    starts_ptr,  # [S + 1] int32
    n0, n1, n2,  # columns of each slice
    off0, off1, off2,  # first column of each slice in y
    stride_b0_slot, stride_b1_slot, stride_b2_slot,
    stride_b0_row, stride_b1_row, stride_b2_row,
    stride_s_slice,
    stride_s_t,
    stride_ym,
    num_slots,
    num_n_tiles,
    MAX_RANK: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_F32: tl.constexpr,
    IEEE: tl.constexpr,
    G_PAD: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_wait(USE_PDL)
    # the column tiles of one row tile are neighbours in launch order: its shrunk rows stay in L2
    pid_n = tl.program_id(0) % num_n_tiles
    pid_slice = tl.program_id(1)
    slot, pid_m = _tile_slot(counts_ptr, tl.program_id(0) // num_n_tiles, num_slots, BLOCK_M, G_PAD)
    if slot >= num_slots:
        return  # a tile past the slots' runs (the grid is sized for the most tiles any mapping needs)
    b_ptr, n, off, stride_slot, stride_row = b0_ptr, n0, off0, stride_b0_slot, stride_b0_row
    if pid_slice == 1:
        b_ptr, n, off, stride_slot, stride_row = b1_ptr, n1, off1, stride_b1_slot, stride_b1_row
    if pid_slice == 2:
        b_ptr, n, off, stride_slot, stride_row = b2_ptr, n2, off2, stride_b2_slot, stride_b2_row
    if pid_n * BLOCK_N >= n:
        return  # a column tile past a narrower slice (k/v beside q)
    tokens, real = _slot_rows(sorted_ptr, counts_ptr, starts_ptr, slot, pid_m, BLOCK_M)
    rr = tl.arange(0, BLOCK_R)  # [BLOCK_R]
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    s = tl.load(s_ptr + pid_slice * stride_s_slice + tokens[:, None] * stride_s_t + rr[None, :],
                mask=real[:, None] & (rr[None, :] < MAX_RANK), other=0.0)  # [BM, BR] float32
    b = tl.load(b_ptr + slot.to(tl.int64) * stride_slot + rn[None, :].to(tl.int64) * stride_row + rr[:, None],
                mask=(rr[:, None] < MAX_RANK) & (rn[None, :] < n), other=0.0)  # [BR, BN]
    if DOT_F32:  # the interpreter's bf16/fp16 dot is wrong: the tensor cores' rounding of s, float32 tiles
        s = s.to(b_ptr.dtype.element_ty).to(tl.float32)
        b = b.to(tl.float32)
    else:
        s = s.to(b_ptr.dtype.element_ty)
    if IEEE:
        delta = tl.dot(s, b, input_precision="ieee")  # [BM, BN]
    else:
        delta = tl.dot(s, b)  # [BM, BN]
    y = y_ptr + tokens[:, None] * stride_ym + off + rn[None, :]  # [BM, BN]
    mask = real[:, None] & (rn[None, :] < n)
    acc = tl.load(y, mask=mask, other=0.0).to(tl.float32) + delta
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=mask)


def _check_slices(name: str, stacked, num_slots: int, rank_dim: int, dtype: torch.dtype) -> int:
    """Validate ``stacked`` (a tuple of 1..MAX_SLICES ``[S, ., .]`` tensors of ``dtype``); their padded rank."""
    if not isinstance(stacked, (tuple, list)) or not 1 <= len(stacked) <= MAX_SLICES:
        raise ValueError(f"{name} must be a tuple of 1 to {MAX_SLICES} slices, got "
                         f"{len(stacked) if isinstance(stacked, (tuple, list)) else type(stacked).__name__}")
    rank = stacked[0].shape[rank_dim] if stacked[0].dim() == 3 else -1
    for w in stacked:
        if w.dim() != 3 or w.shape[0] != num_slots or w.shape[rank_dim] != rank or w.dtype != dtype:
            raise ValueError(f"{name}: every slice must be [{num_slots} slots, ...] {dtype} with the same rank, "
                             f"got {[(tuple(t.shape), t.dtype) for t in stacked]}")
        if w.stride(2) != 1:
            raise ValueError(f"{name}: the last dimension of each slice must be contiguous")
    if rank < 1:
        raise ValueError(f"{name}: the rank must be at least 1, got {rank}")
    return rank


def _segments_for(token_slot: torch.Tensor, num_tokens: int, num_slots: int, segments: LoRASegments | None,
                  device: torch.device) -> LoRASegments:
    """``segments`` checked against the batch, or built from ``token_slot`` when not given."""
    if token_slot.shape != (num_tokens,):
        raise ValueError(f"token_slot must be [{num_tokens}] (one slot per token), got {tuple(token_slot.shape)}")
    if token_slot.device != device or (segments is not None and segments.sorted_tokens.device != device):
        raise ValueError(f"token_slot and segments must be on the activations' device {device}, got "
                         f"{token_slot.device}")
    if segments is None:
        return lora_segments(token_slot, num_slots)
    if segments.num_slots != num_slots or segments.sorted_tokens.shape != (num_tokens,):
        raise ValueError(f"segments are for {segments.sorted_tokens.shape[0]} tokens and {segments.num_slots} "
                         f"slots, the call has {num_tokens} tokens and {num_slots} slots")
    return segments


def _padded(stacked: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """``stacked`` with slice 0 repeated up to ``MAX_SLICES`` (the kernels' unused pointer arguments)."""
    return tuple(stacked) + (stacked[0],) * (MAX_SLICES - len(stacked))


def max_row_tiles(num_tokens: int, block_m: int, num_groups: int) -> int:
    """The most row tiles ``num_tokens`` tokens over ``num_groups`` groups' runs can take, whatever the mapping:
    each nonempty run ends in at most one partial tile."""
    return num_tokens // block_m + min(num_groups, num_tokens)


def _groups_pad(num_groups: int) -> int:
    """The lanes of the kernels' per-group vectors: ``num_groups`` rounded up to a power of two, at least 2."""
    return max(2, triton.next_power_of_2(num_groups))


def _block_r(rank: int) -> int:
    """The rank tile: the padded rank rounded up to a power of two, at least 16 (``tl.dot``'s smallest)."""
    return max(16, triton.next_power_of_2(rank))


def lora_shrink(x: torch.Tensor, a_stacked: tuple[torch.Tensor, ...], token_slot: torch.Tensor,
                out: torch.Tensor, *, segments: LoRASegments | None = None,
                config: ShrinkConfig | None = None) -> torch.Tensor:
    """Write ``x @ A.T`` of each token's adapter into ``out`` for each slice; zeros for base-model tokens.

    x: [T, H]; a_stacked[i]: [S, R, H]; token_slot: [T] int (-1: none); out: [num_slices, T, R] float32.
    ``segments``: ``lora_segments(token_slot, S)``, built here when not given; ``config``: the tiles
    (default :func:`shrink_config`).
    """
    if x.dim() != 2 or x.dtype not in DTYPES or x.stride(1) != 1:
        raise ValueError(f"x must be [T, H] of {DTYPES} with contiguous rows, got {tuple(x.shape)} {x.dtype}")
    num_tokens, hidden = x.shape
    num_slots = a_stacked[0].shape[0] if isinstance(a_stacked, (tuple, list)) and a_stacked else 0
    rank = _check_slices("a_stacked", a_stacked, num_slots, 1, x.dtype)
    if any(a.shape[2] != hidden or a.stride() != a_stacked[0].stride() for a in a_stacked):
        raise ValueError(f"a_stacked: every slice must be [S, R, {hidden}] with the same strides, got "
                         f"{[tuple(a.shape) for a in a_stacked]}")
    num_slices = len(a_stacked)
    if out.shape != (num_slices, num_tokens, rank) or out.dtype != torch.float32 or out.stride(2) != 1:
        raise ValueError(f"out must be [{num_slices}, {num_tokens}, {rank}] float32, got {tuple(out.shape)} "
                         f"{out.dtype}")
    seg = _segments_for(token_slot, num_tokens, num_slots, segments, x.device)
    if num_tokens == 0:
        return out
    bm, bk, split_k, fma_rows, warps = config or shrink_config(num_tokens, hidden, rank, num_slices)
    a0, a1, a2 = _padded(a_stacked)
    if fma_rows:
        split_k, block_r, num_inner = 1, fma_rows, triton.cdiv(rank, fma_rows)
    else:
        block_r, num_inner = _block_r(rank), split_k
    if split_k > 1:
        out.zero_()  # the split programs add their parts into it
    grid = (max_row_tiles(num_tokens, bm, num_slots + 1) * num_inner, num_slices)
    cpu = x.device.type == "cpu"  # Triton runs on CPU tensors only in its interpreter
    _lora_shrink_kernel[grid](
        x, a0, a1, a2, out, seg.sorted_tokens, seg.counts, seg.starts, hidden, num_slots, num_inner, x.stride(0),
        a0.stride(0), a0.stride(1), out.stride(0), out.stride(1), MAX_RANK=rank, BLOCK_R=block_r, BLOCK_M=bm,
        BLOCK_K=bk, SPLIT_K=split_k, FMA=fma_rows > 0, DOT_F32=cpu and x.dtype != torch.float32,
        IEEE=x.dtype == torch.float32, G_PAD=_groups_pad(num_slots + 1), num_warps=warps, **pdl_options(x))
    return out


def lora_expand(shrunk: torch.Tensor, b_stacked: tuple[torch.Tensor, ...], token_slot: torch.Tensor,
                y: torch.Tensor, slice_offsets: tuple[int, ...], *, segments: LoRASegments | None = None,
                config: ExpandConfig | None = None) -> torch.Tensor:
    """Add ``shrunk[i] @ B_i.T`` of each token's adapter into the columns of slice i of ``y``, in place.

    shrunk: [num_slices, T, R] float32; b_stacked[i]: [S, N_i, R]; token_slot: [T]; y: [T, sum N_i];
    slice_offsets: the first column of each slice in ``y`` (len num_slices + 1, the last one sum N_i).
    ``segments``: ``lora_segments(token_slot, S)``, built here when not given; ``config``: the tiles
    (default :func:`expand_config`).
    """
    if y.dim() != 2 or y.dtype not in DTYPES or y.stride(1) != 1:
        raise ValueError(f"y must be [T, N] of {DTYPES} with contiguous rows, got {tuple(y.shape)} {y.dtype}")
    num_tokens = y.shape[0]
    num_slots = b_stacked[0].shape[0] if isinstance(b_stacked, (tuple, list)) and b_stacked else 0
    b_dtype = b_stacked[0].dtype if num_slots else y.dtype
    if b_dtype not in DTYPES:
        raise ValueError(f"b_stacked must be of {DTYPES}, got {b_dtype}")
    rank = _check_slices("b_stacked", b_stacked, num_slots, 2, b_dtype)
    num_slices = len(b_stacked)
    if shrunk.shape != (num_slices, num_tokens, rank) or shrunk.dtype != torch.float32 or shrunk.stride(2) != 1:
        raise ValueError(f"shrunk must be [{num_slices}, {num_tokens}, {rank}] float32, got "
                         f"{tuple(shrunk.shape)} {shrunk.dtype}")
    offsets = tuple(int(o) for o in slice_offsets)
    widths = tuple(b.shape[1] for b in b_stacked)
    if (len(offsets) != num_slices + 1 or offsets[0] < 0 or offsets[-1] > y.shape[1]
            or any(offsets[i + 1] - offsets[i] != widths[i] for i in range(num_slices))):
        raise ValueError(f"slice_offsets must be {num_slices + 1} column offsets into y's {y.shape[1]} columns "
                         f"with slice widths {widths}, got {offsets}")
    seg = _segments_for(token_slot, num_tokens, num_slots, segments, y.device)
    if num_tokens == 0:
        return y
    bm, bn, warps = config or expand_config(num_tokens, max(widths))
    num_n_tiles = triton.cdiv(max(widths), bn)
    b0, b1, b2 = _padded(b_stacked)
    n0, n1, n2 = widths + (0,) * (MAX_SLICES - num_slices)
    off0, off1, off2 = offsets[:num_slices] + (0,) * (MAX_SLICES - num_slices)
    grid = (max_row_tiles(num_tokens, bm, num_slots) * num_n_tiles, num_slices)
    cpu = y.device.type == "cpu"  # Triton runs on CPU tensors only in its interpreter
    _lora_expand_kernel[grid](
        shrunk, b0, b1, b2, y, seg.sorted_tokens, seg.counts, seg.starts, n0, n1, n2, off0, off1, off2,
        b0.stride(0), b1.stride(0), b2.stride(0), b0.stride(1), b1.stride(1), b2.stride(1), shrunk.stride(0),
        shrunk.stride(1), y.stride(0), num_slots, num_n_tiles, MAX_RANK=rank, BLOCK_R=_block_r(rank), BLOCK_M=bm,
        BLOCK_N=bn, DOT_F32=cpu and b_dtype != torch.float32, IEEE=b_dtype == torch.float32,
        G_PAD=_groups_pad(num_slots), num_warps=warps, **pdl_options(y))
    return y
