"""The fused MoE Triton kernels (``minivllm.kernels.fused_moe``, ``moe_topk``, ``moe_align``) against plain
references (tests/helpers/moe_reference.py) in Triton's interpreter on the CPU, so shapes are small: the routing,
the alignment exactly, and the layer on both paths (grouped GEMMs, decode GEMVs) over expert counts, top-k,
batch sizes and uneven loads with empty experts. The full grid at real shapes is tests/gpu/test_fused_moe_gpu.py.

Tolerances: float32 to 1e-5 of the output's largest magnitude against float64 math (float32 accumulation);
bfloat16 (the activations and each pick's product rounded to bfloat16 once, as the kernels store them) to a
relative error of 5e-3 and 1.5e-2 of the largest magnitude element-wise. The interpreter's float32 -> bfloat16
and -> e4m3 casts are made to round as a GPU's (``gpu_rounding``). FP8 experts: against their dequantized
weights, the grouped path's activations through the same per-token (group) e4m3 quantizer as the kernels'.
"""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("triton")

from minivllm.kernels import fused_moe_config  # noqa: E402
from minivllm.kernels.fused_moe import fused_moe_triton, select_experts_triton  # noqa: E402
from minivllm.kernels.moe_align import max_padded_len, moe_align_block_size  # noqa: E402
from minivllm.kernels.moe_fp8_weights import quantize_moe_weights_fp8  # noqa: E402
from tests.helpers.kernel_checks import gpu_rounding_in_interpreter, rel_err  # noqa: E402
from tests.helpers.moe_reference import (  # noqa: E402
    align_naive,
    fused_moe_fp8_naive,
    fused_moe_naive,
    moe_weights,
    select_experts_naive,
    uneven_routing,
)

pytestmark = pytest.mark.triton
DEV = "cuda" if torch.cuda.is_available() else "cpu"
HIDDEN, INTER = 64, 32
SMALL_TILES = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 16, "GROUP_SIZE_M": 2, "num_warps": 4,
               "num_stages": 2}


@pytest.fixture
def gpu_rounding(monkeypatch):
    return gpu_rounding_in_interpreter(monkeypatch)


def check_moe(m, num_experts, top_k, dtype, decode, hidden=HIDDEN, inter=INTER, config=None, seed=0):
    w13, w2 = moe_weights(num_experts, hidden, inter, dtype, seed=seed, device=DEV)
    x = torch.randn(m, hidden, generator=torch.Generator().manual_seed(seed + m)).to(DEV, dtype)
    weights, ids = uneven_routing(m, num_experts, top_k, seed=seed + m, device=DEV)
    out = fused_moe_triton(x, w13, w2, weights, ids, config=config, decode=decode)
    ref = fused_moe_naive(x.cpu(), w13.cpu(), w2.cpu(), weights.cpu(), ids.cpu())
    assert out.shape == (m, hidden) and out.dtype == dtype
    assert_close_to(out, ref, dtype)


def assert_close_to(out, ref, dtype):
    """float32: within 1e-5 of the largest magnitude; bfloat16: relative error 5e-3, 1.5e-2 element-wise."""
    scale = ref.abs().max().item()
    if dtype == torch.float32:
        torch.testing.assert_close(out.cpu().double(), ref, rtol=0, atol=1e-5 * scale)
    else:
        assert rel_err(out.cpu(), ref) < 5e-3
        torch.testing.assert_close(out.cpu().double(), ref, rtol=0, atol=1.5e-2 * scale)


# ------------------------------------------------------------------ routing


@pytest.mark.parametrize("n, num_experts, top_k, renormalize", [
    (5, 8, 2, True), (3, 128, 8, True), (4, 64, 8, False), (2, 60, 3, True), (1, 8, 8, False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_select_experts_equals_the_reference(n, num_experts, top_k, renormalize, dtype):
    g = torch.Generator().manual_seed(num_experts + top_k)
    logits = (torch.randn(n, num_experts, generator=g) * 3).to(DEV, dtype)
    weights, ids = select_experts_triton(logits, top_k, renormalize)
    ref_w, ref_ids = select_experts_naive(logits.cpu(), top_k, renormalize)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32 and ids.shape == (n, top_k)
    assert torch.equal(ids.cpu(), ref_ids)
    torch.testing.assert_close(weights.cpu(), ref_w, rtol=1e-5, atol=1e-6)


def test_select_experts_bad_arguments_and_empty():
    logits = torch.randn(3, 8, device=DEV)
    with pytest.raises(ValueError, match="top_k"):
        select_experts_triton(logits, 9, True)
    with pytest.raises(ValueError, match="router_logits"):
        select_experts_triton(logits[0], 2, True)
    weights, ids = select_experts_triton(logits[:0], 2, True)
    assert weights.shape == ids.shape == (0, 2)


# ------------------------------------------------------------------ alignment


@pytest.mark.parametrize("n, num_experts, top_k, block_m", [
    (1, 8, 2, 16), (7, 8, 2, 16), (33, 64, 8, 16), (100, 128, 8, 32), (300, 8, 2, 64), (50, 128, 2, 16),
    (40, 60, 4, 16), (500, 256, 8, 64)])
def test_moe_align_block_size_is_exact(n, num_experts, top_k, block_m):
    """Each expert's run contiguous, in pair order, padded to the tile; every (token, pick) exactly once."""
    _, ids = uneven_routing(n, num_experts, top_k, seed=n, device=DEV)
    sorted_ids, expert_ids, post_pad = moe_align_block_size(ids, block_m, num_experts)
    want_sorted, want_experts, want_used = align_naive(ids.cpu(), block_m, num_experts)
    assert sorted_ids.tolist() == want_sorted and expert_ids.tolist() == want_experts
    assert post_pad.tolist() == [want_used] and post_pad.device == ids.device
    assert len(want_sorted) == max_padded_len(n * top_k, num_experts, block_m)
    real = sorted_ids[sorted_ids < n * top_k]
    assert sorted(real.tolist()) == list(range(n * top_k))


def test_moe_align_block_size_bad_arguments():
    ids = torch.zeros(2, 2, dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="block_m"):
        moe_align_block_size(ids, 24, 8)
    with pytest.raises(ValueError, match="topk_ids"):
        moe_align_block_size(ids.long(), 16, 8)


# ------------------------------------------------------------------ the layer

FAST = {(1, 8, 2, True), (5, 64, 8, False), (33, 128, 8, False), (2, 128, 8, True)}


def _grid():
    """(M, E, top_k, dtype, decode): a few in the fast tier (float32 and bfloat16), the rest slow."""
    for m in (1, 2, 5, 33, 200):
        for num_experts in (8, 64, 128):
            for top_k in (2, 8):
                for decode in (False, True):
                    if decode and m > 5:  # the decode kernels run a program per pair: slow in the interpreter
                        continue
                    for dtype in (torch.float32, torch.bfloat16):
                        fast = (m, num_experts, top_k, decode) in FAST
                        yield pytest.param(m, num_experts, top_k, dtype, decode,
                                           marks=() if fast else pytest.mark.slow,
                                           id=f"{m}-E{num_experts}-k{top_k}-{str(dtype)[6:]}-"
                                              f"{'decode' if decode else 'grouped'}")


@pytest.mark.parametrize("m, num_experts, top_k, dtype, decode", list(_grid()))
def test_fused_moe_equals_the_reference(m, num_experts, top_k, dtype, decode, gpu_rounding):
    check_moe(m, num_experts, top_k, dtype, decode)


@pytest.mark.parametrize("decode", [False, True])
def test_ragged_shapes_and_small_tiles(decode):
    """H and I not multiples of the tiles, several row / column / K tiles, a GROUP_SIZE_M band."""
    check_moe(3 if decode else 21, 8, 2, torch.float32, decode, hidden=72, inter=40, config=SMALL_TILES)


def test_decode_tiles_override_and_default_path():
    """Explicit decode tiles (several K steps), and the path the batch size picks by itself."""
    check_moe(2, 8, 2, torch.float32, True, hidden=72, inter=40)
    w13, w2 = moe_weights(8, HIDDEN, INTER, torch.float32, device=DEV)
    x = torch.randn(3, HIDDEN).to(DEV)
    weights, ids = uneven_routing(3, 8, 2, device=DEV)
    ref = fused_moe_naive(x.cpu(), w13.cpu(), w2.cpu(), weights.cpu(), ids.cpu())
    for kw in ({}, {"decode": True, "decode_tiles": ((8, 16, 2, 2), (16, 16, 1, 2))}):
        out = fused_moe_triton(x, w13, w2, weights, ids, **kw)
        torch.testing.assert_close(out.cpu().double(), ref, rtol=0, atol=1e-5 * ref.abs().max().item())


def test_all_pairs_on_one_expert():
    """One expert takes every token (a run of many tiles), the others none."""
    w13, w2 = moe_weights(8, HIDDEN, INTER, torch.float32, device=DEV)
    x = torch.randn(40, HIDDEN, generator=torch.Generator().manual_seed(3)).to(DEV)
    ids = torch.stack([torch.full((40,), 5), torch.full((40,), 2)], 1).to(DEV, torch.int32)
    weights = torch.full((40, 2), 0.5, device=DEV)
    out = fused_moe_triton(x, w13, w2, weights, ids, config=SMALL_TILES)
    ref = fused_moe_naive(x.cpu(), w13.cpu(), w2.cpu(), weights.cpu(), ids.cpu())
    torch.testing.assert_close(out.cpu().double(), ref, rtol=0, atol=1e-5 * ref.abs().max().item())


def test_routing_then_layer_with_renormalized_weights():
    """select_experts_triton's output fed to fused_moe_triton, as the layer calls them."""
    w13, w2 = moe_weights(64, HIDDEN, INTER, torch.float32, device=DEV)
    x = torch.randn(9, HIDDEN, generator=torch.Generator().manual_seed(4)).to(DEV)
    logits = torch.randn(9, 64, generator=torch.Generator().manual_seed(5)).to(DEV)
    weights, ids = select_experts_triton(logits, 8, True)
    ref_w, ref_ids = select_experts_naive(logits.cpu(), 8, True)
    out = fused_moe_triton(x, w13, w2, weights, ids)
    ref = fused_moe_naive(x.cpu(), w13.cpu(), w2.cpu(), ref_w, ref_ids)
    torch.testing.assert_close(out.cpu().double(), ref, rtol=0, atol=1e-5 * ref.abs().max().item())


def test_bad_arguments_and_empty_batch():
    w13, w2 = moe_weights(8, HIDDEN, INTER, torch.float32, device=DEV)
    x = torch.randn(3, HIDDEN, device=DEV)
    weights, ids = uneven_routing(3, 8, 2, device=DEV)
    with pytest.raises(ValueError, match="w2"):
        fused_moe_triton(x, w13, w2[:, :, :16], weights, ids)
    with pytest.raises(ValueError, match="topk_ids"):
        fused_moe_triton(x, w13, w2, weights, ids[:2])
    with pytest.raises(ValueError, match="dtype"):
        fused_moe_triton(x.double(), w13, w2, weights, ids)
    with pytest.raises(ValueError, match="BLOCK_SIZE_K"):
        fused_moe_triton(x, w13, w2, weights, ids, config={**SMALL_TILES, "BLOCK_SIZE_K": 24}, decode=False)
    with pytest.raises(ValueError, match="missing"):
        fused_moe_triton(x, w13, w2, weights, ids, config={"BLOCK_SIZE_M": 16}, decode=False)
    with pytest.raises(ValueError, match="contiguous"):
        fused_moe_triton(x, w13.transpose(1, 2).contiguous().transpose(1, 2), w2, weights, ids)
    out = fused_moe_triton(x[:0], w13, w2, weights[:0], ids[:0])
    assert out.shape == (0, HIDDEN)


def test_strided_activations():
    """x as a column-strided view (taken contiguous) and as a row-strided one (read in place)."""
    w13, w2 = moe_weights(8, HIDDEN, INTER, torch.float32, device=DEV)
    wide = torch.randn(6, 2 * HIDDEN, generator=torch.Generator().manual_seed(8)).to(DEV)
    weights, ids = uneven_routing(6, 8, 2, device=DEV)
    for x in (wide[:, :HIDDEN], wide[:, ::2]):
        ref = fused_moe_naive(x.cpu(), w13.cpu(), w2.cpu(), weights.cpu(), ids.cpu())
        out = fused_moe_triton(x, w13, w2, weights, ids, decode=False)
        torch.testing.assert_close(out.cpu().double(), ref, rtol=0, atol=1e-5 * ref.abs().max().item())


# ------------------------------------------------------------------ configs


def test_config_files_nearest_batch_size_and_default(tmp_path):
    table = {"1": {**SMALL_TILES, "BLOCK_SIZE_N": 32}, "64": {**SMALL_TILES, "BLOCK_SIZE_M": 64}}
    name = fused_moe_config.config_file_name(128, 768, "NVIDIA_H200")
    assert name == "E=128,N=768,device_name=NVIDIA_H200.json"
    (tmp_path / name).write_text(json.dumps(table))
    get = fused_moe_config.get_config
    assert get(3, 128, 768, 8, "NVIDIA_H200", directory=tmp_path)["BLOCK_SIZE_N"] == 32
    assert get(40, 128, 768, 8, "NVIDIA_H200", directory=tmp_path)["BLOCK_SIZE_M"] == 64
    assert get(4096, 128, 768, 8, "NVIDIA_H200", directory=tmp_path)["BLOCK_SIZE_M"] == 64
    # another device, another shape, FP8, or no CUDA: the default
    default = fused_moe_config.default_config(3, 128, 8)
    assert get(3, 128, 768, 8, "NVIDIA_H100_80GB_HBM3", directory=tmp_path) == default
    assert get(3, 128, 768, 8, "NVIDIA_H200", fp8=True, directory=tmp_path) == default
    assert get(3, 128, 768, 8, None, directory=tmp_path) == default
    bad = tmp_path / fused_moe_config.config_file_name(8, 14336, "X")
    bad.write_text(json.dumps({"16": {"BLOCK_SIZE_M": 16}}))
    with pytest.raises(ValueError, match="missing"):
        get(16, 8, 14336, 2, "X", directory=tmp_path)
    assert [fused_moe_config.default_config(m, 128, 8)["BLOCK_SIZE_M"] for m in (1, 256, 512, 4096)] == [16, 16,
                                                                                                        32, 64]



def test_decode_files_tiles_and_path_bound(tmp_path):
    """The tuned decode file gives the nearest batch size's tiles and moves the decode/grouped bound to its
    largest batch size; with no file, the default tiles and ``DECODE_MAX_PAIRS``."""
    name = fused_moe_config.decode_file_name(128, 768, 2048, 8, "NVIDIA_H200")
    assert name == "E=128,N=768,H=2048,top_k=8,device_name=NVIDIA_H200,decode.json"
    (tmp_path / name).write_text(json.dumps({"1": [[2, 512, 3, 4], [4, 256, 4, 2, 2]],
                                             "4": [[8, 256, 4, 4], [8, 128, 2, 4]]}))
    args = (128, 768, 2048, 8, "NVIDIA_H200")
    assert fused_moe_config.decode_config(1, *args, directory=tmp_path) == ((2, 512, 3, 4), (4, 256, 4, 2, 2))
    assert fused_moe_config.decode_config(3, *args, directory=tmp_path) == ((8, 256, 4, 4), (8, 128, 2, 4))
    assert [fused_moe_config.use_decode(m, *args, directory=tmp_path) for m in (0, 1, 4, 5)] == [False, True,
                                                                                               True, False]
    # no file (another device, FP8, no CUDA): pairs up to DECODE_MAX_PAIRS, the default tiles, all picks summed
    assert [fused_moe_config.use_decode(m, 128, 768, 2048, 8, None) for m in (1, 2, 3)] == [True, True, False]
    gate_up, down = fused_moe_config.decode_config(1, *args, fp8=True, directory=tmp_path)
    assert len(gate_up) == 4 and down[4] == 8
    (tmp_path / fused_moe_config.decode_file_name(8, 64, 64, 2, "X")).write_text(json.dumps({"1": [[4, 64, 2, 2],
                                                                                               [4, 64, 2, 2, 3]]}))
    with pytest.raises(ValueError, match="picks must divide top_k=2"):
        fused_moe_config.decode_config(1, 8, 64, 64, 2, "X", directory=tmp_path)


@pytest.mark.parametrize("tiles, match", [
    (((4, 64, 2, 2), (4, 64, 2)), "optional picks"),
    (((3, 64, 2, 2), (4, 64, 2, 2)), "powers of two"),
    (((4, 8, 2, 2), (4, 64, 2, 2)), "at least 16"),
    (((4, 64, 2, 2), (4, 64, 2, 2, 3)), "picks must divide"),
    ("4x64", "two tuples"),
])
def test_bad_decode_tiles_are_named(tiles, match):
    w13, w2 = moe_weights(8, HIDDEN, INTER, torch.float32, device=DEV)
    weights, ids = uneven_routing(1, 8, 2, device=DEV)
    with pytest.raises(ValueError, match=match):
        fused_moe_triton(torch.randn(1, HIDDEN).to(DEV), w13, w2, weights, ids, decode=True, decode_tiles=tiles)


@pytest.mark.parametrize("m, top_k, picks", [(1, 8, 1), (2, 8, 2), (1, 8, 4), (3, 2, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_down_split_over_picks(m, top_k, picks, dtype, gpu_rounding):
    """The down kernel with a token's picks split over program groups, their partial rows summed after."""
    w13, w2 = moe_weights(16, HIDDEN, INTER, dtype, device=DEV)
    x = torch.randn(m, HIDDEN, generator=torch.Generator().manual_seed(m)).to(DEV, dtype)
    weights, ids = uneven_routing(m, 16, top_k, seed=m, device=DEV)
    out = fused_moe_triton(x, w13, w2, weights, ids, decode=True,
                           decode_tiles=((8, 32, 2, 2), (16, 32, 2, 2, picks)))
    assert_close_to(out, fused_moe_naive(x.cpu(), w13.cpu(), w2.cpu(), weights.cpu(), ids.cpu()), dtype)



# ------------------------------------------------------------------ FP8 experts


def check_fp8(m, num_experts, top_k, dtype, decode, block, hidden=HIDDEN, inter=INTER, config=None, seed=0,
              decode_tiles=None):
    """FP8 experts against the dequantized weights in float64 (with the activations through the same e4m3
    quantizer on the grouped W8A8 path, the interpreter's casts rounding as the GPU's), to the tolerances above."""
    w13, w2 = moe_weights(num_experts, hidden, inter, torch.float32, seed=seed)
    q13, s13, q2, s2 = (t.to(DEV) for t in quantize_moe_weights_fp8(w13, w2, block))
    x = torch.randn(m, hidden, generator=torch.Generator().manual_seed(seed + m)).to(DEV, dtype)
    weights, ids = uneven_routing(m, num_experts, top_k, seed=seed + m, device=DEV)
    out = fused_moe_triton(x, q13, q2, weights, ids, config=config, w13_scale=s13, w2_scale=s2, block_shape=block,
                           decode=decode, decode_tiles=decode_tiles)
    ref = fused_moe_fp8_naive(x.cpu(), q13.cpu(), s13.cpu(), q2.cpu(), s2.cpu(), block, weights.cpu(), ids.cpu(),
                              quantize_acts=not decode)
    assert out.shape == (m, hidden) and out.dtype == dtype
    assert_close_to(out, ref, dtype)


FP8_FAST = {(33, 64, 8, False, "block"), (1, 8, 2, True, "channel")}


def _fp8_grid():
    for m in (1, 2, 5, 33, 130):
        for num_experts, top_k in ((8, 2), (64, 8), (128, 8)):
            for decode in (False, True):
                if decode and m > 5:
                    continue
                for kind in ("block", "channel"):
                    for dtype in (torch.float32, torch.bfloat16):
                        fast = (m, num_experts, top_k, decode, kind) in FP8_FAST and dtype == torch.bfloat16
                        yield pytest.param(m, num_experts, top_k, dtype, decode, kind,
                                           marks=() if fast else pytest.mark.slow,
                                           id=f"{m}-E{num_experts}-k{top_k}-{str(dtype)[6:]}-{kind}-"
                                              f"{'decode' if decode else 'grouped'}")


@pytest.mark.parametrize("m, num_experts, top_k, dtype, decode, kind", list(_fp8_grid()))
def test_fp8_experts_equal_the_reference(m, num_experts, top_k, dtype, decode, kind, gpu_rounding):
    check_fp8(m, num_experts, top_k, dtype, decode, (32, 32) if kind == "block" else None)


@pytest.mark.parametrize("decode", [False, True])
def test_fp8_ragged_blocks_and_small_tiles(decode, gpu_rounding):
    """I and H not multiples of the scale block (the gate's last block partial), K tiles smaller than a block."""
    check_fp8(3 if decode else 21, 8, 2, torch.float32, decode, (32, 32), hidden=72, inter=40, config=SMALL_TILES)


@pytest.mark.parametrize("kind", ["block", "channel"])
def test_fp8_decode_down_split_over_picks(kind, gpu_rounding):
    """FP8 experts on the decode path with the down kernel's picks split in groups of two."""
    check_fp8(2, 16, 8, torch.bfloat16, True, (32, 32) if kind == "block" else None,
              decode_tiles=((8, 32, 2, 2), (16, 32, 2, 2, 2)))


def test_fp8_bad_scales():
    w13, w2 = moe_weights(8, HIDDEN, INTER, torch.float32)
    q13, s13, q2, s2 = quantize_moe_weights_fp8(w13, w2, (32, 32))
    x = torch.randn(3, HIDDEN)
    weights, ids = uneven_routing(3, 8, 2)
    with pytest.raises(ValueError, match="w13_scale"):
        fused_moe_triton(x, q13, q2, weights, ids, w2_scale=s2, block_shape=(32, 32))
    with pytest.raises(ValueError, match="w2_scale"):
        fused_moe_triton(x, q13, q2, weights, ids, w13_scale=s13, w2_scale=s2[:, :1], block_shape=(32, 32))
    with pytest.raises(ValueError, match="block_shape None"):
        fused_moe_triton(x, q13, q2, weights, ids, w13_scale=s13, w2_scale=s2)
    with pytest.raises(ValueError, match="float8"):
        fused_moe_triton(x, q13, w2, weights, ids, w13_scale=s13, w2_scale=s2, block_shape=(32, 32))
    with pytest.raises(ValueError, match="go with float8"):
        fused_moe_triton(x, w13, w2, weights, ids, w13_scale=s13)


@pytest.mark.parametrize("block", [(128, 128), (32, 32), None])
def test_moe_weight_quantizer_equals_the_per_expert_reference(block):
    """quantize_moe_weights_fp8 is quantize_weight_fp8_ref on each expert's gate, up and down weights apart."""
    from minivllm.kernels.torch_backend import quantize_weight_fp8_ref

    w13, w2 = moe_weights(3, 72, 40, torch.bfloat16)
    q13, s13, q2, s2 = quantize_moe_weights_fp8(w13, w2, block)
    assert q13.dtype == q2.dtype == torch.float8_e4m3fn and s13.dtype == s2.dtype == torch.float32
    for e in range(3):
        parts = [quantize_weight_fp8_ref(w, block) for w in (w13[e, :40], w13[e, 40:], w2[e])]
        assert torch.equal(q13[e].float(), torch.cat([parts[0][0], parts[1][0]]).float())
        assert torch.equal(s13[e], torch.cat([parts[0][1], parts[1][1]]))
        assert torch.equal(q2[e].float(), parts[2][0].float()) and torch.equal(s2[e], parts[2][1])
