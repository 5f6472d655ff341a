"""gpt-oss's experts in the fused MoE Triton kernels (biases on gate/up and down, the clamped SwiGLU) against the
torch path (``kernels/moe_torch.fused_moe``, itself checked against transformers in tests/test_gpt_oss.py) in
float64, in Triton's interpreter: the grouped GEMMs and the decode GEMVs (with the down kernel's picks split
over programs), float32 and bfloat16, inputs scaled so that both clamps bite. Tolerances as
tests/test_fused_moe.py's; the GPU tier is tests/gpu/test_fused_moe_gpu.py.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from minivllm.kernels.fused_moe import fused_moe_triton, moe_epilogue  # noqa: E402
from minivllm.kernels.moe_torch import fused_moe  # noqa: E402
from tests.helpers.kernel_checks import gpu_rounding_in_interpreter  # noqa: E402
from tests.helpers.moe_reference import moe_weights, uneven_routing  # noqa: E402
from tests.test_fused_moe import HIDDEN, INTER, SMALL_TILES, assert_close_to  # noqa: E402

pytestmark = pytest.mark.triton
DEV = "cuda" if torch.cuda.is_available() else "cpu"
GPT_OSS = dict(activation="swigluoai", swiglu_alpha=1.702, swiglu_limit=7.0)


@pytest.fixture
def gpu_rounding(monkeypatch):
    return gpu_rounding_in_interpreter(monkeypatch)


def gpt_oss_experts(num_experts: int, dtype: torch.dtype, seed: int = 0):
    """``(w13, w2, w13_bias, w2_bias)`` whose gate/up projections of unit-size inputs reach past the clamp."""
    w13, w2 = moe_weights(num_experts, HIDDEN, INTER, torch.float32, seed=seed)
    g = torch.Generator().manual_seed(seed + 100)
    b13, b2 = torch.randn(num_experts, 2 * INTER, generator=g), torch.randn(num_experts, HIDDEN, generator=g)
    return [t.to(DEV, dtype) for t in (w13 * 4.0, w2, b13 * 2.0, b2)]


def check_gpt_oss_moe(m: int, num_experts: int, top_k: int, dtype: torch.dtype, decode: bool, **kw) -> None:
    w13, w2, b13, b2 = gpt_oss_experts(num_experts, dtype, seed=m + top_k)
    x = torch.randn(m, HIDDEN, generator=torch.Generator().manual_seed(m)).to(DEV, dtype)
    weights, ids = uneven_routing(m, num_experts, top_k, seed=m, device=DEV)
    out = fused_moe_triton(x, w13, w2, weights, ids, decode=decode, w13_bias=b13, w2_bias=b2, **GPT_OSS, **kw)
    ref = fused_moe(*(t.cpu().double() for t in (x, w13, w2)), weights.cpu(), ids.cpu(), w13_bias=b13.cpu().double(),
                    w2_bias=b2.cpu().double(), **GPT_OSS)
    gate_up = torch.einsum("nh,eih->eni", x.cpu().double(), w13.cpu().double()) + b13.cpu().double()[:, None]
    assert (gate_up[..., :INTER] > 7.0).any() and (gate_up[..., INTER:].abs() > 7.0).any()  # both clamps bite
    assert out.shape == (m, HIDDEN) and out.dtype == dtype
    assert_close_to(out, ref, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m, num_experts, top_k, decode", [(21, 8, 2, False), (5, 16, 4, False), (3, 8, 2, True),
                                                            (1, 16, 4, True)])
def test_gpt_oss_experts_equal_the_torch_path(m, num_experts, top_k, decode, dtype, gpu_rounding):
    check_gpt_oss_moe(m, num_experts, top_k, dtype, decode)


def test_gpt_oss_experts_small_tiles_and_split_picks(gpu_rounding):
    """Several row / column / K tiles in the grouped GEMMs; the decode down kernel's picks split over programs
    (each group adds its own picks' biases)."""
    check_gpt_oss_moe(21, 8, 2, torch.float32, False, config=SMALL_TILES)
    check_gpt_oss_moe(2, 16, 4, torch.float32, True, decode_tiles=((8, 32, 2, 2), (16, 32, 2, 2, 2)))


def test_bad_bias_or_activation_is_a_clear_error():
    w13, w2, b13, b2 = gpt_oss_experts(4, torch.float32)
    x = torch.randn(2, HIDDEN).to(DEV)
    weights, ids = uneven_routing(2, 4, 2, device=DEV)
    with pytest.raises(ValueError, match="expert bias"):
        fused_moe_triton(x, w13, w2, weights, ids, w13_bias=b13[:, :-1], w2_bias=b2)
    with pytest.raises(ValueError, match="activation"):
        moe_epilogue(None, (4, 8), "gelu")
