"""Triton KV-store and paged-attention kernels vs the torch reference.

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
from minivllm.kernels.reference import paged_attention_ref, store_kvcache_ref  # noqa: E402
from minivllm.kernels.store_kvcache import store_kvcache  # noqa: E402

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


# ------------------------------------------------------------------------------ store


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("slot_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("num_kv_heads,head_dim,block_size", [(2, 32, 16), (3, 16, 128)])
def test_store_kvcache(dtype, slot_dtype, num_kv_heads, head_dim, block_size):
    gen = torch.Generator().manual_seed(1)
    num_tokens, num_heads, num_blocks = 11, 2 * num_kv_heads, 5
    # key/value are strided views of a fused qkv output, as in the model.
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, generator=gen).to(dtype)
    _, key, value = qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], -1)
    key = key.view(num_tokens, num_kv_heads, head_dim)
    value = value.view(num_tokens, num_kv_heads, head_dim)
    assert not key.is_contiguous()
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[[2, 7]] = -1
    slot_mapping = slots.to(slot_dtype)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    store_kvcache_ref(key, value, k_ref, v_ref, slot_mapping)
    k_dev, v_dev = k_cache.to(DEVICE), v_cache.to(DEVICE)
    store_kvcache(key.to(DEVICE), value.to(DEVICE), k_dev, v_dev, slot_mapping.to(DEVICE))
    assert torch.equal(k_dev.cpu(), k_ref) and torch.equal(v_dev.cpu(), v_ref)


def test_store_kvcache_all_skipped_and_empty():
    k_cache = torch.zeros(2, 16, 1, 16, device=DEVICE)
    v_cache = torch.zeros_like(k_cache)
    kv = torch.ones(3, 1, 16, device=DEVICE)
    store_kvcache(kv, kv, k_cache, v_cache, torch.full((3,), -1, dtype=torch.int64, device=DEVICE))
    store_kvcache(kv[:0], kv[:0], k_cache, v_cache, torch.empty(0, dtype=torch.int64, device=DEVICE))
    assert k_cache.abs().sum() == 0 and v_cache.abs().sum() == 0


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


@pytest.mark.parametrize("name", list(CASES))
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


@pytest.mark.parametrize("num_splits", [1, 2, 3])
@pytest.mark.parametrize(
    "nh,nkv,d,bs,dtype",
    [(4, 2, 32, 16, torch.float16), (8, 1, 16, 128, torch.float32), (4, 4, 64, 16, torch.float16)],
)
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


def test_pdl_only_on_cuda(monkeypatch):
    """Programmatic dependent launch: never for CPU tensors or under the interpreter, whatever the switch."""
    from minivllm.kernels.pdl import pdl_options, use_pdl

    for flag in ("0", "1"):
        monkeypatch.setenv("MINIVLLM_PDL", flag)
        assert not use_pdl(torch.ones(2))
        assert pdl_options(torch.ones(2)) == {"USE_PDL": False}


def test_pdl_for_rows(monkeypatch):
    """``MINIVLLM_PDL_MAX_ROWS``: inside ``pdl_for_rows(n)`` a larger batch launches without PDL; the scope
    nests and restores; a bad value is a clear error."""
    from types import SimpleNamespace

    from minivllm.kernels import pdl

    monkeypatch.delenv("MINIVLLM_PDL", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(pdl, "_hopper_or_later", lambda index: True)
    gpu = SimpleNamespace(is_cuda=True, device=SimpleNamespace(index=0))  # stands in for a CUDA tensor
    monkeypatch.delenv("MINIVLLM_PDL_MAX_ROWS", raising=False)
    with pdl.pdl_for_rows(16):
        assert pdl.use_pdl(gpu)
    with pdl.pdl_for_rows(17):
        assert not pdl.use_pdl(gpu)  # 16 rows by default
    monkeypatch.setenv("MINIVLLM_PDL_MAX_ROWS", "100000")
    with pdl.pdl_for_rows(100_000):
        assert pdl.use_pdl(gpu)
    monkeypatch.setenv("MINIVLLM_PDL_MAX_ROWS", "16")
    assert pdl.use_pdl(gpu)  # outside any scope
    with pdl.pdl_for_rows(16):
        assert pdl.use_pdl(gpu)
        with pdl.pdl_for_rows(17):
            assert not pdl.use_pdl(gpu)
            assert pdl.pdl_options(gpu) == {"USE_PDL": False}
        assert pdl.use_pdl(gpu)
    assert pdl.use_pdl(gpu)
    monkeypatch.setenv("MINIVLLM_PDL_MAX_ROWS", "some")
    with pytest.raises(ValueError, match="MINIVLLM_PDL_MAX_ROWS must be a row count"):
        with pdl.pdl_for_rows(1):
            pass


def test_blas_for_rows_out_of_range_and_bad_values(monkeypatch):
    """``MINIVLLM_CUBLASLT_{MIN,MAX}_ROWS``: graphs of 17-128 rows by default; outside the range the BLAS
    backend is not touched (which works on a CPU build); a bad value is a clear error."""
    from minivllm.engine.cuda_graphs import blas_for_rows, cublaslt_rows

    before = torch.backends.cuda.preferred_blas_library()
    monkeypatch.delenv("MINIVLLM_CUBLASLT_MIN_ROWS", raising=False)
    monkeypatch.delenv("MINIVLLM_CUBLASLT_MAX_ROWS", raising=False)
    assert cublaslt_rows() == range(17, 129)
    for rows in (1, 16, 129, 4096):
        with blas_for_rows(rows):
            assert torch.backends.cuda.preferred_blas_library() == before
    monkeypatch.setenv("MINIVLLM_CUBLASLT_MAX_ROWS", "0")
    assert 17 not in cublaslt_rows() and 128 not in cublaslt_rows()
    with blas_for_rows(64):
        assert torch.backends.cuda.preferred_blas_library() == before
    monkeypatch.setenv("MINIVLLM_CUBLASLT_MIN_ROWS", "32")
    monkeypatch.setenv("MINIVLLM_CUBLASLT_MAX_ROWS", "64")
    assert cublaslt_rows() == range(32, 65)
    monkeypatch.setenv("MINIVLLM_CUBLASLT_MAX_ROWS", "-3")
    with pytest.raises(ValueError, match="MINIVLLM_CUBLASLT_MAX_ROWS must be a row count"):
        cublaslt_rows()
