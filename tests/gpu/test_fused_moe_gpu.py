"""The fused MoE Triton kernels on a GPU over the full grid: M from 1 to 4096 tokens, E in {8, 64, 128}, top-k in
{2, 8}, bf16 and FP8 experts (per channel and 128 x 128 blocks), the decode path against the grouped path, the
routing and the alignment at real sizes, and ``fused_moe_triton`` under CUDA-graph capture equal to eager.

References (tests/helpers/moe_reference.py) run on the GPU in float32 (the float64 loop would be slow at 4096
tokens); the kernels' bf16 error is bounded relative to that of the same math done by torch in bf16.
"""

from __future__ import annotations

import pytest
import torch

from minivllm.kernels.fused_moe import fused_moe_triton, select_experts_triton
from minivllm.kernels.moe_align import moe_align_block_size
from minivllm.kernels.moe_fp8_weights import quantize_moe_weights_fp8
from tests.helpers.kernel_checks import rel_err
from tests.helpers.moe_reference import (
    align_naive,
    fused_moe_fp8_naive,
    fused_moe_naive,
    moe_weights,
    select_experts_naive,
    uneven_routing,
)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

MS = [1, 2, 3, 8, 16, 33, 64, 128, 256, 512, 1024, 4096]
# (E, top_k, H, I): Mixtral-like, OLMoE-like, Qwen3-30B-A3B-like (H and I scaled down where E is small)
SHAPES = [(8, 2, 1024, 1792), (64, 8, 2048, 1024), (128, 8, 2048, 768), (128, 2, 512, 384)]


def _layer(num_experts, hidden, inter, m, top_k, seed=0, uneven=True):
    w13, w2 = moe_weights(num_experts, hidden, inter, torch.bfloat16, seed=seed, device="cuda")
    x = torch.randn(m, hidden, generator=torch.Generator().manual_seed(seed + m)).to("cuda", torch.bfloat16)
    if uneven:
        weights, ids = uneven_routing(m, num_experts, top_k, seed=seed + m, skew=num_experts / 8, device="cuda")
    else:
        logits = torch.randn(m, num_experts, generator=torch.Generator().manual_seed(seed)).cuda()
        weights, ids = select_experts_naive(logits, top_k, True)
    return x, w13, w2, weights, ids


@pytest.mark.parametrize("m", MS)
@pytest.mark.parametrize("num_experts, top_k, hidden, inter", SHAPES)
def test_bf16_as_accurate_as_torch_in_bf16(m, num_experts, top_k, hidden, inter):
    x, w13, w2, weights, ids = _layer(num_experts, hidden, inter, m, top_k)
    ref = fused_moe_naive(x, w13, w2, weights, ids, acc_dtype=torch.float32)
    torch_bf16 = fused_moe_naive(x, w13, w2, weights, ids, acc_dtype=torch.bfloat16)
    out = fused_moe_triton(x, w13, w2, weights, ids)
    assert out.shape == (m, hidden) and out.dtype == torch.bfloat16
    err, torch_err = rel_err(out, ref), rel_err(torch_bf16, ref)
    assert err <= 1.5 * torch_err + 1e-3, f"fused_moe_triton {err:.2e} vs torch in bf16 {torch_err:.2e}"


@pytest.mark.parametrize("m", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("num_experts, top_k, hidden, inter", SHAPES)
def test_decode_path_equals_grouped_path(m, num_experts, top_k, hidden, inter):
    x, w13, w2, weights, ids = _layer(num_experts, hidden, inter, m, top_k, uneven=False)
    ref = fused_moe_naive(x, w13, w2, weights, ids, acc_dtype=torch.float32)
    decode = fused_moe_triton(x, w13, w2, weights, ids, decode=True)
    grouped = fused_moe_triton(x, w13, w2, weights, ids, decode=False)
    assert rel_err(decode, ref) < 1e-2 and rel_err(grouped, ref) < 1e-2
    torch.testing.assert_close(decode, grouped, rtol=2e-2, atol=2e-2 * ref.abs().max().item())


@pytest.mark.parametrize("m, decode", [(1, True), (4, True), (1, False), (4, False), (64, False), (1024, False),
                                       (4096, False)])
@pytest.mark.parametrize("num_experts, top_k, hidden, inter", [(8, 2, 1024, 1792), (128, 8, 2048, 768)])
@pytest.mark.parametrize("block", [(128, 128), None])
def test_fp8_experts_equal_the_reference(m, decode, num_experts, top_k, hidden, inter, block):
    x, w13, w2, weights, ids = _layer(num_experts, hidden, inter, m, top_k)
    q13, s13, q2, s2 = quantize_moe_weights_fp8(w13, w2, block)
    out = fused_moe_triton(x, q13, q2, weights, ids, w13_scale=s13, w2_scale=s2, block_shape=block, decode=decode)
    ref = fused_moe_fp8_naive(x, q13, s13, q2, s2, block, weights, ids, quantize_acts=not decode)  # float64
    # NOTE: an activation near an e4m3 rounding boundary may land one step away from the reference's, and
    # wgmma sums FP8 products less exactly than float32
    assert rel_err(out, ref) < 1e-2


@pytest.mark.parametrize("n, num_experts, top_k", [(1, 128, 8), (256, 128, 8), (4096, 128, 8), (4096, 8, 2),
                                                   (777, 64, 8)])
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_routing_at_real_sizes(n, num_experts, top_k, renormalize, dtype):
    logits = torch.randn(n, num_experts, generator=torch.Generator().manual_seed(n)).cuda().to(dtype)
    weights, ids = select_experts_triton(logits, top_k, renormalize)
    ref_w, ref_ids = select_experts_naive(logits, top_k, renormalize)
    torch.testing.assert_close(weights, ref_w, rtol=1e-5, atol=1e-6)
    if dtype == torch.float32:
        assert torch.equal(ids, ref_ids)
    else:  # NOTE: bf16 logits tie often; among equal probabilities either expert is right
        probs = torch.softmax(logits.float(), -1)
        torch.testing.assert_close(probs.gather(1, ids.long()), probs.gather(1, ref_ids.long()), rtol=0, atol=0)
        assert ((ids[:, :, None] == ids[:, None, :]).sum((1, 2)) == top_k).all()  # distinct experts per token


@pytest.mark.parametrize("n, num_experts, top_k, block_m", [(1, 128, 8, 16), (4096, 128, 8, 64), (4096, 8, 2, 128),
                                                             (333, 64, 8, 32)])
def test_alignment_at_real_sizes(n, num_experts, top_k, block_m):
    _, ids = uneven_routing(n, num_experts, top_k, seed=n, skew=num_experts / 4, device="cuda")
    sorted_ids, expert_ids, post_pad = moe_align_block_size(ids, block_m, num_experts)
    want_sorted, want_experts, want_used = align_naive(ids.cpu(), block_m, num_experts)
    assert sorted_ids.tolist() == want_sorted and expert_ids.tolist() == want_experts
    assert post_pad.item() == want_used


@pytest.mark.parametrize("m, decode", [(1, True), (4, True), (8, False), (64, False), (512, False)])
@pytest.mark.parametrize("fp8", [False, True])
def test_cuda_graph_replay_equals_eager(m, decode, fp8):
    """Captured once, replayed with new activations and new routings (other expert loads): equal to eager."""
    num_experts, top_k, hidden, inter = 128, 8, 2048, 768
    x, w13, w2, weights, ids = _layer(num_experts, hidden, inter, m, top_k)
    kw = {"decode": decode}
    if fp8:
        q13, s13, q2, s2 = quantize_moe_weights_fp8(w13, w2, (128, 128))
        w13, w2 = q13, q2
        kw.update(w13_scale=s13, w2_scale=s2, block_shape=(128, 128))
    logits = torch.zeros(m, num_experts, device="cuda")
    weights, ids = select_experts_triton(logits, top_k, True)
    out = fused_moe_triton(x, w13, w2, weights, ids, **kw)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        weights, ids = select_experts_triton(logits, top_k, True)
        out = fused_moe_triton(x, w13, w2, weights, ids, **kw)
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        x.copy_(torch.randn(m, hidden, generator=g).to(x))
        skew = torch.linspace(0, 4 * seed, num_experts)  # later seeds crowd the high experts
        logits.copy_(torch.randn(m, num_experts, generator=g) + skew)
        graph.replay()
        eager_w, eager_ids = select_experts_triton(logits, top_k, True)
        eager = fused_moe_triton(x, w13, w2, eager_w, eager_ids, **kw)
        assert torch.equal(ids, eager_ids)
        torch.testing.assert_close(out, eager, rtol=0, atol=0)
