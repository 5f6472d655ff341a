"""MXFP4 experts in the fused MoE Triton kernels on a GPU at gpt-oss's shapes (gpt-oss-20b: E 32, top-4, H = I =
2880; gpt-oss-120b: E 128, top-4; and each at TP=2, I = 1440): both paths against the float32 MoE loop over the
dequantized experts, the decode path against the grouped one, CUDA-graph replay equal to eager, and a tiny gpt-oss
with MXFP4 experts through the engine (CUDA graphs, eager, the CPU's torch backend).

The kernels dequantize the weights exactly (e2m1 x 2^k is exact in bf16) and multiply bf16 activations by them; the
bound is the bf16 torch path's own error against float32 (tests/gpu/test_fused_moe_gpu.py's criterion)."""

from __future__ import annotations

import pytest
import torch

from minivllm.kernels.fused_moe import fused_moe_triton, select_experts_triton
from minivllm.kernels.mxfp4 import dequantize_mxfp4, quantize_mxfp4
from tests.helpers.kernel_checks import rel_err
from tests.helpers.moe_reference import fused_moe_naive, moe_weights, uneven_routing

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

# (E, top_k, H, I): gpt-oss-20b, gpt-oss-120b (fewer experts kept in memory here: the routing reaches 64), at
# TP=1 and TP=2
SHAPES = [(32, 4, 2880, 2880), (32, 4, 2880, 1440), (64, 4, 2880, 2880)]


def _layer(num_experts, hidden, inter, m, top_k, seed=0):
    w13, w2 = moe_weights(num_experts, hidden, inter, torch.float32, seed=seed, device="cuda")
    (b13, s13), (b2, s2) = (_quantize_by_expert(w) for w in (w13, w2))
    x = torch.randn(m, hidden, generator=torch.Generator().manual_seed(seed + m)).to("cuda", torch.bfloat16)
    weights, ids = uneven_routing(m, num_experts, top_k, seed=seed + m, skew=num_experts / 8, device="cuda")
    return x, (b13, s13, b2, s2), weights, ids


def _quantize_by_expert(w):
    """``quantize_mxfp4`` one expert at a time (its temporaries are several times the weights' size)."""
    parts = [quantize_mxfp4(w[e]) for e in range(w.shape[0])]
    return torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])


def _dequantized(packed, dtype):
    b13, s13, b2, s2 = packed
    return dequantize_mxfp4(b13, s13, dtype), dequantize_mxfp4(b2, s2, dtype)


@pytest.mark.parametrize("m", [1, 2, 4, 8, 16, 64, 256, 1024, 4096])
@pytest.mark.parametrize("num_experts, top_k, hidden, inter", SHAPES)
def test_mxfp4_as_accurate_as_torch_in_bf16(m, num_experts, top_k, hidden, inter):
    x, packed, weights, ids = _layer(num_experts, hidden, inter, m, top_k)
    b13, s13, b2, s2 = packed
    ref = fused_moe_naive(x, *_dequantized(packed, torch.float32), weights, ids, acc_dtype=torch.float32)
    torch_bf16 = fused_moe_naive(x, *_dequantized(packed, torch.bfloat16), weights, ids, acc_dtype=torch.bfloat16)
    out = fused_moe_triton(x, b13, b2, weights, ids, w13_scale=s13, w2_scale=s2)
    assert out.shape == (m, hidden) and out.dtype == torch.bfloat16
    err, torch_err = rel_err(out, ref), rel_err(torch_bf16, ref)
    assert err <= 1.5 * torch_err + 1e-3, f"fused_moe_triton {err:.2e} vs torch in bf16 {torch_err:.2e}"


@pytest.mark.parametrize("m", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("num_experts, top_k, hidden, inter", SHAPES)
def test_mxfp4_decode_path_equals_grouped_path(m, num_experts, top_k, hidden, inter):
    x, (b13, s13, b2, s2), weights, ids = _layer(num_experts, hidden, inter, m, top_k)
    kw = dict(w13_scale=s13, w2_scale=s2)
    decode = fused_moe_triton(x, b13, b2, weights, ids, decode=True, **kw)
    grouped = fused_moe_triton(x, b13, b2, weights, ids, decode=False, **kw)
    scale = grouped.float().abs().max().item()
    torch.testing.assert_close(decode, grouped, rtol=2e-2, atol=2e-2 * scale)


@pytest.mark.parametrize("m, decode", [(1, True), (4, True), (8, False), (512, False)])
def test_mxfp4_cuda_graph_replay_equals_eager(m, decode):
    """Captured once, replayed with new activations and routings: equal to eager."""
    num_experts, top_k, hidden, inter = 32, 4, 2880, 2880
    x, (b13, s13, b2, s2), _, _ = _layer(num_experts, hidden, inter, m, top_k)
    kw = dict(w13_scale=s13, w2_scale=s2, decode=decode)
    logits = torch.zeros(m, num_experts, device="cuda")
    weights, ids = select_experts_triton(logits, top_k, True)
    out = fused_moe_triton(x, b13, b2, weights, ids, **kw)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        weights, ids = select_experts_triton(logits, top_k, True)
        out = fused_moe_triton(x, b13, b2, weights, ids, **kw)
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        x.copy_(torch.randn(m, hidden, generator=g).to(x))
        logits.copy_(torch.randn(m, num_experts, generator=g) + torch.linspace(0, 4 * seed, num_experts))
        graph.replay()
        eager_w, eager_ids = select_experts_triton(logits, top_k, True)
        eager = fused_moe_triton(x, b13, b2, eager_w, eager_ids, **kw)
        assert torch.equal(ids, eager_ids)
        torch.testing.assert_close(out, eager, rtol=0, atol=0)


@pytest.fixture(scope="module")
def tiny_gpt_oss_mxfp4(tmp_path_factory) -> str:
    from tests.helpers.gpt_oss_checkpoints import build_gpt_oss_checkpoint
    from tests.helpers.mxfp4_checkpoints import write_gpt_oss_mxfp4

    root = tmp_path_factory.mktemp("gpt-oss-mxfp4-gpu")
    return str(write_gpt_oss_mxfp4(str(build_gpt_oss_checkpoint(root / "src", seed=3)), root)[0])


def test_gpt_oss_mxfp4_engine_gpu_equals_cpu(tiny_gpt_oss_mxfp4):
    """The tiny gpt-oss with MXFP4 experts, float32, prompts and generations past its 12-token window: CUDA
    graphs give eager's greedy tokens (the MXFP4 kernels under capture), and both the CPU torch backend's first
    tokens (then most whole sequences, allowing for GPU rounding): tests/gpu/test_gpt_oss_gpu.py's criterion."""
    from minivllm import LLM, SamplingParams

    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    prompts = [f"def function_{i}(x):\n    return " + "x + " * i for i in range(24)]
    with LLM(tiny_gpt_oss_mxfp4, device="cpu") as llm:
        cpu = [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]
    gpu = {}
    for eager in (True, False):
        with LLM(tiny_gpt_oss_mxfp4, device="cuda", dtype="float32", enforce_eager=eager,
                 gpu_memory_utilization=0.3) as llm:
            experts = [m for m in llm.engine.executor.runner.model.modules() if type(m).__name__ == "FusedMoE"]
            assert experts and all(m.w13_weight.dtype == torch.uint8 for m in experts)
            gpu[eager] = [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]
    assert gpu[False] == gpu[True]
    assert [g[:8] for g in gpu[True]] == [c[:8] for c in cpu]
    assert sum(g == c for g, c in zip(gpu[True], cpu)) >= 20
