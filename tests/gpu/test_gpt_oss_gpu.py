"""gpt-oss on a real GPU: the paged attention kernels with attention sinks (prefill / chunked prefill, unified and
split-KV decode, with gpt-oss's 128-token window and without) against the torch reference, the fused MoE
kernels with expert biases and the clamped SwiGLU at gpt-oss-20b's expert shapes against the torch path, and
a tiny gpt-oss through the engine (CUDA graphs, eager, the CPU's torch backend: the same greedy tokens)."""

from __future__ import annotations

import random

import pytest
import torch

from tests.gpu.test_kernels_gpu import MAX_REL_ERR, make_batch, rel_err

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

if torch.cuda.is_available():
    from minivllm.kernels.fused_moe import fused_moe_triton
    from minivllm.kernels.moe_torch import fused_moe
    from minivllm.kernels.paged_attention import paged_attention
    from minivllm.kernels.paged_decode import paged_decode, paged_decode_split_kv
    from minivllm.kernels.torch_backend import paged_attention_ref

WINDOWS = [None, 128]


def _ref(q, kc, vc, cu, ctx, bt, scale, window, sinks):
    """The torch reference on the CPU (it builds its masks there)."""
    cpu = [t.cpu() for t in (q, kc, vc, cu, ctx, bt)]
    return paged_attention_ref(*cpu, scale, window, sinks.cpu()).to(q.device)


def _sinks(num_heads: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return (torch.randn(num_heads, generator=torch.Generator().manual_seed(seed)) * 2.0).to("cuda", dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("window", WINDOWS)
def test_paged_attention_with_sinks_gpu(window, dtype):
    """gpt-oss's heads (64 query, 8 KV, head_dim 64): decode rows and prefill chunks past the window."""
    rng = random.Random(7)
    rows = [(1, rng.randint(1, 3000)) for _ in range(5)] + [(1, 1), (0, 0), (300, 300), (64, 1500), (129, 700)]
    q, kc, vc, cu, ctx, bt = make_batch(rows, 64, 8, 64, 16, dtype, seed=3)
    sinks = _sinks(64, dtype, seed=4)
    ref = _ref(q, kc, vc, cu, ctx, bt, 0.125, window, sinks)
    out = torch.full_like(q, float("nan"))
    paged_attention(q, kc, vc, cu, ctx, bt, 0.125, max(r[0] for r in rows), max(r[1] for r in rows), out=out,
                    sliding_window=window, sinks=sinks)
    assert rel_err(out, ref) < MAX_REL_ERR


@pytest.mark.parametrize("num_splits", [None, 1, 3, 16])
@pytest.mark.parametrize("window", WINDOWS)
def test_decode_with_sinks_gpu(window, num_splits):
    rng = random.Random(11)
    rows = [(1, rng.randint(1, 8192)) for _ in range(5)] + [(1, 1), (1, 8192), (1, 129)]
    q, kc, vc, cu, ctx, bt = make_batch(rows, 64, 8, 64, 16, torch.bfloat16, seed=1)
    sinks = _sinks(64, torch.bfloat16, seed=2)
    ref = _ref(q, kc, vc, cu, ctx, bt, 0.125, window, sinks)
    out = torch.full_like(q, float("nan"))
    if num_splits is None:
        paged_decode(q, kc, vc, ctx, bt, 0.125, 8192, out=out, sliding_window=window, sinks=sinks)
    else:
        paged_decode_split_kv(q, kc, vc, ctx, bt, 0.125, 8192, num_splits=num_splits, out=out,
                              sliding_window=window, sinks=sinks)
    assert rel_err(out, ref) < MAX_REL_ERR


@pytest.mark.parametrize("m, decode", [(1, True), (4, True), (1, False), (64, False), (1024, False)])
def test_gpt_oss_experts_gpu(m, decode):
    """gpt-oss-20b's experts (32 of 2880 x 2880, top-4) in bf16 with biases and the clamped SwiGLU: within the
    relative error of the torch path in bf16 of the torch path in float32."""
    num_experts, top_k, hidden, inter = 32, 4, 2880, 2880
    g = torch.Generator().manual_seed(m)
    w13 = (torch.randn(num_experts, 2 * inter, hidden, generator=g) * 4 / hidden**0.5).to("cuda", torch.bfloat16)
    w2 = (torch.randn(num_experts, hidden, inter, generator=g) / inter**0.5).to("cuda", torch.bfloat16)
    b13 = torch.randn(num_experts, 2 * inter, generator=g).to("cuda", torch.bfloat16)
    b2 = torch.randn(num_experts, hidden, generator=g).to("cuda", torch.bfloat16)
    x = torch.randn(m, hidden, generator=g).to("cuda", torch.bfloat16)
    logits = torch.randn(m, num_experts, generator=g).cuda()
    top, ids = torch.topk(logits, top_k, dim=-1)
    weights, ids = top.softmax(-1), ids.to(torch.int32)
    act = dict(activation="swigluoai", swiglu_alpha=1.702, swiglu_limit=7.0)
    ref = fused_moe(x.float(), w13.float(), w2.float(), weights, ids, w13_bias=b13.float(), w2_bias=b2.float(), **act)
    torch_bf16 = fused_moe(x, w13, w2, weights, ids, w13_bias=b13, w2_bias=b2, **act)
    out = fused_moe_triton(x, w13, w2, weights, ids, decode=decode, w13_bias=b13, w2_bias=b2, **act)
    assert rel_err(out, ref) <= 1.5 * rel_err(torch_bf16, ref) + 1e-3


@pytest.fixture(scope="module")
def tiny_gpt_oss(tmp_path_factory) -> str:
    from tests.helpers.gpt_oss_checkpoints import build_gpt_oss_checkpoint

    return str(build_gpt_oss_checkpoint(tmp_path_factory.mktemp("gpt-oss-gpu"), seed=3))


def test_gpt_oss_engine_gpu_equals_cpu(tiny_gpt_oss):
    """float32, prompts and generations past the 12-token window: CUDA graphs give eager's greedy tokens, and
    both the CPU torch backend's first tokens (then most whole sequences, allowing for GPU rounding)."""
    from minivllm import LLM, SamplingParams

    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    prompts = [f"def function_{i}(x):\n    return " + "x + " * i for i in range(24)]
    with LLM(tiny_gpt_oss, device="cpu") as llm:
        cpu = [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]
    gpu = {}
    for eager in (True, False):
        with LLM(tiny_gpt_oss, device="cuda", dtype="float32", enforce_eager=eager,
                 gpu_memory_utilization=0.3) as llm:
            gpu[eager] = [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]
    assert gpu[False] == gpu[True]
    assert [g[:8] for g in gpu[True]] == [c[:8] for c in cpu]
    assert sum(g == c for g, c in zip(gpu[True], cpu)) >= 20
