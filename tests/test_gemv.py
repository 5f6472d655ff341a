"""The Triton GEMV (few-row linear) against a float32 torch reference; interpreter on the CPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from minivllm.kernels.gemv import gemv
from minivllm.kernels.gemv_config import (
    MAX_BLOCK_M,
    MAX_ROWS,
    MIN_WEIGHT_NUMEL,
    VARIANTS,
    block_m,
    gemv_config,
    use_gemv,
)

pytestmark = pytest.mark.triton
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ULP = {torch.float32: 2.0**-20, torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}


DTYPES = [torch.bfloat16, torch.float16, torch.float32]
SHAPES = [(1, 64, 256), (3, 100, 300), (16, 40, 96), (2, 33, 1000), (37, 50, 200)]
FAST_SHAPE = (3, 100, 300)  # several rows, ragged N and K tiles: the fast tier's case per variant and dtype


def _grid():
    """Every (variant, dtype, shape, bias); one case per variant and dtype in the fast tier, the rest slow."""
    for variant in VARIANTS:
        for dtype in DTYPES:
            for m, n, k in SHAPES:
                for bias in (False, True):
                    fast = (m, n, k) == FAST_SHAPE and bias
                    yield pytest.param(dtype, m, n, k, bias, variant, marks=() if fast else pytest.mark.slow,
                                       id=f"{variant or 'mma'}-{str(dtype)[6:]}-{m}x{n}x{k}{'-bias' if bias else ''}")


@pytest.mark.parametrize("dtype,m,n,k,bias,variant", list(_grid()))
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


@pytest.mark.parametrize("variant", VARIANTS, ids=["mma", "f"])
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


def test_gemv_rejects_unknown_variants():
    """Only the MMA ("") and FMA ("f") variants exist."""
    x, w = torch.randn(2, 32, device=DEVICE), torch.randn(8, 32, device=DEVICE)
    for bad in ("s", "t", "ts"):
        with pytest.raises(ValueError, match="variant is one of"):
            gemv(x, w, config=(16, 32, 2, 4, bad))


def _fake(rows: int, cols: int, dtype=torch.bfloat16, cuda: bool = True):
    """Stands in for a CUDA tensor of ``[rows, cols]`` (``use_gemv`` reads only these attributes)."""
    return SimpleNamespace(is_cuda=cuda, dim=lambda: 2, shape=(rows, cols), dtype=dtype,
                           numel=lambda: rows * cols)


def test_which_linear_calls_take_the_gemv():
    """CUDA bf16/fp16 only; one row for every weight; 2..MAX_ROWS (16) rows for weights of 8M+ elements."""
    big, small = _fake(4096, MIN_WEIGHT_NUMEL // 4096), _fake(1024, 1024)
    assert MAX_ROWS == 16
    assert use_gemv(_fake(1, 1024), small) and not use_gemv(_fake(2, 1024), small)
    assert use_gemv(_fake(2, 4096), big) and use_gemv(_fake(MAX_ROWS, 4096), big)
    assert not use_gemv(_fake(MAX_ROWS + 1, 4096), big)  # cuBLAS above 16 rows
    assert not use_gemv(_fake(0, 4096), big)
    assert not use_gemv(_fake(1, 1024, torch.float32), _fake(1024, 1024, torch.float32))
    assert not use_gemv(_fake(1, 1024, cuda=False), small)
    assert not use_gemv(torch.randn(1, 64, dtype=torch.bfloat16), torch.randn(8, 64, dtype=torch.bfloat16))


def test_gemv_rejects_bad_shapes():
    w = torch.randn(8, 32)
    with pytest.raises(ValueError, match="x \\[M, K\\] and w \\[N, K\\]"):
        gemv(torch.randn(2, 16), w)
    with pytest.raises(ValueError, match="contiguous columns"):
        gemv(torch.randn(32, 2).t(), w)


def test_default_configs_by_rows_and_width():
    """One row: FMAs, 8 columns a program up to 4096 columns, 16 above; more rows: the MMA kernel."""
    assert gemv_config(3072, 4096, 1) == (8, 256, 6, 2, "f")
    assert gemv_config(6144, 4096, 1) == (16, 256, 4, 4, "f")
    assert gemv_config(24576, 4096, 1) == (16, 512, 3, 4, "f")
    assert gemv_config(3072, 4096, 2) == gemv_config(3072, 4096, 16) == (32, 256, 4, 4, "")
    assert gemv_config(3072, 4096, 48)[4] == "" and gemv_config(3072, 4096, 100)[1] == 128
    assert all(gemv_config(n, 4096, m)[4] in VARIANTS for n in (1024, 6144, 24576) for m in (1, 2, 16, 100))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("m, n, k", [(1, 100, 300), (3, 64, 256), (16, 40, 96)])
def test_gemv_with_fp8_weights_matches_the_dequantized_reference(variant, m, n, k):
    """FP8 weights widened in registers, each output column scaled by its row's scale; activations unquantized."""
    from minivllm.kernels.torch_backend import dequantize_weight_fp8_ref, quantize_weight_fp8_ref

    g = torch.Generator().manual_seed(m + n + k)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16).to(DEVICE)
    w8, scale = quantize_weight_fp8_ref(torch.randn(n, k, generator=g) * 0.05, None)
    w8, scale = w8.to(DEVICE), scale.to(DEVICE)
    b = torch.randn(n, generator=g).to(torch.bfloat16).to(DEVICE)
    assert use_gemv(x, w8) == (DEVICE == "cuda")
    out = gemv(x, w8, b, config=(16, 64, 2, 4, variant), w_scale=scale)
    ref = x.float() @ dequantize_weight_fp8_ref(w8, scale, None).t() + b.float()  # [m, n]
    torch.testing.assert_close(out.float(), ref, rtol=2**-7, atol=2**-7 * ref.abs().max().item())
