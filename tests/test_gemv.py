"""The Triton GEMV (few-row linear) against a float32 torch reference; interpreter on the CPU."""

from __future__ import annotations

import pytest
import torch

from minivllm.kernels.gemv import gemv
from minivllm.kernels.gemv_config import MAX_BLOCK_M, VARIANTS, block_m, gemv_config, max_rows, parse_config

pytestmark = pytest.mark.triton
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ULP = {torch.float32: 2.0**-20, torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("m,n,k", [(1, 64, 256), (3, 100, 300), (16, 40, 96), (2, 33, 1000), (37, 50, 200)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("variant", VARIANTS)
def test_gemv_matches_float32_reference(dtype, m, n, k, bias, variant):
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=g).to(dtype).to(DEVICE)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(dtype).to(DEVICE)
    b = torch.randn(n, generator=g).to(dtype).to(DEVICE) if bias else None
    out = gemv(x, w, b, config=(16, 64, 2, 4, variant))  # small tiles: several programs and K steps
    ref = torch.nn.functional.linear(x.float(), w.float(), None if b is None else b.float())  # [m, n]
    assert out.shape == (m, n) and out.dtype == dtype
    # float32 accumulation, one rounding to the output dtype (float32: TF32-free on the CPU only)
    tol = ULP[dtype] if DEVICE == "cpu" or dtype != torch.float32 else 2e-3
    torch.testing.assert_close(out.float(), ref, rtol=tol, atol=tol * ref.abs().max().item())


def test_gemv_strided_rows_and_default_config():
    x = torch.randn(4, 512)[:, :256]  # rows with a stride of 512
    w = torch.randn(48, 256) / 16
    out = gemv(x.to(DEVICE), w.to(DEVICE))
    torch.testing.assert_close(out.cpu(), x @ w.T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("variant", VARIANTS)
def test_gemv_several_row_blocks(variant):
    """More rows than MAX_BLOCK_M: row blocks each cover their own rows, none twice, none missed."""
    g = torch.Generator().manual_seed(5)
    m = MAX_BLOCK_M + 3
    x = torch.randn(m, 64, generator=g)
    w = torch.randn(24, 64, generator=g) / 8
    out = gemv(x.to(DEVICE), w.to(DEVICE), config=(16, 32, 2, 4, variant))
    assert block_m(m) == MAX_BLOCK_M and block_m(17) == 32 and block_m(1) == 16
    torch.testing.assert_close(out.cpu(), x @ w.T, rtol=1e-4, atol=1e-4)


def test_gemv_zero_rows():
    assert gemv(torch.randn(0, 32, device=DEVICE), torch.randn(8, 32, device=DEVICE)).shape == (0, 8)


def test_gemv_configs_and_max_rows_setting(monkeypatch):
    assert parse_config("64x128x4x8s") == (64, 128, 4, 8, "s")
    assert parse_config("32x256x4x4") == (32, 256, 4, 4, "")
    assert parse_config("32x256x4x4ts") == (32, 256, 4, 4, "ts")
    with pytest.raises(ValueError, match="BLOCK_NxBLOCK_KxSTAGESxWARPS"):
        parse_config("64x128x4")
    with pytest.raises(ValueError, match="variant is one of"):
        parse_config("64x128x4x4st")
    for bad in ("0x128x4x4", "48x128x4x4", "64x128x0x4", "64x128x4x64", "64x-128x4x4"):
        with pytest.raises(ValueError, match="powers of two"):
            parse_config(bad)
    monkeypatch.setenv("MINIVLLM_GEMV_MAX_ROWS", "64")
    assert max_rows() == 64
    monkeypatch.setenv("MINIVLLM_GEMV_MAX_ROWS", "many")
    with pytest.raises(ValueError, match="MINIVLLM_GEMV_MAX_ROWS must be a row count"):
        max_rows()


def test_gemv_rejects_bad_shapes():
    w = torch.randn(8, 32)
    with pytest.raises(ValueError, match="x \\[M, K\\] and w \\[N, K\\]"):
        gemv(torch.randn(2, 16), w)
    with pytest.raises(ValueError, match="contiguous columns"):
        gemv(torch.randn(32, 2).t(), w)


def test_default_configs_by_rows_and_width(monkeypatch):
    """One row: FMAs, 8 columns a program up to 4096 columns, 16 above; more rows: the MMA kernel."""
    monkeypatch.delenv("MINIVLLM_GEMV_CFG", raising=False)
    assert gemv_config(3072, 4096, 1) == (8, 256, 6, 2, "f")
    assert gemv_config(6144, 4096, 1) == (16, 256, 4, 4, "f")
    assert gemv_config(24576, 4096, 1) == (16, 512, 3, 4, "f")
    assert gemv_config(3072, 4096, 2) == gemv_config(3072, 4096, 16) == (32, 256, 4, 4, "")
    assert gemv_config(3072, 4096, 48)[4] == "" and gemv_config(3072, 4096, 100)[1] == 128
    monkeypatch.setenv("MINIVLLM_GEMV_CFG", "32x256x4x4")
    assert gemv_config(3072, 4096, 1) == (32, 256, 4, 4, "")
