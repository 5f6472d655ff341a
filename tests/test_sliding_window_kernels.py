"""Sliding-window attention in the kernels: the torch reference against transformers' mask rule, the CPU
backend's batched decode against it, and the Triton prefill / chunked-prefill and decode (unified and split-KV)
kernels against it in the interpreter.

Windows: smaller than a block, equal to one, spanning several, and longer than any context. Besides the poison
of ``tests/test_triton_kernels.py`` (NaN in every slot that holds no key), the keys of key tiles wholly before
every query's window are NaN too, so a kernel that reads a tile it should skip fails.
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("triton")

from minivllm.kernels.paged_attention import paged_attention  # noqa: E402
from minivllm.kernels.paged_decode import paged_decode, paged_decode_split_kv  # noqa: E402
from minivllm.kernels.torch_backend import paged_attention_ref, paged_decode_torch  # noqa: E402
from tests.test_triton_kernels import make_batch  # noqa: E402

BLOCK_SIZE = 16
WINDOWS = {"below_block": 5, "one_block": 16, "spans_blocks": 37, "past_context": 500}
TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}
# (q_len, context_len): decode rows, chunks over a cached prefix, fresh prefills, an empty row
ROWS = [(1, 70), (9, 40), (20, 20), (13, 64), (0, 5), (1, 3), (30, 45)]


def _poison_outside_windows(k_cache, v_cache, cu, ctx, block_tables, window: int, block_n: int) -> None:
    """NaN in every key a kernel with key tiles of ``block_n`` must not read: those of the tiles that end before
    the first query's window of each row."""
    for b, c in enumerate(ctx.tolist()):
        q_len = int(cu[b + 1] - cu[b])
        if q_len == 0:
            continue
        skipped = max(0, c - q_len + 1 - window) // block_n * block_n
        for pos in range(skipped):
            blk = int(block_tables[b, pos // BLOCK_SIZE])
            k_cache[blk, pos % BLOCK_SIZE] = float("nan")
            v_cache[blk, pos % BLOCK_SIZE] = float("nan")


def _close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    assert not out.isnan().any(), "NaN in the output: an unwritten element, or a key outside the window was read"
    torch.testing.assert_close(out.float().cpu(), ref.float().cpu(), **TOL[dtype])


def _dense_reference(q, k, v, q_pos, window, scale):
    """Attention over contiguous keys with transformers' own sliding-window causal mask function."""
    from transformers.masking_utils import sliding_window_causal_mask_function

    allowed = sliding_window_causal_mask_function(window)
    zero = torch.tensor(0)
    mask = allowed(zero, zero, torch.tensor(q_pos)[:, None], torch.arange(k.shape[0])[None, :])  # [q_len, ctx]
    s = torch.einsum("qhd,khd->hqk", q.double(), k.double()) * scale  # [heads, q_len, ctx]
    s = s.masked_fill(~mask, float("-inf"))
    return torch.einsum("hqk,khd->qhd", s.softmax(-1), v.double())  # [q_len, heads, head_dim]


@pytest.mark.parametrize("window", WINDOWS.values(), ids=WINDOWS.keys())
def test_reference_follows_transformers_mask(window):
    """paged_attention_ref with a window = dense attention under transformers' ``sliding_window_overlay``."""
    q, kc, vc, cu, ctx, bt = make_batch([(12, 50), (1, 33)], 2, 2, 16, BLOCK_SIZE, torch.float32, seed=window)
    out = paged_attention_ref(q, kc, vc, cu, ctx, bt, 0.25, window)
    for b, (start, c) in enumerate([(0, 50), (12, 33)]):
        end = int(cu[b + 1])
        n_blocks = math.ceil(c / BLOCK_SIZE)
        k = kc[bt[b, :n_blocks].long()].reshape(-1, 2, 16)[:c]
        v = vc[bt[b, :n_blocks].long()].reshape(-1, 2, 16)[:c]
        q_pos = list(range(c - (end - start), c))
        want = _dense_reference(q[start:end], k, v, q_pos, window, 0.25)
        torch.testing.assert_close(out[start:end].double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", WINDOWS.values(), ids=WINDOWS.keys())
def test_batched_torch_decode_with_window(window, dtype):
    rows = [(1, c) for c in (1, 5, 16, 17, 40, 70)]
    q, kc, vc, cu, ctx, bt = make_batch(rows, 8, 2, 16, BLOCK_SIZE, dtype, seed=window + 1)
    kc, vc = kc.nan_to_num(0.0), vc.nan_to_num(0.0)  # the batched path reads whole blocks, masked
    ref = paged_attention_ref(q, kc, vc, cu, ctx, bt, 0.25, window)
    got = paged_decode_torch(q, kc, vc, ctx.tolist(), bt, 0.25, window)
    _close(got, ref, dtype)


def _case(dtype, window_name, fast):
    marks = () if fast else pytest.mark.slow
    return pytest.param(dtype, WINDOWS[window_name], marks=marks, id=f"{window_name}-{str(dtype)[6:]}")


# every window in float32 and two in bfloat16 in the fast tier; the other bfloat16 ones in the slow tier
KERNEL_GRID = [_case(torch.float32, w, True) for w in WINDOWS] + [
    _case(torch.bfloat16, w, w in ("below_block", "spans_blocks")) for w in WINDOWS]


@pytest.mark.triton
@pytest.mark.parametrize("dtype,window", KERNEL_GRID)
def test_paged_attention_window(dtype, window):
    """Prefill chunks over a cached prefix, fresh prefills and decode rows in one launch, GQA 4:1; 16-key tiles so
    the window's edge falls inside, on and across tiles and blocks."""
    q, kc, vc, cu, ctx, bt = make_batch(ROWS, 8, 2, 32, BLOCK_SIZE, dtype, seed=window, fused_q=True)
    _poison_outside_windows(kc, vc, cu, ctx, bt, window, block_n=16)
    ref = paged_attention_ref(q, kc, vc, cu, ctx, bt, 32**-0.5, window)
    out = torch.full_like(q, float("nan"))
    paged_attention(q, kc, vc, cu, ctx, bt, 32**-0.5, 30, 70, out=out, sliding_window=window,
                    block_m=32, block_n=16)
    _close(out, ref, dtype)


@pytest.mark.triton
@pytest.mark.parametrize("dtype,window", KERNEL_GRID)
def test_unified_decode_window(dtype, window):
    rows = [(1, c) for c in (1, 5, 16, 17, 33, 47, 80)]
    q, kc, vc, cu, ctx, bt = make_batch(rows, 4, 2, 16, BLOCK_SIZE, dtype, seed=window + 2)
    _poison_outside_windows(kc, vc, cu, ctx, bt, window, block_n=16)
    ref = paged_attention_ref(q, kc, vc, cu, ctx, bt, 0.25, window)
    out = torch.full_like(q, float("nan"))
    paged_attention(q, kc, vc, None, ctx, bt, 0.25, 1, 80, out=out, sliding_window=window, block_n=16)
    _close(out, ref, dtype)


@pytest.mark.triton
@pytest.mark.parametrize("num_splits", [2, 3])
@pytest.mark.parametrize("dtype,window", KERNEL_GRID)
def test_split_kv_decode_window(dtype, window, num_splits):
    """The splits share the window's key tiles (not the whole context's); some splits may be empty."""
    rows = [(1, c) for c in (1, 5, 16, 17, 33, 47, 80)]
    q, kc, vc, cu, ctx, bt = make_batch(rows, 4, 1, 16, BLOCK_SIZE, dtype, seed=window + num_splits)
    _poison_outside_windows(kc, vc, cu, ctx, bt, window, block_n=16)
    ref = paged_attention_ref(q, kc, vc, cu, ctx, bt, 0.25, window)
    out = torch.full_like(q, float("nan"))
    paged_decode_split_kv(q, kc, vc, ctx, bt, 0.25, 80, num_splits=num_splits, out=out, sliding_window=window,
                          block_n=16)
    _close(out, ref, dtype)


@pytest.mark.triton
def test_paged_decode_dispatch_with_window():
    """A long ``max_context_len`` with a short window stays on the unified kernel (nothing to split), a long
    window splits; both give the reference."""
    rows = [(1, c) for c in (3, 40, 90)]
    q, kc, vc, cu, ctx, bt = make_batch(rows, 4, 2, 16, BLOCK_SIZE, torch.float32, seed=9)
    for window in (37, 500):
        ref = paged_attention_ref(q, kc, vc, cu, ctx, bt, 0.25, window)
        out = torch.full_like(q, float("nan"))
        paged_decode(q, kc, vc, ctx, bt, 0.25, 4096, out=out, sliding_window=window)
        _close(out, ref, torch.float32)


def test_bad_window_is_a_clear_error():
    from minivllm.layers.attention import Attention

    with pytest.raises(ValueError, match="sliding_window"):
        Attention(4, 16, 0.25, 2, sliding_window=0)
