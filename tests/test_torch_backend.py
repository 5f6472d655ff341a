"""The CPU backend's batched decode path equals the per-row torch reference."""

import pytest
import torch

from minivllm.kernels.torch_backend import paged_attention_ref, paged_decode_torch


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_heads,num_kv_heads,block_size", [(4, 4, 16), (8, 2, 16), (8, 1, 32)])
def test_batched_decode_equals_reference(dtype, num_heads, num_kv_heads, block_size):
    g = torch.Generator().manual_seed(num_heads * 100 + block_size)
    head_dim, num_blocks = 16, 64
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g).to(dtype)
    context_lens = [1, 17, 40, 5, 64]
    tables = torch.full((len(context_lens), 8), -1, dtype=torch.int32)
    perm = torch.randperm(num_blocks, generator=g).tolist()
    for r, ctx in enumerate(context_lens):
        n = -(-ctx // block_size)
        tables[r, :n] = torch.tensor(perm[:n])
        perm = perm[n:]
    q = torch.randn(len(context_lens), num_heads, head_dim, generator=g).to(dtype)
    ref = paged_attention_ref(q, k_cache, v_cache, list(range(len(context_lens) + 1)), context_lens, tables, 0.25)
    got = paged_decode_torch(q, k_cache, v_cache, context_lens, tables, 0.25)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.float(), ref.float(), rtol=tol, atol=tol)
