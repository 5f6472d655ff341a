"""FP8 quantization fused into RMSNorm / add+RMSNorm / SiLU-and-mul (``minivllm.kernels.fused_quant``) against
``quantize_fp8_ref`` of the unfused kernels' outputs, on the CPU under ``TRITON_INTERPRET=1``.

With the ``gpu_rounding`` fixture (the interpreter's float32 -> bf16 / e4m3 casts patched to round to
nearest even, as GPUs do; ``kernel_checks.gpu_rounding_in_interpreter``) the FP8 bytes equal the reference's
wherever the scales are the same; the scales are within 1e-6 (about half of them 1 ulp apart on the CPU only:
see ``assert_fp8_equal``). One test runs without the patch, where the interpreter's own e4m3 cast rounds ties
away from zero and drops carries (as in ``tests/test_fp8.py``). Outputs are allocated poisoned (NaN) so an
unwritten element fails. On CUDA: ``tests/gpu/test_fused_quant_gpu.py`` (bit for bit).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from minivllm.kernels import fused_quant  # noqa: E402
from minivllm.kernels.fused_act import silu_and_mul  # noqa: E402
from minivllm.kernels.fused_norm import fused_add_rms_norm, rms_norm  # noqa: E402
from minivllm.kernels.fused_quant import fused_add_rms_norm_fp8, rms_norm_fp8, silu_and_mul_fp8  # noqa: E402
from minivllm.kernels.torch_backend import quantize_fp8_ref  # noqa: E402
from tests.helpers.kernel_checks import gpu_rounding_in_interpreter  # noqa: E402

pytestmark = pytest.mark.triton

DEV = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-6
SLOW = pytest.mark.slow
DTYPES = [torch.float32, torch.bfloat16]
GROUPS = [None, 128, 64]
# NOTE: the fast tier keeps every width, dtype and group at M = 3; M = 1 and 17 run with -m slow
ROWS = [pytest.param(1, marks=SLOW), 3, pytest.param(17, marks=SLOW)]
_EMPTY = torch.empty


@pytest.fixture
def poison(monkeypatch):
    """While active, ``torch.empty`` of a float dtype (FP8 included) returns a NaN-filled tensor."""
    def empty(*size, dtype=None, device=None, **kw):
        t = _EMPTY(*size, dtype=dtype, device=device, **kw)
        if t.dtype == torch.float8_e4m3fn:
            t.view(torch.uint8).fill_(0x7F)  # e4m3fn's NaN
        elif t.is_floating_point():
            t.fill_(float("nan"))
        return t
    monkeypatch.setattr(torch, "empty", empty)


@pytest.fixture(autouse=True)
def gpu_rounding(monkeypatch):
    """The interpreter's float32 -> bf16 / e4m3 casts rounded as on a GPU (one test undoes it)."""
    return gpu_rounding_in_interpreter(monkeypatch)


def gen(seed):
    return torch.Generator().manual_seed(seed)


def randn(g, *shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, generator=g) * scale).to(device=DEV, dtype=dtype)


def norm_weight(g, h, dtype):
    return (1.0 + 0.2 * torch.randn(h, generator=g)).to(device=DEV, dtype=dtype)  # [h]


def fp8_step(a, b):
    """One e4m3 step (ulp) at the larger magnitude of ``a`` / ``b`` (float32 views of FP8 values)."""
    return torch.exp2(torch.maximum(a.abs(), b.abs()).clamp_min(2.0**-6).log2().floor() - 3)


def assert_fp8_equal(got, unfused, group, patched=True):
    """``got``: ``(x8, scale)`` of a fused kernel; ``unfused``: the unfused kernel's output, quantized here by
    ``quantize_fp8_ref(unfused, group)``. Scales within 1e-6 (NOTE: the kernel's ``amax * (1 / 448)`` is
    torch's on CUDA; torch on the CPU divides by 448 exactly, ~half the scales 1 ulp apart). FP8 values: the
    same bytes where the scale is the same, else within one FP8 step (a value at a rounding midpoint of both).
    patched: False without ``gpu_rounding``, where the interpreter's e4m3 cast rounds ties away from zero (one
    step off) and drops the carry into the exponent (the reference a power of two, the value half of it)."""
    (q, s), (q_ref, s_ref) = got, quantize_fp8_ref(unfused, group)
    assert q.dtype == torch.float8_e4m3fn and q.shape == q_ref.shape
    assert s.dtype == torch.float32 and s.shape == s_ref.shape
    torch.testing.assert_close(s, s_ref, rtol=1e-6, atol=0)
    a, b = q.float(), q_ref.float()
    assert not a.isnan().any(), "unwritten element"
    same_scale = (s == s_ref).repeat_interleave(group or q.shape[1], 1)[:, :q.shape[1]]  # [M, K]
    near = (a - b).abs() <= fp8_step(a, b)
    if patched:
        assert torch.equal(q.view(torch.uint8)[same_scale], q_ref.view(torch.uint8)[same_scale])
        assert near.all()
    else:
        assert (near | (b.abs().log2().frac() == 0)).all()


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("h", [64, 200, 256])
@pytest.mark.parametrize("m", ROWS)
def test_rms_norm_fp8(m, h, dtype, group, poison):
    g = gen(m * 1000 + h)
    x, w = randn(g, m, h, dtype=dtype, scale=3.0), norm_weight(g, h, dtype)  # [m, h], [h]
    x_in = x.clone()
    got = rms_norm_fp8(x, w, EPS, group)
    assert torch.equal(x, x_in), "input modified"
    assert_fp8_equal(got, rms_norm(x, w, EPS), group)
    # a strided row view: every other row of a wider buffer
    xv = randn(g, 2 * m, h + 8, dtype=dtype, scale=2.0)[::2, :h]  # [m, h]
    assert_fp8_equal(rms_norm_fp8(xv, w, EPS, group), rms_norm(xv, w, EPS), group)


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("h", [64, 200, 256])
@pytest.mark.parametrize("m", ROWS)
def test_fused_add_rms_norm_fp8(m, h, dtype, group, poison):
    g = gen(m * 1000 + h + 1)
    x, res = randn(g, m, h, dtype=dtype, scale=3.0), randn(g, m, h, dtype=dtype, scale=10.0)  # [m, h] each
    w = norm_weight(g, h, dtype)  # [h]
    x_in, res_in = x.clone(), res.clone()
    ref_out, ref_res = fused_add_rms_norm(x_in.clone(), res_in.clone(), w, EPS, inplace=True)
    q, s, new_res = fused_add_rms_norm_fp8(x, res, w, EPS, group)
    assert new_res is res and torch.equal(x, x_in), "residual not updated in place, or x modified"
    assert torch.equal(res, ref_res), "residual differs from fused_add_rms_norm's x + residual"
    assert_fp8_equal((q, s), ref_out, group)


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 200, 384])
@pytest.mark.parametrize("m", ROWS)
def test_silu_and_mul_fp8(m, d, dtype, group, poison):
    g = gen(m * 1000 + d + 2)
    x = randn(g, m, 2 * d, dtype=dtype, scale=3.0)  # [m, 2d]
    x_in = x.clone()
    got = silu_and_mul_fp8(x, group)
    assert torch.equal(x, x_in), "input modified"
    assert_fp8_equal(got, silu_and_mul(x), group)
    xv = randn(g, 2 * m, 2 * d + 6, dtype=dtype)[1::2, :2 * d]  # [m, 2d] strided rows
    assert_fp8_equal(silu_and_mul_fp8(xv, group), silu_and_mul(xv), group)


@pytest.mark.parametrize("d, group, one_pass_max", [(2500, None, None), (17000, None, None),
                                                   (17000, None, 4096), (2500, 128, None), (2500, 64, None)])
def test_silu_and_mul_fp8_wide_rows(d, group, one_pass_max, poison, monkeypatch):
    """Per token: one pass over a row in a 4096- or 32768-column block, or (``ONE_PASS_MAX`` lowered) two
    passes over five 4096-column chunks; per group: three 1024-column programs a row. The row's largest value
    away from its first chunk."""
    if one_pass_max:
        monkeypatch.setattr(fused_quant, "ONE_PASS_MAX", one_pass_max)
    x = randn(gen(d), 2, 2 * d, dtype=torch.bfloat16, scale=2.0)  # [2, 2D]
    x[1, d - 300] = 30.0
    assert_fp8_equal(silu_and_mul_fp8(x, group), silu_and_mul(x), group)


def test_zero_rows_empty_and_leading_dims(poison):
    """All-zero rows (scale clamped at 1e-12, x8 = 0), M = 0, and [..., H] inputs flattened to rows."""
    g = gen(11)
    w = norm_weight(g, 128, torch.bfloat16)
    x = randn(g, 2, 3, 128, dtype=torch.bfloat16)  # [2, 3, 128]
    x[0, 1] = 0.0
    for group in (None, 64):
        q, s = rms_norm_fp8(x, w, EPS, group)
        assert_fp8_equal((q, s), rms_norm(x, w, EPS).view(6, 128), group)
        assert torch.equal(s[1], torch.full_like(s[1], 1e-12)) and (q[1].float() == 0).all()
        q, s = silu_and_mul_fp8(x, group)
        assert_fp8_equal((q, s), silu_and_mul(x).view(6, 64), group)
        assert torch.equal(s[1], torch.full_like(s[1], 1e-12))
    e = (*rms_norm_fp8(x[0, :0], w, EPS, 64), *silu_and_mul_fp8(x[0, :0]),
         *fused_add_rms_norm_fp8(x[0, :0], x[1, :0], w, EPS)[:2])
    assert [t.shape for t in e] == [(0, 128), (0, 2), (0, 64), (0, 1), (0, 128), (0, 1)]


def test_bad_group_is_rejected():
    x = torch.zeros(1, 256, device=DEV)
    with pytest.raises(AssertionError, match="power of two"):
        silu_and_mul_fp8(x, 96)


@pytest.mark.skipif(DEV == "cuda", reason="the interpreter's own casts")
@pytest.mark.parametrize("group", [None, 128])
def test_without_the_rounding_patch_only_ties_and_dropped_carries_differ(group, monkeypatch):
    """The interpreter's own float32 -> e4m3 (and truncating float32 -> bf16) casts: the bf16 rounding is the
    unfused kernels' too, so only the e4m3 ties and dropped carries differ."""
    monkeypatch.undo()  # NOTE: removes the autouse gpu_rounding patch
    g = gen(5)
    x, w = randn(g, 5, 256, dtype=torch.bfloat16, scale=3.0), norm_weight(g, 256, torch.bfloat16)
    assert_fp8_equal(rms_norm_fp8(x, w, EPS, group), rms_norm(x, w, EPS), group, patched=False)
    xs = randn(g, 5, 512, dtype=torch.bfloat16, scale=3.0)  # [5, 2 * 256]
    assert_fp8_equal(silu_and_mul_fp8(xs, group), silu_and_mul(xs), group, patched=False)
