"""Triton paged-attention kernels and the K/V store (inside the q/k norm + RoPE kernel) vs the torch reference
on a real GPU (bf16, fp16).

Realistic shapes: head_dim 64/128, block sizes 16..256, GQA 1/2/8, ragged batches of decode
rows and prefill chunks with contexts up to ~4k; plus CUDA-graph capture and replay of the
decode paths with new context lengths and block tables.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

if torch.cuda.is_available():
    from minivllm.kernels.fused_rope import qk_norm_rope
    from minivllm.kernels.paged_attention import paged_attention
    from minivllm.kernels.paged_decode import paged_decode, paged_decode_split_kv
    from minivllm.kernels.torch_backend import paged_attention_ref, store_kvcache_ref
    from minivllm.layers.rotary import RotaryEmbedding

DEV = "cuda"
MAX_REL_ERR = 1e-2


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.float(), ref.float()
    assert torch.isfinite(out).all(), "non-finite output (unwritten element?)"
    return ((out - ref).norm() / ref.norm()).item()


def ref_attention(query, k_cache, v_cache, cu_seqlens_q, context_lens, block_tables, scale, window=None):
    """The torch reference (over a sliding ``window`` where given), run on the CPU (it builds its causal mask
    on the CPU)."""
    args = [t.cpu() if isinstance(t, torch.Tensor) else t for t in (query, k_cache, v_cache, cu_seqlens_q)]
    args += [t.cpu() if isinstance(t, torch.Tensor) else t for t in (context_lens, block_tables)]
    return paged_attention_ref(*args, scale, window).to(DEV)


def make_batch(rows, num_heads, num_kv_heads, head_dim, block_size, dtype, seed, extra_blocks=8):
    """Ragged batch on the GPU; ``rows`` = [(q_len, context_len)]. Random block permutation,
    block tables padded with -1, unused cache slots NaN."""
    gen = torch.Generator(device=DEV).manual_seed(seed)
    n_blocks = [math.ceil(ctx / block_size) for _, ctx in rows]
    num_blocks = sum(n_blocks) + extra_blocks
    max_blocks = max(n_blocks + [1]) + 2
    perm = torch.randperm(num_blocks, generator=gen, device=DEV).to(torch.int32)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype, device=DEV)
    v_cache = torch.full(shape, float("nan"), dtype=dtype, device=DEV)
    block_tables = torch.full((len(rows), max_blocks), -1, dtype=torch.int32, device=DEV)
    used = 0
    for b, (_, ctx) in enumerate(rows):
        blocks = perm[used : used + n_blocks[b]]
        used += n_blocks[b]
        block_tables[b, : n_blocks[b]] = blocks
        if ctx:
            slots = blocks.long()[:, None] * block_size + torch.arange(block_size, device=DEV)
            slots = slots.flatten()[:ctx]  # [ctx]
            flat, kv_shape = (-1, num_kv_heads, head_dim), (ctx, num_kv_heads, head_dim)
            k_cache.view(flat)[slots] = torch.randn(kv_shape, generator=gen, device=DEV).to(dtype)
            v_cache.view(flat)[slots] = torch.randn(kv_shape, generator=gen, device=DEV).to(dtype)
    q_lens = torch.tensor([q for q, _ in rows])
    cu = torch.cat([torch.zeros(1, dtype=torch.long), q_lens.cumsum(0)]).to(torch.int32).to(DEV)
    query = torch.randn(int(q_lens.sum()), num_heads, head_dim, generator=gen, device=DEV).to(dtype)
    ctx_lens = torch.tensor([c for _, c in rows], dtype=torch.int32, device=DEV)
    return query, k_cache, v_cache, cu, ctx_lens, block_tables


def ragged_rows(seed: int) -> list[tuple[int, int]]:
    """Decode rows with contexts up to 4k mixed with prefill chunks (with and without prefix)."""
    rng = random.Random(seed)
    rows = [(1, rng.randint(1, 4096)) for _ in range(6)] + [(1, 1), (0, 0), (0, 77)]
    rows += [(512, 4000), (300, 300), (64, rng.randint(64, 2000)), (rng.randint(2, 200), 3000), (129, 129)]
    rng.shuffle(rows)
    return rows


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("group", [1, 2, 8])
@pytest.mark.parametrize("block_size", [16, 32, 128, 256])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_paged_attention_ragged_gpu(head_dim, block_size, group, dtype):
    num_kv_heads = 2
    rows = ragged_rows(seed=head_dim + block_size + group)
    shape = (num_kv_heads * group, num_kv_heads, head_dim, block_size, dtype)
    q, kc, vc, cu, ctx, bt = make_batch(rows, *shape, seed=0)
    scale = head_dim**-0.5
    ref = ref_attention(q, kc, vc, cu, ctx, bt, scale)
    out = torch.full_like(q, float("nan"))
    max_q, max_ctx = max(r[0] for r in rows), max(r[1] for r in rows)
    paged_attention(q, kc, vc, cu, ctx, bt, scale, max_q, max_ctx, out=out)
    assert rel_err(out, ref) < MAX_REL_ERR


@pytest.mark.parametrize("head_dim,group", [(256, 2), (96, 4), (80, 16), (32, 3)])
def test_paged_attention_other_shapes_gpu(head_dim, group):
    """Less common shapes: head_dim 256 / non-powers of two, large or odd GQA groups."""
    rows = ragged_rows(seed=head_dim)
    shape = (2 * group, 2, head_dim, 32, torch.bfloat16)
    q, kc, vc, cu, ctx, bt = make_batch(rows, *shape, seed=2)
    ref = ref_attention(q, kc, vc, cu, ctx, bt, 0.1)
    out = torch.full_like(q, float("nan"))
    paged_attention(q, kc, vc, cu, ctx, bt, 0.1, max(r[0] for r in rows), 4096, out=out)
    assert rel_err(out, ref) < MAX_REL_ERR
    decode_rows = [(1, c) for _, c in rows if c > 0]
    q, kc, vc, cu, ctx, bt = make_batch(decode_rows, *shape, seed=3)
    ref = ref_attention(q, kc, vc, cu, ctx, bt, 0.1)
    for num_splits in (1, 5):
        out = torch.full_like(q, float("nan"))
        paged_decode_split_kv(q, kc, vc, ctx, bt, 0.1, 4096, num_splits=num_splits, out=out)
        assert rel_err(out, ref) < MAX_REL_ERR


@pytest.mark.parametrize("group", [1, 2, 8])
@pytest.mark.parametrize("block_size", [16, 256])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("num_splits", [None, 1, 3, 16])
def test_decode_gpu(num_splits, head_dim, block_size, group, dtype=torch.bfloat16):
    rng = random.Random(num_splits or 0)
    rows = [(1, rng.randint(1, 4096)) for _ in range(5)] + [(1, 1), (1, 4096), (1, 17)]
    num_kv_heads = 4
    shape = (num_kv_heads * group, num_kv_heads, head_dim, block_size, dtype)
    q, kc, vc, cu, ctx, bt = make_batch(rows, *shape, seed=1)
    ref = ref_attention(q, kc, vc, cu, ctx, bt, 0.1)
    out = torch.full_like(q, float("nan"))
    if num_splits is None:
        paged_decode(q, kc, vc, ctx, bt, 0.1, 4096, out=out)
    else:
        paged_decode_split_kv(q, kc, vc, ctx, bt, 0.1, 4096, num_splits=num_splits, out=out)
    assert rel_err(out, ref) < MAX_REL_ERR
    out_unified = paged_attention(q, kc, vc, None, ctx, bt, 0.1, 1, 4096)
    assert rel_err(out_unified, ref) < MAX_REL_ERR


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kv_store_equals_store_kvcache_ref_gpu(dtype):
    """The q/k norm + RoPE kernel's K/V store (k and v strided views of the qkv buffer, int32 slots, -1 skipped)
    writes the cache bit for bit as ``store_kvcache_ref`` of the rotated k does, and leaves q / k as without it."""
    num_tokens, nh, nkv, d, bs, num_blocks = 300, 16, 8, 128, 16, 64
    qkv = torch.randn(num_tokens, (nh + 2 * nkv) * d, device=DEV, dtype=dtype)
    slots = torch.randperm(num_blocks * bs, device=DEV)[:num_tokens]
    slots[::7] = -1
    positions = torch.randint(0, 40960, (num_tokens,), device=DEV)
    rope = RotaryEmbedding(d, 40960, 1e6).to(DEV)
    qw, kw = (1.0 + 0.2 * torch.randn(2, d, device=DEV)).to(dtype)
    kc = torch.randn(num_blocks, bs, nkv, d, device=DEV, dtype=dtype)
    vc = torch.randn_like(kc)

    def views(buf):
        q, k, v = buf.split([nh * d, nkv * d, nkv * d], -1)
        return q.view(num_tokens, nh, d), k.view(num_tokens, nkv, d), v.view(num_tokens, nkv, d)

    ref_buf, kr, vr = qkv.clone(), kc.clone(), vc.clone()
    rq, rk, rv = views(ref_buf)
    qk_norm_rope(rq, rk, positions, rope.cos_sin_cache, qw, kw, 1e-6, inplace=True)
    store_kvcache_ref(rk, rv, kr, vr, slots)
    q, k, v = views(qkv)
    qk_norm_rope(q, k, positions, rope.cos_sin_cache, qw, kw, 1e-6, inplace=True,
                 kv_store=(v, kc, vc, slots.to(torch.int32)))
    assert torch.equal(qkv, ref_buf)
    assert torch.equal(kc, kr) and torch.equal(vc, vr)


@pytest.mark.parametrize("window", [None, 100, 4096])
@pytest.mark.parametrize("mode", ["auto", "unified", "split3"])
def test_decode_cuda_graph_replay(mode, window):
    """Capture the decode path once, replay with new lengths / tables / queries (and padded rows); full
    attention and sliding windows (contexts up to 2048: past a 100-key window, within a 4096-key one)."""
    graph_rows, nh, nkv, d, bs, max_ctx, dtype = 8, 16, 8, 128, 16, 2048, torch.bfloat16
    max_blocks = max_ctx // bs
    num_blocks = graph_rows * max_blocks + 4
    kc = torch.randn(num_blocks, bs, nkv, d, device=DEV, dtype=dtype)
    vc = torch.randn_like(kc)
    q_s = torch.zeros(graph_rows, nh, d, device=DEV, dtype=dtype)
    ctx_s = torch.zeros(graph_rows, dtype=torch.int32, device=DEV)
    bt_s = torch.full((graph_rows, max_blocks), -1, dtype=torch.int32, device=DEV)
    out_s = torch.zeros_like(q_s)

    def step():
        if mode == "auto":
            paged_decode(q_s, kc, vc, ctx_s, bt_s, d**-0.5, max_ctx, out=out_s, sliding_window=window)
        elif mode == "unified":
            paged_attention(q_s, kc, vc, None, ctx_s, bt_s, d**-0.5, 1, max_ctx, out=out_s, sliding_window=window)
        else:
            paged_decode_split_kv(q_s, kc, vc, ctx_s, bt_s, d**-0.5, max_ctx, num_splits=3, out=out_s,
                                  sliding_window=window)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up: compile outside capture
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()

    for trial, real_rows in enumerate([8, 5, 1]):
        rng = random.Random(trial)
        lens = [rng.randint(1, max_ctx) for _ in range(real_rows)] + [0] * (graph_rows - real_rows)
        perm = torch.randperm(num_blocks, device=DEV).to(torch.int32)
        bt = torch.full((graph_rows, max_blocks), -1, dtype=torch.int32, device=DEV)
        for b, n in enumerate(lens):
            nb = math.ceil(n / bs)
            bt[b, :nb] = perm[b * max_blocks : b * max_blocks + nb]
        q_s.copy_(torch.randn_like(q_s))
        ctx_s.copy_(torch.tensor(lens, dtype=torch.int32))
        bt_s.copy_(bt)
        graph.replay()
        torch.cuda.synchronize()
        cu = torch.arange(real_rows + 1, dtype=torch.int32)
        ref = ref_attention(q_s[:real_rows], kc, vc, cu, lens[:real_rows], bt_s[:real_rows], d**-0.5, window)
        assert rel_err(out_s[:real_rows], ref) < MAX_REL_ERR
