"""The Triton GEMV on a GPU at real decode shapes: as accurate as cuBLAS against float32."""

import pytest
import torch
import torch.nn.functional as F

from minivllm.kernels.gemv import gemv
from minivllm.kernels.gemv_config import MAX_ROWS, MIN_WEIGHT_NUMEL, use_gemv
from tests.helpers.kernel_checks import rel_err

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [1, 2, 7, 16, 48, 130])
@pytest.mark.parametrize("n,k", [(3072, 4096), (4096, 2048), (12288, 4096), (4096, 6144), (1000, 1000)])
@pytest.mark.parametrize("config", [None, (64, 128, 4, 4, ""), (16, 256, 4, 4, "f")])
def test_gemv_as_accurate_as_cublas(dtype, m, n, k, config):
    g = torch.Generator(device="cuda").manual_seed(n + k + m)
    x = torch.randn(m, k, device="cuda", generator=g).to(dtype)
    w = (torch.randn(n, k, device="cuda", generator=g) / k**0.5).to(dtype)
    b = torch.randn(n, device="cuda", generator=g).to(dtype)
    ref = F.linear(x.float(), w.float(), b.float())
    out = gemv(x, w, b, config=config)
    assert use_gemv(x, w) == ((n * k >= MIN_WEIGHT_NUMEL or m == 1) and m <= MAX_ROWS)
    assert out.shape == (m, n) and out.dtype == dtype
    err, cublas_err = rel_err(out, ref), rel_err(F.linear(x, w, b), ref)
    assert err <= 1.5 * cublas_err + 1e-4, f"gemv {err:.2e} vs cuBLAS {cublas_err:.2e}"


def test_gemv_in_cuda_graph_replays_new_inputs():
    x = torch.zeros(1, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(3072, 4096, device="cuda", dtype=torch.bfloat16) / 64
    y = gemv(x, w)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = gemv(x, w)
    for seed in range(3):
        x.copy_(torch.randn(1, 4096, generator=torch.Generator().manual_seed(seed)).to(x))
        graph.replay()
        torch.testing.assert_close(y.float(), F.linear(x.float(), w.float()), rtol=2e-2, atol=2e-2)
