"""Attention sinks (gpt-oss: one learned logit per head in the softmax denominator) in the kernels: the torch
reference against transformers' own gpt-oss eager attention, the CPU backend's batched decode against the
reference, and the Triton prefill / chunked-prefill and decode (unified and split-KV) kernels against it in the
interpreter, with and without a sliding window. Sink logits are drawn around the scores' scale so that they
neither vanish nor dominate.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

pytest.importorskip("triton")

from minivllm.kernels.paged_attention import paged_attention  # noqa: E402
from minivllm.kernels.paged_decode import paged_decode, paged_decode_split_kv  # noqa: E402
from minivllm.kernels.torch_backend import paged_attention_ref, paged_decode_torch  # noqa: E402
from tests.test_triton_kernels import make_batch  # noqa: E402

BLOCK_SIZE = 16
TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}
# (q_len, context_len): decode rows, chunks over a cached prefix, fresh prefills, an empty row
ROWS = [(1, 70), (9, 40), (20, 20), (13, 64), (0, 5), (1, 3), (30, 45)]
DECODE_ROWS = [(1, c) for c in (1, 5, 16, 17, 33, 47, 80)]


def _sinks(num_heads: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(num_heads, generator=gen) * 2.0).to(dtype)


def _close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    assert not out.isnan().any(), "NaN in the output: an unwritten element, or a key outside the window was read"
    torch.testing.assert_close(out.float(), ref.float(), **TOL[dtype])


@pytest.mark.parametrize("window", [None, 7])
def test_reference_matches_transformers_gpt_oss_attention(window):
    """paged_attention_ref with sinks = transformers' ``eager_attention_forward`` of gpt-oss (GQA 2:1) on the
    same keys, under a causal (and sliding-window) mask."""
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    q, kc, vc, cu, ctx, bt = make_batch([(12, 50)], 4, 2, 16, BLOCK_SIZE, torch.float32, seed=5)
    sinks = _sinks(4, torch.float32, seed=6)
    out = paged_attention_ref(q, kc, vc, cu, ctx, bt, 0.25, window, sinks)
    k = kc[bt[0, :4].long()].reshape(-1, 2, 16)[:50]  # [ctx, kv_heads, head_dim]
    v = vc[bt[0, :4].long()].reshape(-1, 2, 16)[:50]
    q_pos, k_pos = torch.arange(38, 50)[:, None], torch.arange(50)[None, :]
    allowed = (k_pos <= q_pos) & ((k_pos > q_pos - window) if window else True)  # [12, 50]
    mask = torch.zeros(1, 1, 12, 50).masked_fill(~allowed, float("-inf"))
    module = nn.Module()
    module.num_key_value_groups, module.sinks = 2, nn.Parameter(sinks)
    want, _ = eager_attention_forward(module, q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                      v.transpose(0, 1)[None], mask, scaling=0.25)  # [1, 12, heads, head_dim]
    torch.testing.assert_close(out, want[0], atol=1e-5, rtol=1e-5)


def test_sinks_only_shrink_the_weights():
    """With a sink every query's output is its sink-free output times ``1 - p_sink``: the sink takes part of the
    probability mass and gives no value."""
    q, kc, vc, cu, ctx, bt = make_batch([(1, 30)], 2, 2, 16, BLOCK_SIZE, torch.float32, seed=1)
    sinks = torch.tensor([0.0, 3.0])
    plain = paged_attention_ref(q, kc, vc, cu, ctx, bt, 0.25)
    sunk = paged_attention_ref(q, kc, vc, cu, ctx, bt, 0.25, None, sinks)
    k = kc[bt[0, :2].long()].reshape(-1, 2, 16)[:30]
    scores = torch.einsum("hd,khd->hk", q[0], k) * 0.25  # [heads, ctx]
    p_sink = sinks.exp() / (sinks.exp() + scores.exp().sum(-1))  # [heads]
    torch.testing.assert_close(sunk[0], plain[0] * (1 - p_sink)[:, None], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 5, 37])
def test_batched_torch_decode_with_sinks(window, dtype):
    q, kc, vc, cu, ctx, bt = make_batch(DECODE_ROWS, 8, 2, 16, BLOCK_SIZE, dtype, seed=3)
    kc, vc = kc.nan_to_num(0.0), vc.nan_to_num(0.0)  # the batched path reads whole blocks, masked
    sinks = _sinks(8, dtype, seed=4)
    ref = paged_attention_ref(q, kc, vc, cu, ctx, bt, 0.25, window, sinks)
    got = paged_decode_torch(q, kc, vc, ctx.tolist(), bt, 0.25, window, sinks)
    _close(got, ref, dtype)


GRID = [pytest.param(torch.float32, None, id="full-float32"), pytest.param(torch.float32, 5, id="w5-float32"),
        pytest.param(torch.bfloat16, 37, id="w37-bfloat16"),
        pytest.param(torch.bfloat16, None, id="full-bfloat16", marks=pytest.mark.slow),
        pytest.param(torch.float32, 37, id="w37-float32", marks=pytest.mark.slow)]


@pytest.mark.triton
@pytest.mark.parametrize("dtype,window", GRID)
def test_paged_attention_with_sinks(dtype, window):
    """Prefill chunks over a cached prefix, fresh prefills and decode rows in one launch, GQA 4:1 (the group
    padded in M: padded heads read no sink)."""
    q, kc, vc, cu, ctx, bt = make_batch(ROWS, 8, 2, 32, BLOCK_SIZE, dtype, seed=11, fused_q=True)
    sinks = _sinks(8, dtype, seed=12)
    ref = paged_attention_ref(q, kc, vc, cu, ctx, bt, 32**-0.5, window, sinks)
    out = torch.full_like(q, float("nan"))
    paged_attention(q, kc, vc, cu, ctx, bt, 32**-0.5, 30, 70, out=out, sliding_window=window, sinks=sinks,
                    block_m=32, block_n=16)
    _close(out, ref, dtype)


@pytest.mark.triton
@pytest.mark.parametrize("dtype,window", GRID[:3])
def test_unified_decode_with_sinks(dtype, window):
    q, kc, vc, cu, ctx, bt = make_batch(DECODE_ROWS, 6, 2, 16, BLOCK_SIZE, dtype, seed=13)
    sinks = _sinks(6, dtype, seed=14)
    ref = paged_attention_ref(q, kc, vc, cu, ctx, bt, 0.25, window, sinks)
    out = torch.full_like(q, float("nan"))
    paged_attention(q, kc, vc, None, ctx, bt, 0.25, 1, 80, out=out, sliding_window=window, sinks=sinks,
                    block_n=16)
    _close(out, ref, dtype)


@pytest.mark.triton
@pytest.mark.parametrize("num_splits", [2, 3])
@pytest.mark.parametrize("dtype,window", GRID[:3])
def test_split_kv_decode_with_sinks(dtype, window, num_splits):
    """The first split counts each head's sink, the reduction carries it; some splits are empty."""
    q, kc, vc, cu, ctx, bt = make_batch(DECODE_ROWS, 4, 1, 16, BLOCK_SIZE, dtype, seed=15 + num_splits)
    sinks = _sinks(4, dtype, seed=16)
    ref = paged_attention_ref(q, kc, vc, cu, ctx, bt, 0.25, window, sinks)
    out = torch.full_like(q, float("nan"))
    paged_decode_split_kv(q, kc, vc, ctx, bt, 0.25, 80, num_splits=num_splits, out=out, sliding_window=window,
                          sinks=sinks, block_n=16)
    _close(out, ref, dtype)


@pytest.mark.triton
def test_paged_decode_dispatch_with_sinks():
    """Both of the dispatcher's paths (a short window: the unified kernel; full attention over a long
    ``max_context_len``: split-KV) give the reference."""
    q, kc, vc, cu, ctx, bt = make_batch([(1, c) for c in (3, 40, 90)], 4, 2, 16, BLOCK_SIZE, torch.float32, seed=9)
    sinks = _sinks(4, torch.float32, seed=10)
    for window in (37, None):
        ref = paged_attention_ref(q, kc, vc, cu, ctx, bt, 0.25, window, sinks)
        out = torch.full_like(q, float("nan"))
        paged_decode(q, kc, vc, ctx, bt, 0.25, 4096, out=out, sliding_window=window, sinks=sinks)
        _close(out, ref, torch.float32)


@pytest.mark.triton
def test_sinks_of_the_wrong_shape_are_a_clear_error():
    q, kc, vc, cu, ctx, bt = make_batch([(1, 3)], 4, 2, 16, BLOCK_SIZE, torch.float32, seed=0)
    with pytest.raises(ValueError, match="sinks"):
        paged_attention(q, kc, vc, None, ctx, bt, 0.25, 1, 3, sinks=torch.zeros(2))
    assert math.isfinite(float(paged_attention(q, kc, vc, None, ctx, bt, 0.25, 1, 3, sinks=torch.zeros(4)).sum()))
