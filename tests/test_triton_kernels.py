"""Triton paged-attention kernels vs the torch reference (the K/V store, fused into the q/k norm + RoPE
kernel, is checked in ``tests/test_fused_kernels.py``).

Without a GPU these run under ``TRITON_INTERPRET=1`` (set by ``tests/conftest.py`` before the
kernels are imported), so shapes are kept small. Caches are poisoned with NaN outside the
slots that hold real keys, and outputs are poisoned before each call, so a kernel that reads
past a context or leaves an output element unwritten fails.
"""

from __future__ import annotations

import math
import zlib

import pytest
import torch

pytest.importorskip("triton")

from minivllm.kernels.paged_attention import paged_attention  # noqa: E402
from minivllm.kernels.paged_decode import choose_num_splits, paged_decode, paged_decode_split_kv  # noqa: E402
from minivllm.kernels.torch_backend import paged_attention_ref  # noqa: E402

pytestmark = pytest.mark.triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.float16: dict(atol=3e-3, rtol=1e-2)}


def make_batch(rows, num_heads, num_kv_heads, head_dim, block_size, dtype, seed, fused_q=False):
    """Random ragged batch. ``rows`` is a list of (q_len, context_len).

    Physical blocks are a random permutation; every cache slot not holding one of the first
    ``context_len`` tokens of some row is NaN; block tables are padded with -1.
    """
    gen = torch.Generator().manual_seed(seed)
    n_blocks = [math.ceil(ctx / block_size) for _, ctx in rows]
    num_blocks = sum(n_blocks) + 3
    max_blocks = max(n_blocks + [1]) + 1
    perm = torch.randperm(num_blocks, generator=gen)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    block_tables = torch.full((len(rows), max_blocks), -1, dtype=torch.int32)
    used = 0
    for b, (_, ctx) in enumerate(rows):
        blocks = perm[used : used + n_blocks[b]]
        used += n_blocks[b]
        block_tables[b, : n_blocks[b]] = blocks.to(torch.int32)
        for j, blk in enumerate(blocks.tolist()):
            n = min(block_size, ctx - j * block_size)
            k_cache[blk, :n] = torch.randn(n, num_kv_heads, head_dim, generator=gen).to(dtype)
            v_cache[blk, :n] = torch.randn(n, num_kv_heads, head_dim, generator=gen).to(dtype)
    q_lens = [q for q, _ in rows]
    cu = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0).to(torch.int32)
    total = int(cu[-1])
    if fused_q:  # query as a strided view of a fused qkv projection output
        qkv = torch.randn(total, (num_heads + 2 * num_kv_heads) * head_dim, generator=gen).to(dtype)
        query = qkv[:, : num_heads * head_dim].view(total, num_heads, head_dim)
    else:
        query = torch.randn(total, num_heads, head_dim, generator=gen).to(dtype)
    ctx_lens = torch.tensor([c for _, c in rows], dtype=torch.int32)
    to = lambda t: t.to(DEVICE)
    return to(query), to(k_cache), to(v_cache), to(cu), to(ctx_lens), to(block_tables)


def _poisoned(like: torch.Tensor) -> torch.Tensor:
    return torch.full_like(like, float("nan"))


def _close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    assert not out.isnan().any(), "output has unwritten (NaN) elements"
    torch.testing.assert_close(out.float().cpu(), ref.float().cpu(), **TOL[dtype])


# ------------------------------------------------------------------------------ unified kernel

# (rows as (q_len, context_len), num_heads, num_kv_heads, head_dim, block_size, dtype, tiles)
# fmt: off
CASES = {
    # decode rows + a chunk with prefix + a q_len-0 row + a fresh prefill + a long chunk
    "mixed_gqa1_bs16_f32": ([(1, 37), (5, 20), (1, 1), (0, 9), (16, 16), (12, 80)], 4, 4, 32, 16, torch.float32, None),
    "mixed_gqa2_bs128_f16": ([(1, 70), (9, 9), (7, 50), (1, 128), (0, 0)], 4, 2, 16, 128, torch.float16, None),
    "mixed_gqa8_bs16_f16": ([(1, 66), (3, 3), (20, 45), (1, 16)], 8, 1, 32, 16, torch.float16, None),
    "mixed_gqa2_d64_f32": ([(1, 50), (10, 33), (4, 4)], 4, 2, 64, 16, torch.float32, None),
    "fresh_prefill_gqa2_f16": ([(20, 20), (33, 33), (1, 1)], 4, 2, 32, 16, torch.float16, None),
    "small_tiles_bs128_f32": ([(1, 75), (30, 70), (17, 17)], 6, 2, 32, 128, torch.float32, (16, 16)),
    "small_tiles_bs16_f16": ([(1, 49), (25, 60)], 8, 4, 16, 16, torch.float16, (32, 16)),
    # prefixes of 13..16 tokens put tile edges right before / on / after key-tile edges
    "tile_edges_f32": ([(20, 33), (20, 34), (20, 35), (17, 33)], 2, 2, 16, 16, torch.float32, (16, 16)),
    "head_dim48_group3_f32": ([(1, 40), (6, 22)], 6, 2, 48, 16, torch.float32, None),
}
# fmt: on


FAST_CASES = ("mixed_gqa2_d64_f32", "mixed_gqa2_bs128_f16")  # the fast tier's case per dtype; the rest: -m slow


@pytest.mark.parametrize("name", [n if n in FAST_CASES else pytest.param(n, marks=pytest.mark.slow) for n in CASES])
def test_paged_attention_ragged(name):
    rows, nh, nkv, d, bs, dtype, tiles = CASES[name]
    q, kc, vc, cu, ctx, bt = make_batch(
        rows, nh, nkv, d, bs, dtype, seed=zlib.crc32(name.encode()) % 1000, fused_q=True
    )
    scale = d**-0.5
    ref = paged_attention_ref(q.cpu(), kc.cpu(), vc.cpu(), cu.cpu(), ctx.cpu(), bt.cpu(), scale)
    out = _poisoned(q)
    bm, bn = tiles or (None, None)
    res = paged_attention(
        q, kc, vc, cu, ctx, bt, scale, max(r[0] for r in rows), max(r[1] for r in rows), out=out,
        block_m=bm, block_n=bn,
    )  # fmt: skip
    assert res is out
    _close(out, ref, dtype)


@pytest.mark.parametrize("use_cu_seqlens", [True, False])
def test_paged_attention_decode_only(use_cu_seqlens):
    rows = [(1, c) for c in (1, 15, 16, 17, 64, 79)]
    q, kc, vc, cu, ctx, bt = make_batch(rows, 4, 2, 32, 16, torch.float16, seed=5)
    ref = paged_attention_ref(q.cpu(), kc.cpu(), vc.cpu(), cu.cpu(), ctx.cpu(), bt.cpu(), 0.2)
    out = _poisoned(q)
    paged_attention(q, kc, vc, cu if use_cu_seqlens else None, ctx, bt, 0.2, 1, 79, out=out)
    _close(out, ref, torch.float16)


def test_paged_attention_padded_rows_untouched():
    # CUDA-graph style padding: trailing rows with q_len 0 and context 0 leave `out` alone.
    rows = [(1, 20), (3, 30), (0, 0), (0, 0)]
    q, kc, vc, cu, ctx, bt = make_batch(rows, 2, 1, 16, 16, torch.float32, seed=6)
    q_pad = torch.cat([q, torch.randn(2, 2, 16, device=DEVICE)])
    out = _poisoned(q_pad)
    paged_attention(q_pad, kc, vc, cu, ctx, bt, 0.25, 3, 30, out=out)
    ref = paged_attention_ref(q.cpu(), kc.cpu(), vc.cpu(), cu.cpu(), ctx.cpu(), bt.cpu(), 0.25)
    _close(out[:4], ref, torch.float32)
    assert out[4:].isnan().all()


# ------------------------------------------------------------------------------ split-KV decode


def _split_kv_grid():
    """Every (shape, splits); one case per dtype in the fast tier (3 splits over f16, 2 over f32), the rest slow."""
    fast = {((4, 2, 32, 16, torch.float16), 3), ((8, 1, 16, 128, torch.float32), 2)}
    for shape in [(4, 2, 32, 16, torch.float16), (8, 1, 16, 128, torch.float32), (4, 4, 64, 16, torch.float16)]:
        for num_splits in (1, 2, 3):
            marks = () if (shape, num_splits) in fast else pytest.mark.slow
            yield pytest.param(num_splits, *shape, marks=marks,
                               id=f"{num_splits}-{shape[0]}-{shape[1]}-{shape[2]}-{shape[3]}-{str(shape[4])[6:]}")


@pytest.mark.parametrize("num_splits,nh,nkv,d,bs,dtype", list(_split_kv_grid()))
def test_split_kv_decode(num_splits, nh, nkv, d, bs, dtype):
    rows = [(1, c) for c in (1, 30, 80, 64, 17, 47, 15)]
    q, kc, vc, cu, ctx, bt = make_batch(rows, nh, nkv, d, bs, dtype, seed=10 + num_splits)
    ref = paged_attention_ref(q.cpu(), kc.cpu(), vc.cpu(), cu.cpu(), ctx.cpu(), bt.cpu(), d**-0.5)
    out = _poisoned(q)
    paged_decode_split_kv(q, kc, vc, ctx, bt, d**-0.5, 80, num_splits=num_splits, out=out, block_n=16)
    _close(out, ref, dtype)


def test_split_kv_decode_padded_row_is_zero():
    rows = [(1, 40), (1, 0)]  # row 1: CUDA-graph padding (context 0)
    q, kc, vc, cu, ctx, bt = make_batch(rows, 2, 1, 16, 16, torch.float32, seed=3)
    out = _poisoned(q)
    paged_decode_split_kv(q, kc, vc, ctx, bt, 0.25, 40, num_splits=2, out=out)
    ref = paged_attention_ref(
        q[:1].cpu(), kc.cpu(), vc.cpu(), cu[:2].cpu(), ctx[:1].cpu(), bt[:1].cpu(), 0.25
    )
    _close(out[:1], ref, torch.float32)
    assert (out[1] == 0).all()


def test_paged_decode_dispatch():
    rows = [(1, c) for c in (1, 33, 80)]
    q, kc, vc, cu, ctx, bt = make_batch(rows, 4, 2, 16, 16, torch.float16, seed=4)
    ref = paged_attention_ref(q.cpu(), kc.cpu(), vc.cpu(), cu.cpu(), ctx.cpu(), bt.cpu(), 0.25)
    for max_ctx in (80, 4096):  # unified kernel, then split-KV (6 programs, long context)
        out = _poisoned(q)
        paged_decode(q, kc, vc, ctx, bt, 0.25, max_ctx, out=out)
        _close(out, ref, torch.float16)


def test_choose_num_splits():
    assert choose_num_splits(256, 8, 2048, 132) == 1  # GPU already full
    assert choose_num_splits(1, 8, 100, 132) == 1  # too short to split
    assert choose_num_splits(1, 8, 512, 132) == 8  # length-bound (64 keys per split)
    assert choose_num_splits(16, 8, 4096, 132) == 4  # occupancy-bound: ~4 programs per SM
    assert choose_num_splits(1, 1, 1 << 20, 132) == 32  # capped
    assert choose_num_splits(0, 8, 4096, 132) >= 1


def test_pdl_only_on_cuda():
    """Programmatic dependent launch: never for CPU tensors (the interpreter)."""
    from minivllm.kernels.pdl import pdl_options, use_pdl

    assert not use_pdl(torch.ones(2))
    assert pdl_options(torch.ones(2)) == {"USE_PDL": False}


def test_pdl_by_leading_dim(monkeypatch):
    """On sm_90+, kernels launch with PDL when their tensor's leading dim is at most ``PDL_MAX_ROWS`` (16), so
    a decode step of up to 16 rows takes it and a larger batch does not."""
    from types import SimpleNamespace

    from minivllm.kernels import pdl

    monkeypatch.setattr(pdl, "_hopper_or_later", lambda index: True)

    def gpu(*shape):  # stands in for a CUDA tensor
        return SimpleNamespace(is_cuda=True, device=SimpleNamespace(index=0), shape=shape, dim=lambda: len(shape))

    assert pdl.PDL_MAX_ROWS == 16
    assert pdl.use_pdl(gpu(1, 4096)) and pdl.use_pdl(gpu(16, 32, 128))
    assert pdl.pdl_options(gpu(16, 4096)) == {"USE_PDL": True, "launch_pdl": True}
    assert not pdl.use_pdl(gpu(17, 4096)) and not pdl.use_pdl(gpu(4096))
    assert pdl.pdl_options(gpu(17, 4096)) == {"USE_PDL": False}
    assert not pdl.use_pdl(gpu())  # a scalar
    monkeypatch.setattr(pdl, "_hopper_or_later", lambda index: False)
    assert not pdl.use_pdl(gpu(1, 4096))  # before sm_90


def test_blas_for_rows_out_of_range():
    """Decode graphs of 17-128 rows capture cuBLASLt GEMMs; outside that range the BLAS backend is not
    touched (which works on a CPU build)."""
    from minivllm.worker.cuda_graphs import CUBLASLT_ROWS, blas_for_rows

    before = torch.backends.cuda.preferred_blas_library()
    assert CUBLASLT_ROWS == range(17, 129)
    for rows in (1, 16, 129, 4096):
        with blas_for_rows(rows):
            assert torch.backends.cuda.preferred_blas_library() == before
