"""FP8 quantization fused into RMSNorm / add+RMSNorm / SiLU-and-mul on CUDA at real sizes (Qwen3-8B: hidden
4096, intermediate 12288; 32B: 5120, 25600), against ``quantize_fp8_ref`` of the unfused kernels' outputs.

Exact, no tolerance: the GPU's float32 -> e4m3 conversion rounds to nearest even as torch's does, the norm's
sum of squares is reduced in rms_norm's order, and the scale and its reciprocal are computed as torch on CUDA
computes them (``amax * float32(1 / 448)``, an IEEE ``1 / scale``). Measured on H100 (bf16, 512 rows, hidden
4096 / D 12288, 4 seeds, per token and per 128): 0 of 67,108,864 FP8 values and 0 of 266,240 scales differ;
with Triton's float32 ``/`` (approximate) for the reciprocal, 97 values (1.4e-6) were one step off; dividing
amax by 448 exactly, 56% of the scales were 1 ulp off torch's. Plus the in-place residual bit for bit, PDL
(M <= 16 on sm_90+), one and two passes over a SiLU row (D = 40000), and capture in a CUDA graph.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

if torch.cuda.is_available():
    from minivllm.kernels.fused_act import silu_and_mul
    from minivllm.kernels.fused_norm import fused_add_rms_norm, rms_norm
    from minivllm.kernels.fused_quant import fused_add_rms_norm_fp8, rms_norm_fp8, silu_and_mul_fp8
    from minivllm.kernels.torch_backend import quantize_fp8_ref

DEV, EPS = "cuda", 1e-6
ROWS = [1, 7, 16, 128, 512]
GROUPS = [None, 128]


def randn(g, *shape, dtype=torch.bfloat16, scale=1.0):
    return (torch.randn(*shape, device=DEV, generator=g) * scale).to(dtype)


def assert_fp8_equal(got, ref):
    (q, s), (q_ref, s_ref) = got, ref
    assert q.dtype == torch.float8_e4m3fn and q.shape == q_ref.shape and s.shape == s_ref.shape
    assert torch.equal(s, s_ref), (s - s_ref).abs().max()
    differ = (q.view(torch.uint8) != q_ref.view(torch.uint8)).sum().item()
    assert differ == 0, f"{differ} of {q.numel()} FP8 values differ from the reference"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("h", [4096, 5120])
@pytest.mark.parametrize("m", ROWS)
def test_norms_fp8(m, h, group, dtype):
    g = torch.Generator(DEV).manual_seed(m * h)
    x, res = randn(g, m, h, dtype=dtype, scale=3.0), randn(g, m, h, dtype=dtype, scale=10.0)  # [m, h] each
    w = (1.0 + 0.2 * torch.randn(h, device=DEV, generator=g)).to(dtype)  # [h]
    assert_fp8_equal(rms_norm_fp8(x, w, EPS, group), quantize_fp8_ref(rms_norm(x, w, EPS), group))
    ref_out, ref_res = fused_add_rms_norm(x.clone(), res.clone(), w, EPS, inplace=True)
    x_in = x.clone()
    q, s, new_res = fused_add_rms_norm_fp8(x, res, w, EPS, group)
    assert new_res is res and torch.equal(res, ref_res) and torch.equal(x, x_in)
    assert_fp8_equal((q, s), quantize_fp8_ref(ref_out, group))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("d", [12288, 25600, 3000, 40000])  # 40000: two passes over the row
@pytest.mark.parametrize("m", ROWS)
def test_silu_and_mul_fp8(m, d, group, dtype):
    g = torch.Generator(DEV).manual_seed(m + d)
    x = randn(g, m, 2 * d, dtype=dtype, scale=3.0)  # [m, 2d]
    x[:, d // 3] = 40.0  # some rows' largest value away from the first chunk
    assert_fp8_equal(silu_and_mul_fp8(x, group), quantize_fp8_ref(silu_and_mul(x), group))


@pytest.mark.parametrize("group", GROUPS)
def test_cuda_graph_replay_with_new_data(group):
    """Grids come from host ints: a captured graph replays on new data (same shapes) and matches eager."""
    g = torch.Generator(DEV).manual_seed(3)
    m, h, d = 16, 4096, 12288
    x, res, gu = randn(g, m, h), randn(g, m, h), randn(g, m, 2 * d)
    w = (1.0 + 0.2 * torch.randn(h, device=DEV, generator=g)).to(torch.bfloat16)  # [h]
    rms_norm_fp8(x, w, EPS, group), silu_and_mul_fp8(gu, group)  # compile outside the capture
    fused_add_rms_norm_fp8(x, res.clone(), w, EPS, group)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = (rms_norm_fp8(x, w, EPS, group), fused_add_rms_norm_fp8(x, res, w, EPS, group)[:2],
                silu_and_mul_fp8(gu, group))
    for seed in (1, 2):
        g2 = torch.Generator(DEV).manual_seed(seed)
        x.copy_(randn(g2, m, h)), res.copy_(randn(g2, m, h)), gu.copy_(randn(g2, m, 2 * d))
        res0 = res.clone()
        graph.replay()
        torch.cuda.synchronize()
        assert_fp8_equal(outs[0], quantize_fp8_ref(rms_norm(x, w, EPS), group))
        ref_out, ref_res = fused_add_rms_norm(x.clone(), res0, w, EPS, inplace=True)
        assert torch.equal(res, ref_res)
        assert_fp8_equal(outs[1], quantize_fp8_ref(ref_out, group))
        assert_fp8_equal(outs[2], quantize_fp8_ref(silu_and_mul(gu), group))
