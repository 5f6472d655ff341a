"""Fused Triton RMSNorm / add+RMSNorm / q-k norm+RoPE / SiLU-and-mul vs the torch layers.

Without a GPU these run under ``TRITON_INTERPRET=1`` (set by ``tests/conftest.py``), so shapes
are small. Outputs the wrappers allocate are poisoned with NaN (``torch.empty`` is patched
during the call) so an unwritten element fails. float32 must match the torch layer to ~1e-6;
float16/bfloat16 are compared with a float32 reference (relative error < 1e-2) and must not
be much worse than the torch layer run in the same dtype, whose rounding they reproduce (so
they equal it up to rare 1-ulp flips). NOTE: the interpreter's float32 -> bfloat16 conversion
truncates (and its float32 -> e4m3 drops a rounding carry); the ``gpu_rounding`` fixture patches both to
round to nearest even, as GPUs do.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from minivllm.kernels.fused_act import silu_and_mul  # noqa: E402
from minivllm.kernels.fused_norm import fused_add_rms_norm, rms_norm  # noqa: E402
from minivllm.kernels.fused_rope import qk_norm_rope  # noqa: E402
from minivllm.kernels.torch_backend import store_kvcache_ref  # noqa: E402
from minivllm.layers.activation import SiluAndMul  # noqa: E402
from minivllm.layers.layernorm import RMSNorm  # noqa: E402
from minivllm.layers.rotary import RotaryEmbedding  # noqa: E402
from tests.helpers.kernel_checks import check, gpu_rounding_in_interpreter  # noqa: E402

pytestmark = pytest.mark.triton

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
EPS = 1e-6
_EMPTY = torch.empty


@pytest.fixture
def poison(monkeypatch):
    """While active, ``torch.empty`` of a float dtype returns a NaN-filled tensor."""
    def empty(*size, dtype=None, device=None, **kw):
        t = _EMPTY(*size, dtype=dtype, device=device, **kw)
        return t.fill_(float("nan")) if t.is_floating_point() else t
    monkeypatch.setattr(torch, "empty", empty)


@pytest.fixture(autouse=True)
def gpu_rounding(monkeypatch):
    """The interpreter's float32 -> bfloat16 / e4m3 casts do not round as GPUs (and torch) do: patch them so
    the numerics are those of the GPU (``kernel_checks.gpu_rounding_in_interpreter``)."""
    return gpu_rounding_in_interpreter(monkeypatch)


def gen(seed):
    return torch.Generator().manual_seed(seed)


def randn(g, *shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, generator=g) * scale).to(device=DEV, dtype=dtype)


SLOW = pytest.mark.slow
# NOTE: each grid keeps one small shape per kernel and dtype in the fast tier; the others run with -m slow
ROWS = [pytest.param(1, 64, marks=SLOW), (7, 96), pytest.param(33, 128, marks=SLOW)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,d", ROWS)
def test_rms_norm(n, d, dtype, poison):
    g = gen(n * 1000 + d)
    x = randn(g, n, d, dtype=dtype, scale=3.0)  # [n, d]
    w = (1.0 + 0.2 * torch.randn(d, generator=g)).to(device=DEV, dtype=dtype)  # [d]
    layer, layer32 = RMSNorm(d, EPS).to(DEV), RMSNorm(d, EPS).to(DEV)
    layer.weight.data, layer32.weight.data = w, w.float()
    x_in = x.clone()
    out = rms_norm(x, w, EPS)
    assert torch.equal(x, x_in), "input modified"
    check(out, layer(x), layer32(x.float()), dtype)
    # a strided row view (every other row of a wider buffer) and ``out=`` in place
    buf = randn(g, 2 * n, d + 8, dtype=dtype)  # [2n, d + 8]
    xv = buf[::2, :d]  # [n, d], row stride 2 * (d + 8)
    check(rms_norm(xv, w, EPS), layer(xv), layer32(xv.float()), dtype)
    expected = layer(x)
    assert rms_norm(x, w, EPS, out=x) is x
    check(x, expected, layer32(x_in.float()), dtype)


def test_rms_norm_float32_exact():
    g = gen(7)
    for n, d in [(5, 96), (3, 1024)]:
        x, layer = randn(g, n, d, scale=5.0), RMSNorm(d, EPS).to(DEV)
        layer.weight.data = randn(g, d)
        torch.testing.assert_close(rms_norm(x, layer.weight, EPS), layer(x), rtol=1e-6, atol=1e-6)
    x3, layer = randn(g, 2, 3, 64), RMSNorm(64, EPS).to(DEV)  # [2, 3, 64]: leading dims are flattened
    layer.weight.data = randn(g, 64)
    torch.testing.assert_close(rms_norm(x3, layer.weight, EPS), layer(x3), rtol=1e-6, atol=1e-6)
    assert rms_norm(randn(g, 0, 64), layer.weight, EPS).shape == (0, 64)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,d", ROWS)
def test_fused_add_rms_norm(n, d, dtype, poison):
    g = gen(n * 1000 + d + 1)
    x, res = randn(g, n, d, dtype=dtype, scale=2.0), randn(g, n, d, dtype=dtype, scale=4.0)  # [n, d] each
    w = (1.0 + 0.2 * torch.randn(d, generator=g)).to(device=DEV, dtype=dtype)  # [d]
    layer, layer32 = RMSNorm(d, EPS).to(DEV), RMSNorm(d, EPS).to(DEV)
    layer.weight.data, layer32.weight.data = w, w.float()
    ref_out, ref_res = layer(x, res)
    ref32_out, ref32_res = layer32(x.float(), res.float())
    x_in, res_in = x.clone(), res.clone()
    out, new_res = fused_add_rms_norm(x, res, w, EPS)
    assert torch.equal(x, x_in) and torch.equal(res, res_in), "inputs modified without inplace"
    check(new_res, ref_res, ref32_res, dtype)
    check(out, ref_out, ref32_out, dtype)
    if dtype != torch.bfloat16:  # x + residual is one rounding: identical to torch
        assert torch.equal(new_res, ref_res)
    # in place: out -> x's buffer, x + residual -> residual's buffer
    out2, res2 = fused_add_rms_norm(x, res, w, EPS, inplace=True)
    assert out2.data_ptr() == x.data_ptr() and res2.data_ptr() == res.data_ptr()
    assert torch.equal(out2, out) and torch.equal(res2, new_res)


QK_SHAPES = [(1, 4, 2, 16), pytest.param(7, 8, 1, 32, marks=SLOW), pytest.param(33, 4, 2, 64, marks=SLOW),
             pytest.param(5, 8, 1, 128, marks=SLOW)]


def rope_case(n, hq, hkv, hd, dtype, seed):
    g = gen(seed)
    qkv = randn(g, n, (hq + 2 * hkv) * hd, dtype=dtype, scale=2.0)  # [n, (hq + 2 hkv) hd]
    qkv[:, (hq + hkv) * hd:] = float("nan")  # v: must be neither read nor written
    q, k, _ = qkv.split([hq * hd, hkv * hd, hkv * hd], dim=-1)
    q, k = q.view(n, hq, hd), k.view(n, hkv, hd)  # strided views, row stride (hq + 2 hkv) hd
    rope = RotaryEmbedding(hd, 4096, 1e6).to(DEV)
    positions = torch.randint(0, 4096, (n,), generator=g).to(DEV)  # [n] int64
    qn, kn = RMSNorm(hd, EPS).to(DEV), RMSNorm(hd, EPS).to(DEV)
    qn.weight.data = (1.0 + 0.3 * torch.randn(hd, generator=g)).to(device=DEV, dtype=dtype)
    kn.weight.data = (1.0 + 0.3 * torch.randn(hd, generator=g)).to(device=DEV, dtype=dtype)
    return qkv, q, k, positions, rope, qn, kn


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,hq,hkv,hd", QK_SHAPES)
def test_qk_norm_rope(n, hq, hkv, hd, dtype, poison):
    qkv, q, k, positions, rope, qn, kn = rope_case(n, hq, hkv, hd, dtype, seed=n * 100 + hq * 10 + hd)
    w32 = [m.weight.float() for m in (qn, kn)]
    for use_norm in (True, False):
        if use_norm:
            ref_q, ref_k = rope(positions, qn(q), kn(k))
            n32 = [(t.float() * torch.rsqrt(t.float().pow(2).mean(-1, keepdim=True) + EPS)) * w
                   for t, w in zip((q, k), w32)]
            ref32_q, ref32_k = rope(positions, *n32)
            weights = (qn.weight, kn.weight)
        else:
            ref_q, ref_k = rope(positions, q, k)
            ref32_q, ref32_k = rope(positions, q.float(), k.float())
            weights = (None, None)
        qkv_in = qkv.clone()
        q_out, k_out = qk_norm_rope(q, k, positions, rope.cos_sin_cache, *weights, eps=EPS)
        assert torch.equal(qkv.nan_to_num(), qkv_in.nan_to_num()), "input modified without inplace"
        assert q_out.is_contiguous() and k_out.is_contiguous()
        check(q_out, ref_q, ref32_q, dtype)
        check(k_out, ref_k, ref32_k, dtype)
        # in place into the qkv buffer: same views back, v untouched
        q_ip, k_ip = qk_norm_rope(q, k, positions, rope.cos_sin_cache, *weights, eps=EPS, inplace=True)
        assert q_ip.data_ptr() == q.data_ptr() and k_ip.data_ptr() == k.data_ptr()
        assert torch.equal(q_ip, q_out) and torch.equal(k_ip, k_out)
        assert qkv[:, (hq + hkv) * hd:].isnan().all(), "v was written"
        qkv.copy_(qkv_in)


def test_qk_norm_rope_int32_positions_and_empty():
    qkv, q, k, positions, rope, qn, kn = rope_case(3, 4, 2, 32, torch.float32, seed=5)
    a = qk_norm_rope(q, k, positions, rope.cos_sin_cache, qn.weight, kn.weight, EPS)
    b = qk_norm_rope(q, k, positions.int(), rope.cos_sin_cache, qn.weight, kn.weight, EPS)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    e = qk_norm_rope(q[:0], k[:0], positions[:0], rope.cos_sin_cache, qn.weight, kn.weight, EPS)
    assert e[0].shape == (0, 4, 32) and e[1].shape == (0, 2, 32)


@pytest.mark.parametrize("cache_fp8", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,hq,hkv,hd,block_size,norm,slot_dtype", [
    (4, 4, 2, 16, 16, True, torch.int32), pytest.param(1, 4, 2, 16, 16, True, torch.int64, marks=SLOW),
    pytest.param(7, 8, 1, 32, 4, False, torch.int32, marks=SLOW),
    pytest.param(33, 4, 2, 64, 16, True, torch.int64, marks=SLOW),
    pytest.param(11, 6, 3, 16, 128, False, torch.int32, marks=SLOW)])
def test_qk_norm_rope_kv_store_equals_store_kvcache_ref(n, hq, hkv, hd, block_size, norm, slot_dtype, dtype,
                                                        cache_fp8):
    """``kv_store`` writes the cache bit for bit as ``store_kvcache_ref`` after the in-place norm + RoPE does
    (k / v strided views of the qkv buffer, int64 or int32 slots, slots -1 skipped, every other cache slot
    untouched, FP8 saturation at +-448), and q / k exactly as without it."""
    g = gen(n * 7 + hd)
    qkv = randn(g, n, (hq + 2 * hkv) * hd, dtype=dtype, scale=2.0)  # [n, (hq + 2 hkv) hd]
    big = torch.tensor([1000.0, -1000.0, 448.0, 460.0]).to(device=DEV, dtype=dtype)  # beyond e4m3's range
    qkv[:, (hq + hkv) * hd:][:, :4] = big  # v
    qkv[:, hq * hd:][:, :4] = big  # k: still out of range after RoPE when not normalised
    positions = torch.randint(0, 4096, (n,), generator=g).to(DEV)
    rope = RotaryEmbedding(hd, 4096, 1e6).to(DEV)
    weights = [(1.0 + 0.3 * torch.randn(hd, generator=g)).to(device=DEV, dtype=dtype) for _ in range(2)]
    weights = weights if norm else [None, None]
    num_blocks = (2 * n) // block_size + 2
    slots = torch.randperm(num_blocks * block_size, generator=g)[:n]
    slots[1::3] = -1  # prefix-cache hits and padding: not stored
    slots = slots.to(device=DEV, dtype=slot_dtype)
    cache_dtype = torch.float8_e4m3fn if cache_fp8 else dtype
    caches = [torch.full((num_blocks, block_size, hkv, hd), 7.0, device=DEV).to(cache_dtype) for _ in range(2)]

    def views(buf):
        q, k, v = buf.split([hq * hd, hkv * hd, hkv * hd], dim=-1)
        return q.view(n, hq, hd), k.view(n, hkv, hd), v.view(n, hkv, hd)

    ref_buf, ref_caches = qkv.clone(), [c.clone() for c in caches]
    rq, rk, rv = views(ref_buf)
    qk_norm_rope(rq, rk, positions, rope.cos_sin_cache, *weights, eps=EPS, inplace=True)
    store_kvcache_ref(rk, rv, *ref_caches, slots)

    q, k, v = views(qkv)
    assert n == 1 or k.stride(0) == v.stride(0) == (hq + 2 * hkv) * hd  # rows of the qkv buffer
    qk_norm_rope(q, k, positions, rope.cos_sin_cache, *weights, eps=EPS, inplace=True, kv_store=(v, *caches, slots))
    assert torch.equal(qkv, ref_buf)
    for got, want in zip(caches, ref_caches):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    written = (caches[0].float() != 7.0).flatten(2).any(-1).sum().item()  # (block, offset) slots written
    assert 0 < written <= (slots >= 0).sum().item()


def test_qk_norm_rope_kv_store_all_skipped_and_empty():
    """Every slot -1, or no tokens at all: the cache is not touched."""
    qkv, q, k, positions, rope, qn, kn = rope_case(3, 4, 2, 16, torch.float32, seed=9)
    v = qkv[:, 6 * 16:].view(3, 2, 16)
    caches = [torch.zeros(2, 16, 2, 16, device=DEV) for _ in range(2)]
    none = torch.full((3,), -1, dtype=torch.int64, device=DEV)
    qk_norm_rope(q, k, positions, rope.cos_sin_cache, qn.weight, kn.weight, EPS, kv_store=(v.nan_to_num(), *caches,
                                                                                           none))
    qk_norm_rope(q[:0], k[:0], positions[:0], rope.cos_sin_cache, qn.weight, kn.weight, EPS,
                 kv_store=(v[:0], *caches, none[:0]))
    assert all(c.abs().sum() == 0 for c in caches)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,d", ROWS)
def test_silu_and_mul(n, d, dtype, poison):
    g = gen(n * 1000 + d + 2)
    x = randn(g, n, 2 * d, dtype=dtype, scale=3.0)  # [n, 2d]
    out = silu_and_mul(x)  # [n, d]
    check(out, SiluAndMul()(x), SiluAndMul()(x.float()), dtype)
    wide = randn(g, n, 2 * d + 16, dtype=dtype, scale=3.0)  # [n, 2d + 16]
    xv = wide[:, :2 * d]  # [n, 2d], row stride 2d + 16
    check(silu_and_mul(xv), SiluAndMul()(xv), SiluAndMul()(xv.float()), dtype)
    assert silu_and_mul(x[:0]).shape == (0, d)
