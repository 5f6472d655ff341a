"""The Triton FP8 block / per-channel GEMM and the per-token-group quantizer on a GPU, at Qwen3-8B's linear
shapes: the GEMM against float64 math on its own FP8 operands, per channel against ``torch._scaled_mm``
(cuBLASLt), under a CUDA graph, and quantizer + GEMM against ``fp8_linear_ref``."""

import pytest
import torch

from minivllm.kernels.fp8_block_gemm import fp8_block_gemm, quantize_fp8_per_group
from minivllm.kernels.torch_backend import (
    fp8_gemm_ref,
    fp8_linear_ref,
    quantize_fp8_ref,
    quantize_weight_fp8_ref,
)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
SHAPES = [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288)]  # qkv, o, gate_up, down (N, K)
BLOCK = (128, 128)
# of the output's largest magnitude. NOTE: Hopper's FP8 tensor cores (wgmma, the tiles of 64 rows and more) add
# products in reduced precision: ~3-6e-4 of the largest output for K = 4096, as cuBLASLt's own FP8 GEMM (~3e-4,
# measured on an H100); the 16- and 32-row tiles (mma.sync) reach ~1e-6
TOL = {torch.float32: 2e-3, torch.bfloat16: 1e-2}


def gemm_reference(x8, x_scale, w8, w_scale, block, bias=None) -> torch.Tensor:
    """``[M, N]`` float64: the FP8 operands times their scales, multiplied in float64."""
    return fp8_gemm_ref(x8, x_scale, w8, w_scale, block, bias)


@pytest.fixture(scope="module", params=SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def weights(request):
    """(N, K, bias, block weights and scales, per-channel weights and scales) for one shape."""
    N, K = request.param
    g = torch.Generator("cuda").manual_seed(N + K)
    w = torch.randn(N, K, device="cuda", generator=g) * 0.02
    bias = torch.randn(N, device="cuda", generator=g)
    return N, K, bias, quantize_weight_fp8_ref(w, BLOCK), quantize_weight_fp8_ref(w, None)


def activations(M, K, group):
    x = torch.randn(M, K, device="cuda", generator=torch.Generator("cuda").manual_seed(M + K))
    x[:, ::97] *= 20  # outlier columns: groups of different ranges
    return quantize_fp8_ref(x, group)


@pytest.mark.parametrize("M", [1, 7, 16, 33, 64, 130, 256, 512])
@pytest.mark.parametrize("block", [BLOCK, None], ids=["block", "channel"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemm_equals_the_float64_reference(weights, M, block, dtype):
    N, K, bias, (w8b, wsb), (w8c, wsc) = weights
    w8, ws = (w8b, wsb) if block else (w8c, wsc)
    x8, xs = activations(M, K, None if block is None else block[1])
    b = bias if M % 2 else None  # odd M with bias, even without
    out = fp8_block_gemm(x8, xs, w8, ws, block, dtype, b)
    ref = gemm_reference(x8, xs, w8, ws, block, b)
    assert out.shape == (M, N) and out.dtype == dtype
    err = (out.double() - ref).abs().max().item()
    assert err <= TOL[dtype] * ref.abs().max().item(), (err, ref.abs().max().item())


@pytest.mark.parametrize("M", [1, 16, 100, 512])
def test_per_channel_equals_scaled_mm(weights, M):
    """cuBLASLt with row and column scales (bf16 output only) on the same FP8 operands; with unit scales and
    float32 output, at least a third as accurate as cuBLASLt."""
    N, K, bias, _, (w8, ws) = weights
    x8, xs = activations(M, K, None)
    b = bias.to(torch.bfloat16)
    out = fp8_block_gemm(x8, xs, w8, ws, None, torch.bfloat16, b)
    want = torch._scaled_mm(x8, w8.t(), scale_a=xs, scale_b=ws.view(1, -1), bias=b, out_dtype=torch.bfloat16)
    err = (out.double() - want.double()).abs().max().item()
    assert err <= TOL[torch.bfloat16] * want.abs().max().item(), err
    one = torch.ones((), device="cuda")
    raw = x8.double() @ w8.double().t()  # [M, N]
    ours = fp8_block_gemm(x8, one.expand(M, 1).contiguous(), w8, one.expand(N).contiguous(), None, torch.float32)
    cublas = torch._scaled_mm(x8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
    err, cublas_err = ((ours.double() - raw).abs().max().item(), (cublas.double() - raw).abs().max().item())
    assert err <= 3 * cublas_err + 1e-6 * raw.abs().max().item(), (err, cublas_err)


@pytest.mark.parametrize("M, K", [(1, 4096), (7, 1000), (256, 4096), (300, 12288)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_group_quantizer_equals_the_reference(M, K, dtype):
    x = (torch.randn(M, K, device="cuda", generator=torch.Generator("cuda").manual_seed(K)) * 4).to(dtype)
    q, s = quantize_fp8_per_group(x, 128)
    q_ref, s_ref = quantize_fp8_ref(x, 128)
    torch.testing.assert_close(s, s_ref, rtol=1e-6, atol=0)
    assert (q.float() != q_ref.float()).float().mean() < 1e-4  # a value on a rounding tie may go either way


@pytest.mark.parametrize("M", [1, 16, 300])
@pytest.mark.parametrize("block", [BLOCK, None], ids=["block", "channel"])
def test_quantize_then_gemm_equals_fp8_linear_ref(weights, M, block):
    from minivllm.kernels.fp8_quant import quantize_fp8_per_token

    N, K, bias, (w8b, wsb), (w8c, wsc) = weights
    w8, ws = (w8b, wsb) if block else (w8c, wsc)
    x = torch.randn(M, K, device="cuda", generator=torch.Generator("cuda").manual_seed(M)).to(torch.bfloat16)
    x8, xs = quantize_fp8_per_group(x, block[1]) if block else quantize_fp8_per_token(x)
    got = fp8_block_gemm(x8, xs, w8, ws, block, torch.bfloat16, bias.to(torch.bfloat16)).float()
    want = fp8_linear_ref(x.float(), w8, ws, block, bias.to(torch.bfloat16).float())
    assert ((got - want).norm() / want.norm()) < 1e-2  # bf16 output; a tie may round differently


def test_in_cuda_graph_replays_new_inputs():
    N, K = 6144, 4096
    w8, ws = quantize_weight_fp8_ref(torch.randn(N, K, device="cuda") * 0.02, BLOCK)
    x = torch.zeros(4, K, device="cuda", dtype=torch.bfloat16)

    def linear():
        x8, xs = quantize_fp8_per_group(x, 128)
        return fp8_block_gemm(x8, xs, w8, ws, BLOCK, torch.bfloat16)

    linear()  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = linear()
    for seed in range(3):
        x.copy_(torch.randn(4, K, generator=torch.Generator().manual_seed(seed)).to(x))
        graph.replay()
        want = fp8_linear_ref(x.float(), w8, ws, BLOCK)
        assert ((y.float() - want).norm() / want.norm()) < 1e-2
