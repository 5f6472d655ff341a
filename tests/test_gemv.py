"""The Triton GEMV (few-row linear) against a float32 torch reference; interpreter on the CPU."""

from __future__ import annotations

import json

import pytest
import torch

from minivllm.kernels import gemv as gemv_mod
from minivllm.kernels.gemv import DEFAULT, MAX_ROWS, gemv, gemv_config, parse_config

pytestmark = pytest.mark.triton
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ULP = {torch.float32: 2.0**-20, torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("m,n,k", [(1, 64, 256), (3, 100, 300), (16, 40, 96), (2, 33, 1000)])
@pytest.mark.parametrize("bias", [False, True])
def test_gemv_matches_float32_reference(dtype, m, n, k, bias):
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=g).to(dtype).to(DEVICE)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(dtype).to(DEVICE)
    b = torch.randn(n, generator=g).to(dtype).to(DEVICE) if bias else None
    out = gemv(x, w, b, config=(16, 64, 2, 4))  # small tiles: several programs and K steps
    ref = torch.nn.functional.linear(x.float(), w.float(), None if b is None else b.float())  # [m, n]
    assert out.shape == (m, n) and out.dtype == dtype
    # float32 accumulation, one rounding to the output dtype (float32: TF32-free on the CPU only)
    tol = ULP[dtype] if DEVICE == "cpu" or dtype != torch.float32 else 2e-3
    torch.testing.assert_close(out.float(), ref, rtol=tol, atol=tol * ref.abs().max().item())


@pytest.mark.parametrize("split", [2, 3, 8])
@pytest.mark.parametrize("m,n,k", [(1, 64, 256), (5, 40, 1000), (16, 33, 96)])
def test_split_k_gemv_matches_reference_and_rearms_counters(split, m, n, k):
    """Split-K: partial sums in float32, the last split of each column block adds them in split order."""
    g = torch.Generator().manual_seed(split * 100 + n)
    x = torch.randn(m, k, generator=g).to(DEVICE)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(DEVICE)
    b = torch.randn(n, generator=g).to(DEVICE)
    cfg = (16, 32, 2, 4, split)  # (96 / 32 = 3 tiles for k=96: split 8 leaves splits with no tile)
    for _ in range(2):  # the counters are left at zero, so a second call is right too
        out = gemv(x, w, b, config=cfg)
        torch.testing.assert_close(out, torch.nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-5)
        assert int(gemv_mod._counters(x.device)[: -(-n // 16)].abs().sum()) == 0
    # the same sums whatever the split count, to float32 rounding
    torch.testing.assert_close(out, gemv(x, w, b, config=cfg[:4]), rtol=1e-5, atol=1e-5)


def test_parse_config_and_table(monkeypatch, tmp_path):
    assert parse_config("32x256x4x4") == (32, 256, 4, 4, 1) and parse_config("16x128x3x8x4") == (16, 128, 3, 8, 4)
    for bad in ("32x256x4", "32x256x4x4x0", "axbxcxd", ""):
        with pytest.raises(ValueError, match="BLOCK_NxBLOCK_KxSTAGESxWARPS"):
            parse_config(bad)
    path = tmp_path / "table.json"
    path.write_text(json.dumps({"3072,4096": "32x256x4x4x2", "1024,1024": "cublas"}))
    monkeypatch.delenv("MINIVLLM_GEMV_CFG", raising=False)
    monkeypatch.setenv("MINIVLLM_GEMV_TABLE", str(path))
    gemv_mod._table.cache_clear()
    try:
        assert gemv_config(3072, 4096) == (32, 256, 4, 4, 2)
        assert gemv_config(1024, 1024) is None  # cuBLAS measured faster
        assert gemv_config(8192, 8192) == DEFAULT and gemv_config(64, 64) is None  # the size rule elsewhere
        monkeypatch.setenv("MINIVLLM_GEMV_CFG", "16x64x2x4")
        assert gemv_config(1024, 1024) == (16, 64, 2, 4, 1)  # the override wins everywhere
    finally:
        monkeypatch.delenv("MINIVLLM_GEMV_TABLE")
        gemv_mod._table.cache_clear()


def test_gemv_strided_rows_and_default_config():
    x = torch.randn(4, 512)[:, :256]  # rows with a stride of 512
    w = torch.randn(48, 256) / 16
    out = gemv(x.to(DEVICE), w.to(DEVICE))
    torch.testing.assert_close(out.cpu(), x @ w.T, rtol=1e-4, atol=1e-4)


def test_gemv_rejects_bad_shapes():
    w = torch.randn(8, 32)
    with pytest.raises(ValueError, match="x \\[M, K\\] and w \\[N, K\\]"):
        gemv(torch.randn(2, 16), w)
    with pytest.raises(ValueError, match=f"at most {MAX_ROWS} rows"):
        gemv(torch.randn(MAX_ROWS + 1, 32), w)
    with pytest.raises(ValueError, match="contiguous columns"):
        gemv(torch.randn(32, 2).t(), w)
