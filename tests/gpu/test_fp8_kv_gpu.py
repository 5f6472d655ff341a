"""FP8 (e4m3) KV cache on a GPU: the store rounds exactly like torch, the kernels read realistic
e4m3 caches like the reference, and the engine (CUDA graphs, async) matches the CPU engine."""

from __future__ import annotations

import pytest
import torch

from minivllm import LLM
from tests.gpu.test_engine_gpu import GREEDY, PROMPTS, ids

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
FP8 = torch.float8_e4m3fn


def test_store_rounds_like_torch_bf16():
    """The K/V store of the q/k norm + RoPE kernel (position 0, where RoPE leaves k as it is; no norm) writes an
    e4m3 cache bit for bit as ``store_kvcache_ref`` (torch's rounding, saturation at +-448)."""
    from minivllm.kernels.fused_rope import qk_norm_rope
    from minivllm.kernels.torch_backend import store_kvcache_ref

    gen = torch.Generator().manual_seed(0)
    n, hq, kvh, d, bs, nb = 300, 32, 8, 128, 16, 40
    key = (torch.randn(n, kvh, d, generator=gen) * 30).bfloat16()  # some beyond +-448
    value = torch.randn(n, kvh, d, generator=gen).bfloat16()
    slots = torch.randperm(nb * bs, generator=gen)[:n]
    kr, vr = torch.zeros(nb, bs, kvh, d, dtype=FP8), torch.zeros(nb, bs, kvh, d, dtype=FP8)
    store_kvcache_ref(key, value, kr, vr, slots)
    kd, vd = kr.new_zeros(kr.shape).cuda(), vr.new_zeros(vr.shape).cuda()
    query = torch.randn(n, hq, d, generator=gen).bfloat16().cuda()
    cos_sin = torch.cat([torch.ones(1, d // 2), torch.zeros(1, d // 2)], -1).cuda()  # position 0
    qk_norm_rope(query, key.cuda(), torch.zeros(n, dtype=torch.int64, device="cuda"), cos_sin,
                 kv_store=(value.cuda(), kd, vd, slots.cuda()))
    assert torch.equal(kd.cpu().view(torch.uint8), kr.view(torch.uint8))
    assert torch.equal(vd.cpu().view(torch.uint8), vr.view(torch.uint8))


@pytest.mark.parametrize("decode", [False, True])
def test_attention_reads_fp8_cache_like_reference(decode):
    from minivllm.kernels.paged_attention import paged_attention
    from minivllm.kernels.paged_decode import paged_decode
    from minivllm.kernels.torch_backend import paged_attention_ref

    gen = torch.Generator().manual_seed(1)
    nh, kvh, d, bs = 32, 8, 128, 16
    rows = [(1, c) for c in (7, 300, 1500, 2049)] if decode else [(1, 900), (37, 37), (128, 700), (5, 16)]
    nb_per = [-(-c // bs) for _, c in rows]
    kc = (torch.randn(sum(nb_per) + 2, bs, kvh, d, generator=gen) * 2).to(FP8)
    vc = torch.randn(sum(nb_per) + 2, bs, kvh, d, generator=gen).to(FP8)
    perm = torch.randperm(sum(nb_per), generator=gen)
    bt = torch.zeros(len(rows), max(nb_per), dtype=torch.int32)
    used = 0
    for i, k in enumerate(nb_per):
        bt[i, :k] = perm[used:used + k].int()
        used += k
    cu = torch.tensor([0] + [q for q, _ in rows]).cumsum(0).int()
    ctx = torch.tensor([c for _, c in rows], dtype=torch.int32)
    q = torch.randn(int(cu[-1]), nh, d, generator=gen).bfloat16()
    ref = paged_attention_ref(q, kc, vc, cu, ctx, bt, d**-0.5).float()
    g = [t.cuda() for t in (q, kc, vc, cu, ctx, bt)]
    if decode:
        out = paged_decode(g[0], g[1], g[2], g[4], g[5], d**-0.5, int(ctx.max()))
    else:
        out = paged_attention(*g, d**-0.5, max(r[0] for r in rows), int(ctx.max()))
    err = ((out.float().cpu() - ref).abs().max() / ref.abs().max()).item()
    assert err < 1e-2, err


def test_fp8_engine_on_gpu_matches_cpu_engine(tiny_model):
    kw = dict(dtype="float32", kv_cache_dtype="fp8")
    cpu = ids(LLM(tiny_model, device="cpu", **kw).generate(PROMPTS[:12], GREEDY, use_tqdm=False))
    llm = LLM(tiny_model, device="cuda", gpu_memory_utilization=0.3, **kw)
    assert llm.engine.executor.runner.graph_runner is not None and llm.engine.config.scheduler_config.async_scheduling
    gpu = ids(llm.generate(PROMPTS[:12], GREEDY, use_tqdm=False))
    assert [g[:8] for g in gpu] == [c[:8] for c in cpu]
    assert sum(g == c for g, c in zip(gpu, cpu)) >= 10
