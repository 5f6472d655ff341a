"""MXFP4 experts (issue 40) on the CPU: the format against the spec (the 16-value e2m1 table, the e8m0 scale
2^(s - 127)) and against transformers' gpt-oss dequantizer, the quantizer's rounding and round trip, the torch MoE
path on packed experts, ``Mxfp4MoEMethod`` loading gpt-oss's ``*_blocks`` / ``*_scales`` (gate and up
de-interleaved, each tensor-parallel rank its slice), the checkpoint's ``quantization_config`` and its errors,
a tiny Qwen3-MoE whose experts are stored in MXFP4 against the same model with those experts dequantized, and the
Triton kernels (decode GEMVs and grouped GEMMs) under the interpreter.

Tolerances of the kernels: against the float64 MoE loop over the dequantized experts, float32 within 1e-5 of the
output's largest magnitude, bfloat16 to a relative error of 5e-3 (tests/test_fused_moe.py's)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.config.quantization import Mxfp4Config, fp8_config, mxfp4_config
from minivllm.kernels.moe_torch import fused_moe
from minivllm.kernels.mxfp4 import E2M1_VALUES, dequantize_mxfp4, quantize_mxfp4
from tests.helpers.kernel_checks import gpu_rounding_in_interpreter, rel_err
from tests.helpers.moe_checkpoints import build_moe_checkpoint
from tests.helpers.moe_reference import MOE_TOL, fused_moe_naive, moe_weights, uneven_routing
from tests.helpers.mxfp4_checkpoints import to_gpt_oss_blocks, write_mxfp4_checkpoints

KW = dict(device="cpu", dtype="float32")
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
PROMPTS = [[(7 * i + 3 * j + 1) % 380 for j in range(3 + 9 * i)] for i in range(8)]


def _spec_value(byte: int, high: bool, scale: int) -> float:
    """One value as the OCP MX spec defines it, in Python floats (float64: exact for every case here)."""
    nibble = byte >> 4 if high else byte & 0xF
    sign, exp, mant = nibble >> 3, (nibble >> 1) & 3, nibble & 1
    magnitude = mant * 0.5 if exp == 0 else (1 + mant / 2) * 2.0 ** (exp - 1)
    return (-1) ** sign * magnitude * 2.0 ** (scale - 127)


def _experts(llm: LLM) -> list:
    return [m for m in llm.engine.executor.runner.model.modules() if type(m).__name__ == "FusedMoE"]


def _tokens(llm: LLM, prompts=PROMPTS) -> list[list[int]]:
    return [o["token_ids"] for o in llm.generate(prompts, GREEDY, use_tqdm=False)]


class _Rank:
    """A stand-in tensor-parallel group: only the rank and the size (the loaders read nothing else)."""

    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size


# ------------------------------------------------------------------ the format

def test_dequantize_equals_the_spec_for_every_byte_and_scale():
    """Every byte (both nibbles) at scales 0 (2^-127), 1, 100, 127 (1.0), 128 and 250, exactly; the table the
    module exports is the spec's value of each nibble."""
    assert [_spec_value(n, False, 127) for n in range(16)] == list(E2M1_VALUES)
    scales = [0, 1, 100, 127, 128, 250]
    blocks = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(1, 8, 32).repeat(len(scales), 1, 1)
    blocks = blocks.view(len(scales), 16, 16)  # [N, K/2 = 256 bytes as 16 groups' 16 bytes]
    sc = torch.tensor(scales, dtype=torch.uint8).view(-1, 1).repeat(1, 16)  # [N, K/32]
    got = dequantize_mxfp4(blocks.reshape(len(scales), -1), sc)  # [N, K]
    want = torch.tensor([[_spec_value(int(blocks[r].reshape(-1)[k // 2]), k % 2 == 1, scales[r])
                          for k in range(512)] for r in range(len(scales))], dtype=torch.float64)
    assert got.dtype == torch.float32 and got.shape == (len(scales), 512)
    assert torch.equal(got.double(), want)
    assert torch.equal(dequantize_mxfp4(blocks, sc, torch.bfloat16).double(), want)  # e2m1 x 2^k: exact in bf16


def test_dequantize_equals_transformers_gpt_oss_dequantizer():
    """gpt-oss's layout ([E, N, K/32, 16] blocks, [E, N, K/32] scales) as transformers 5.x dequantizes it
    (``integrations/mxfp4.py``, which returns ``[E, K, N]``): the same values, ours ``[E, N, K]``."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 10, 4, 16), generator=g).to(torch.uint8)
    scales = torch.randint(110, 140, (3, 10, 4), generator=g).to(torch.uint8)
    theirs = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # [E, K, N]
    assert torch.equal(dequantize_mxfp4(blocks, scales), theirs.transpose(1, 2))


def test_quantizer_scale_and_nearest_value():
    """Each group's scale is the smallest power of two with amax / scale <= 6 (amax / scale in (3, 6]); each
    value the nearest e2m1 multiple of it (ties to the even mantissa); an all-zero group gets scale code 0."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(5, 128, generator=g) * torch.logspace(-3, 3, 5).view(-1, 1)  # [N, K], groups of many sizes
    w[0, :32] = 0.0
    w[1, :32] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0,
                              6.0] + [0.0] * 17)  # ties at scale 1 (amax 6)
    blocks, scales = quantize_mxfp4(w)
    assert blocks.shape == (5, 64) and scales.shape == (5, 4) and blocks.dtype == scales.dtype == torch.uint8
    back = dequantize_mxfp4(blocks, scales).double()
    scale = torch.pow(2.0, scales.double() - 127).repeat_interleave(32, 1)  # [N, K]
    amax = w.double().abs().view(5, 4, 32).amax(-1)
    nonzero = amax > 0
    ratio = (amax / torch.pow(2.0, scales.double() - 127))[nonzero]
    assert ((ratio > 3) & (ratio <= 6)).all() and scales[0, 0] == 0
    table = torch.tensor(E2M1_VALUES, dtype=torch.float64)
    nearest = (w.double()[..., None] / scale[..., None] - table).abs().amin(-1)  # [N, K]
    assert torch.allclose((back - w.double()).abs() / scale, nearest, rtol=0, atol=1e-12)
    ties = back[1, :15].tolist()
    assert ties == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -0.0, -1.0, -1.0, -2.0, -2.0, -4.0, -4.0, 6.0]


def test_quantizer_round_trip():
    """Values already e2m1 x 2^k with a 6 in each group come back as the same bytes; anything dequantized comes
    back as the same values (the scale may move with the group's largest code, the values do not)."""
    g = torch.Generator().manual_seed(2)
    codes = torch.randint(0, 16, (6, 64), generator=g)
    codes[:, ::32] = 7  # a 6.0 in each group
    exps = torch.randint(-20, 20, (6, 2), generator=g).repeat_interleave(32, 1)
    w = torch.tensor(E2M1_VALUES)[codes] * torch.pow(2.0, exps.float())
    blocks, scales = quantize_mxfp4(w)
    assert torch.equal(dequantize_mxfp4(blocks, scales), w)
    again, again_s = quantize_mxfp4(dequantize_mxfp4(blocks, scales))
    assert torch.equal(again, blocks) and torch.equal(again_s, scales)
    x = torch.randn(4, 7, 96, generator=g)
    b, s = quantize_mxfp4(x)
    assert torch.equal(dequantize_mxfp4(*quantize_mxfp4(dequantize_mxfp4(b, s))), dequantize_mxfp4(b, s))


def test_format_errors_are_named():
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_mxfp4(torch.randn(2, 48))
    with pytest.raises(ValueError, match="uint8"):
        dequantize_mxfp4(torch.zeros(2, 16), torch.zeros(2, 1, dtype=torch.uint8))
    with pytest.raises(ValueError, match="do not fit scales"):
        dequantize_mxfp4(torch.zeros(2, 16, dtype=torch.uint8), torch.zeros(2, 2, dtype=torch.uint8))


# ------------------------------------------------------------------ the torch path

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n, num_experts, top_k, inter", [(1, 8, 2, 64), (37, 16, 4, 96)])
def test_torch_fused_moe_on_mxfp4_experts_equals_the_dequantized_reference(dtype, n, num_experts, top_k, inter):
    """``fused_moe`` on packed experts = the float64 loop over the dequantized experts, within the dtype's
    tolerance; experts without a token included (uneven routing)."""
    hidden = 64
    w13, w2 = moe_weights(num_experts, hidden, inter, torch.float32, seed=n)
    (b13, s13), (b2, s2) = quantize_mxfp4(w13), quantize_mxfp4(w2)
    x = torch.randn(n, hidden, generator=torch.Generator().manual_seed(n)).to(dtype)
    weights, ids = uneven_routing(n, num_experts, top_k, seed=n)
    got = fused_moe(x, b13, b2, weights, ids, w13_scale=s13, w2_scale=s2)
    want = fused_moe_naive(x, dequantize_mxfp4(b13, s13), dequantize_mxfp4(b2, s2), weights, ids)
    assert got.dtype == dtype and got.shape == (n, hidden)
    assert rel_err(got, want) < MOE_TOL[dtype]


# ------------------------------------------------------------------ loading

def _gpt_oss_tensors(num_experts=3, hidden=64, inter=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    gate, up = (torch.randn(num_experts, inter, hidden, generator=g) for _ in range(2))
    down = torch.randn(num_experts, hidden, inter, generator=g)
    return to_gpt_oss_blocks(gate, up, down)


def _mxfp4_layer(stored, rank, size, num_experts=3, hidden=64, inter=64):
    from minivllm.layers.fused_moe import FusedMoE
    from minivllm.layers.quantization import Mxfp4MoEMethod

    layer = FusedMoE(num_experts, 2, hidden, inter, True, tp_group=_Rank(rank, size))
    Mxfp4MoEMethod(Mxfp4Config()).create_weights(layer)
    for name, target in (("gate_up_proj", "w13"), ("down_proj", "w2")):
        for suffix, ours in (("blocks", "weight"), ("scales", "weight_scale")):
            param = getattr(layer, f"{target}_{ours}")
            param.weight_loader(param, stored[f"{name}_{suffix}"])
    return layer


def test_layer_loads_gpt_oss_blocks_gate_first_and_each_rank_its_slice():
    """TP=1: ``w13`` holds the gate's rows (gpt-oss's even rows), then the up's (odd rows), packed, no float
    copy; TP=2: each rank exactly its slice of TP=1's (gate and up channels; ``down``'s input groups)."""
    stored = _gpt_oss_tensors()
    full = _mxfp4_layer(stored, 0, 1)
    assert {p.dtype for p in full.parameters()} == {torch.uint8}
    assert full.w13_weight.shape == (3, 128, 32) and full.w13_weight_scale.shape == (3, 128, 2)
    assert full.w2_weight.shape == (3, 64, 32) and full.w2_weight_scale.shape == (3, 64, 2)
    gate_up = dequantize_mxfp4(stored["gate_up_proj_blocks"], stored["gate_up_proj_scales"])  # [E, 2I, H]
    w13 = dequantize_mxfp4(full.w13_weight, full.w13_weight_scale)
    assert torch.equal(w13, torch.cat([gate_up[:, ::2], gate_up[:, 1::2]], 1))
    assert torch.equal(dequantize_mxfp4(full.w2_weight, full.w2_weight_scale),
                       dequantize_mxfp4(stored["down_proj_blocks"], stored["down_proj_scales"]))
    for rank in range(2):
        part = _mxfp4_layer(stored, rank, 2)
        rows = torch.cat([torch.arange(o + 32 * rank, o + 32 * (rank + 1)) for o in (0, 64)])
        assert torch.equal(part.w13_weight, full.w13_weight[:, rows])
        assert torch.equal(part.w13_weight_scale, full.w13_weight_scale[:, rows])
        assert torch.equal(part.w2_weight, full.w2_weight[:, :, 16 * rank:16 * (rank + 1)])
        assert torch.equal(part.w2_weight_scale, full.w2_weight_scale[:, :, rank:rank + 1])


def test_moe_model_packs_its_experts_when_built(mxfp4_checkpoints):
    """A Qwen3-MoE built from an MXFP4 config holds packed experts from construction (each layer's float experts
    freed as soon as it is built, so the model never holds them all); the dense layer and the routers are float."""
    import json

    from minivllm.config.hf import arch_from_dict
    from minivllm.models.registry import get_model_class

    cfg = arch_from_dict(json.loads((Path(mxfp4_checkpoints[0]) / "config.json").read_text()))
    model = get_model_class(cfg.architecture)(cfg)
    layers = [m for m in model.modules() if type(m).__name__ == "FusedMoE"]
    assert len(layers) == 2 and all({p.dtype for p in m.parameters()} == {torch.uint8} for m in layers)
    assert model.model.layers[1].mlp.gate_up_proj.weight.dtype == torch.float32


def test_float_experts_are_quantized_after_loading():
    """A layer that loaded float experts (a model that does not pack them when built, with dummy weights):
    ``process_weights_after_loading`` packs them one expert at a time, as ``quantize_mxfp4`` packs them all."""
    from minivllm.layers.fused_moe import FusedMoE
    from minivllm.layers.quantization import Mxfp4MoEMethod

    layer = FusedMoE(4, 2, 64, 32, True)
    w13, w2 = moe_weights(4, 64, 32, torch.float32)
    layer.w13_weight.data.copy_(w13)
    layer.w2_weight.data.copy_(w2)
    Mxfp4MoEMethod(Mxfp4Config()).process_weights_after_loading(layer)
    for w, blocks, scales in ((w13, layer.w13_weight, layer.w13_weight_scale),
                              (w2, layer.w2_weight, layer.w2_weight_scale)):
        want_b, want_s = quantize_mxfp4(w)
        assert torch.equal(blocks, want_b) and torch.equal(scales, want_s)


def test_loading_errors_are_named():
    from minivllm.layers.fused_moe import FusedMoE
    from minivllm.layers.quantization import Mxfp4MoEMethod

    method = Mxfp4MoEMethod(Mxfp4Config())
    with pytest.raises(ValueError, match=r"intermediate size \(16 at tensor_parallel_size 2\)"):
        method.create_weights(FusedMoE(4, 2, 64, 32, True, tp_group=_Rank(0, 2)))
    layer = _mxfp4_layer(_gpt_oss_tensors(), 0, 1)
    stored = _gpt_oss_tensors(inter=96)
    with pytest.raises(ValueError, match=r"blocks of w13 must be \(3, 128, 2, 16\), got \(3, 192, 2, 16\)"):
        layer.w13_weight.weight_loader(layer.w13_weight, stored["gate_up_proj_blocks"])
    with pytest.raises(ValueError, match="whole stacked tensors"):
        layer.w2_weight.weight_loader(layer.w2_weight, torch.zeros(64, 32, dtype=torch.uint8), 0, "down")
    with pytest.raises(ValueError, match="uint8"):
        layer.w2_weight_scale.weight_loader(layer.w2_weight_scale, torch.zeros(3, 64, 2))


def test_checkpoint_quantization_config():
    """``quant_method: mxfp4`` selects MXFP4 experts (and no FP8); an explicit ``quantization`` beside it, and
    experts listed in ``modules_to_not_convert``, are refused; a model without experts is refused at load."""
    from minivllm.layers.quantization import apply_mxfp4

    gpt_oss = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn",
                                                                   "model.layers.*.mlp.router", "lm_head"]}
    assert mxfp4_config(gpt_oss) == Mxfp4Config() and fp8_config(gpt_oss, None) is None
    assert mxfp4_config(None) is None and mxfp4_config({"quant_method": "fp8"}) is None
    with pytest.raises(ValueError, match="quantization='fp8', but the checkpoint is quantized with 'mxfp4'"):
        fp8_config(gpt_oss, "fp8")
    with pytest.raises(ValueError, match="unquantized experts"):
        mxfp4_config({"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.0.mlp.experts"]})
    with pytest.raises(ValueError, match="not supported"):
        fp8_config({"quant_method": "awq"}, None)
    with pytest.raises(ValueError, match="Linear has none"):
        apply_mxfp4(torch.nn.Linear(4, 4), Mxfp4Config(), True)


@pytest.mark.parametrize("mapping", [{}, {".experts.gate_up_proj": ".experts.w13_weight",
                                         ".experts.down_proj": ".experts.w2_weight"}])
def test_loader_maps_gpt_oss_mxfp4_names(mapping):
    """``mlp.experts.{gate_up,down}_proj_{blocks,scales}`` -> the layer's packed weights and scales, whole (no
    shard arguments); also after a model's renames of the bf16 names (gpt-oss's ``checkpoint_substr_mapping``
    turns ``gate_up_proj_blocks`` into ``w13_weight_blocks``)."""
    from minivllm.models.loader import _target

    model = type("M", (torch.nn.Module,), {"checkpoint_substr_mapping": mapping})()
    prefix = "model.layers.3.mlp.experts"
    for name, want in (("gate_up_proj_blocks", "w13_weight"), ("gate_up_proj_scales", "w13_weight_scale"),
                       ("down_proj_blocks", "w2_weight"), ("down_proj_scales", "w2_weight_scale")):
        assert _target(model, f"{prefix}.{name}", {}) == (f"{prefix}.{want}", ())


# ------------------------------------------------------------------ a model with MXFP4 experts

@pytest.fixture(scope="module")
def mxfp4_checkpoints(tiny_moe_model, tmp_path_factory) -> tuple[str, str]:
    """The tiny Qwen3-MoE (H 64, I 32, 8 experts, top-2) with its experts in gpt-oss's MXFP4 layout, and the same
    with those experts dequantized to float32 (its own per-expert layout)."""
    return tuple(str(p) for p in write_mxfp4_checkpoints(tiny_moe_model, tmp_path_factory.mktemp("moe-mxfp4")))


def test_mxfp4_checkpoint_gives_the_dequantized_experts_tokens(mxfp4_checkpoints):
    """8 prompts x 12 greedy tokens on the torch path: the MXFP4 experts (packed in memory, uint8) give exactly
    the tokens of the same model whose checkpoint holds the dequantized experts in float32."""
    mxfp4, dequantized = mxfp4_checkpoints
    with LLM(mxfp4, **KW) as llm:
        layers = _experts(llm)
        assert len(layers) == 2 and all({p.dtype for p in m.parameters()} == {torch.uint8} for m in layers)
        attn = llm.engine.executor.runner.model.model.layers[0].self_attn.qkv_proj.weight
        assert attn.dtype == torch.float32
        got = _tokens(llm)
    with LLM(dequantized, **KW) as llm:
        want = _tokens(llm)
    assert got == want and all(len(t) == 12 for t in got)


def test_dummy_weights_with_an_mxfp4_config_are_packed(mxfp4_checkpoints):
    """``load_format="dummy"`` (the benchmarks): random e2m1 codes at scale 2^-7 in the packed experts (not all
    one code); generation runs."""
    with LLM(mxfp4_checkpoints[0], load_format="dummy", **KW) as llm:
        for m in _experts(llm):
            assert m.w13_weight.dtype == torch.uint8 and m.w2_weight_scale.shape == (8, 64, 1)
            assert m.w13_weight.unique().numel() > 200 and (m.w2_weight_scale == 120).all()
        assert [len(t) for t in _tokens(llm, PROMPTS[:2])] == [12, 12]


@pytest.mark.slow
def test_tp2_mxfp4_experts_give_tp1s_greedy_tokens(tmp_path):
    """TP=2 over gloo (each rank 32 of the 64 intermediate channels: one group of ``down``'s columns) gives
    TP=1's greedy tokens."""
    src = build_moe_checkpoint(tmp_path / "src", "qwen3_moe", seed=3, moe_intermediate_size=64)
    mxfp4, _ = write_mxfp4_checkpoints(str(src), tmp_path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with LLM(str(mxfp4), **KW) as llm:
            one = _tokens(llm, PROMPTS[:4])
        with LLM(str(mxfp4), tensor_parallel_size=2, **KW) as llm:
            two = _tokens(llm, PROMPTS[:4])
    finally:
        torch.set_num_threads(threads)
    assert two == one


# ------------------------------------------------------------------ the Triton kernels (interpreter)

def _check_triton(m, num_experts, top_k, dtype, decode, hidden=64, inter=64, config=None, decode_tiles=None,
                  seed=0):
    from minivllm.kernels.fused_moe import fused_moe_triton

    w13, w2 = moe_weights(num_experts, hidden, inter, torch.float32, seed=seed)
    (b13, s13), (b2, s2) = quantize_mxfp4(w13), quantize_mxfp4(w2)
    x = torch.randn(m, hidden, generator=torch.Generator().manual_seed(seed + m)).to(dtype)
    weights, ids = uneven_routing(m, num_experts, top_k, seed=seed + m)
    out = fused_moe_triton(x, b13, b2, weights, ids, config=config, w13_scale=s13, w2_scale=s2, decode=decode,
                           decode_tiles=decode_tiles)
    ref = fused_moe_naive(x, dequantize_mxfp4(b13, s13), dequantize_mxfp4(b2, s2), weights, ids)
    assert out.shape == (m, hidden) and out.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(out.double(), ref, rtol=0, atol=1e-5 * ref.abs().max().item())
    else:
        assert rel_err(out, ref) < 5e-3


SMALL_TILES = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 2, "num_warps": 4,
               "num_stages": 1}


@pytest.mark.triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m, num_experts, top_k, decode", [
    (1, 8, 2, True), (3, 16, 4, True), (20, 8, 2, False), (33, 32, 4, False)])
def test_triton_mxfp4_equals_the_dequantized_reference(m, num_experts, top_k, decode, dtype, monkeypatch):
    """Both paths on packed experts (uneven loads, empty experts): the decode GEMVs and the grouped GEMMs."""
    gpu_rounding_in_interpreter(monkeypatch)
    _check_triton(m, num_experts, top_k, dtype, decode, config=None if decode else SMALL_TILES)


@pytest.mark.triton
def test_triton_mxfp4_ragged_tiles_and_split_picks(monkeypatch):
    """I = 96 over 64-row tiles (a partial last tile), K tiles of 128 past H = 96 (masked columns) on the grouped
    path; the decode down kernel's picks split in groups of two; decode K tiles of 16 (raised to one group)."""
    gpu_rounding_in_interpreter(monkeypatch)
    _check_triton(21, 8, 2, torch.float32, False, hidden=96, inter=96, config={**SMALL_TILES, "BLOCK_SIZE_N": 64,
                                                                              "BLOCK_SIZE_K": 128})
    _check_triton(2, 16, 4, torch.bfloat16, True, hidden=96, inter=96,
                  decode_tiles=((64, 128, 1, 4), (32, 64, 1, 4, 2)))
    _check_triton(2, 8, 2, torch.float32, True, decode_tiles=((16, 16, 1, 4), (16, 16, 1, 4)))  # K tiles -> 32


@pytest.mark.triton
def test_triton_mxfp4_bad_scales():
    from minivllm.kernels.fused_moe import fused_moe_triton

    w13, w2 = moe_weights(4, 64, 32, torch.float32)
    (b13, s13), (b2, s2) = quantize_mxfp4(w13), quantize_mxfp4(w2)
    x = torch.randn(2, 64)
    weights, ids = uneven_routing(2, 4, 2)
    with pytest.raises(ValueError, match=r"w2_scale must be uint8 \(4, 64, 1\)"):
        fused_moe_triton(x, b13, b2, weights, ids, w13_scale=s13, w2_scale=s2.float())
    with pytest.raises(ValueError, match="w13_scale must be uint8"):
        fused_moe_triton(x, b13, b2, weights, ids, w2_scale=s2)
    with pytest.raises(ValueError, match="block_shape goes with FP8"):
        fused_moe_triton(x, b13, b2, weights, ids, w13_scale=s13, w2_scale=s2, block_shape=(32, 32))
    assert math.isfinite(fused_moe_triton(x, b13, b2, weights, ids, w13_scale=s13, w2_scale=s2).sum().item())


def test_gpt_oss_layout_helper_interleaves_gate_and_up():
    """The test helper writes gpt-oss's layout: transformers' ``gate_up[..., ::2]`` is the gate (after its
    dequantizer's transpose to ``[E, H, 2I]``)."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    g = torch.Generator().manual_seed(4)
    gate, up, down = torch.randn(2, 32, 64, generator=g), torch.randn(2, 32, 64, generator=g), torch.randn(2, 64, 32)
    stored = to_gpt_oss_blocks(gate, up, down)
    theirs = convert_moe_packed_tensors(stored["gate_up_proj_blocks"], stored["gate_up_proj_scales"],
                                        dtype=torch.float32)  # [E, H, 2I]
    assert torch.equal(theirs[..., ::2].transpose(1, 2), dequantize_mxfp4(*quantize_mxfp4(gate)))
    assert torch.equal(theirs[..., 1::2].transpose(1, 2), dequantize_mxfp4(*quantize_mxfp4(up)))


@pytest.mark.slow
@pytest.mark.triton
def test_triton_branch_of_a_loaded_mxfp4_layer(mxfp4_checkpoints, monkeypatch):
    """attention_backend='triton' under the interpreter: a loaded layer's Triton branch (decode at one row, grouped
    at 24) passes its packed experts and scales to the kernels and equals its torch path."""
    gpu_rounding_in_interpreter(monkeypatch)
    with LLM(mxfp4_checkpoints[0], attention_backend="triton", **KW) as llm:
        layer = _experts(llm)[0]
        assert layer.backend == "triton" and layer.w13_weight.dtype == torch.uint8
        g = torch.Generator().manual_seed(0)
        for n in (1, 24):
            x, logits = torch.randn(n, 64, generator=g), torch.randn(n, 8, generator=g)
            got = layer(x, logits)
            layer.backend = "torch"
            want = layer(x, logits)
            layer.backend = "triton"
            assert rel_err(got, want) < 1e-5, n


def test_gpt_oss_checkpoint_writer(tmp_path):
    """``write_gpt_oss_mxfp4`` on gpt-oss's float layout (``gate_up_proj [E, H, 2I]`` interleaved, ``down_proj
    [E, I, H]``): MXFP4 blocks and scales in the published shapes beside the other tensors, and a reference whose
    experts are transformers' dequantization of them, which an MXFP4 layer loaded from the blocks holds."""
    import json

    from safetensors.torch import load_file, save_file

    from tests.helpers.mxfp4_checkpoints import write_gpt_oss_mxfp4

    g = torch.Generator().manual_seed(5)
    prefix = "model.layers.0.mlp.experts"
    src = tmp_path / "src"
    src.mkdir()
    tensors = {f"{prefix}.gate_up_proj": torch.randn(3, 64, 128, generator=g),
               f"{prefix}.gate_up_proj_bias": torch.randn(3, 128, generator=g),
               f"{prefix}.down_proj": torch.randn(3, 64, 64, generator=g), "lm_head.weight": torch.randn(5, 64)}
    save_file(tensors, src / "model.safetensors")
    (src / "config.json").write_text(json.dumps({"architectures": ["GptOssForCausalLM"]}))
    mxfp4, reference = write_gpt_oss_mxfp4(str(src), tmp_path)
    q, ref = load_file(mxfp4 / "model.safetensors"), load_file(reference / "model.safetensors")
    assert json.loads((mxfp4 / "config.json").read_text())["quantization_config"]["quant_method"] == "mxfp4"
    assert q[f"{prefix}.gate_up_proj_blocks"].shape == (3, 128, 2, 16) and q[f"{prefix}.down_proj_scales"].shape == (
        3, 64, 2)
    assert f"{prefix}.gate_up_proj" not in q and torch.equal(q["lm_head.weight"], tensors["lm_head.weight"])
    assert torch.equal(ref[f"{prefix}.gate_up_proj_bias"], tensors[f"{prefix}.gate_up_proj_bias"])
    for name in ("gate_up_proj", "down_proj"):
        assert torch.equal(ref[f"{prefix}.{name}"], dequantize_mxfp4(q[f"{prefix}.{name}_blocks"],
                                                                    q[f"{prefix}.{name}_scales"]).transpose(1, 2))
        assert (ref[f"{prefix}.{name}"] - tensors[f"{prefix}.{name}"]).abs().max() < 1.0  # a step at most
    stored = {k.rsplit(".", 1)[1]: v for k, v in q.items() if k.startswith(prefix) and not k.endswith("bias")}
    layer = _mxfp4_layer(stored, 0, 1)
    gate_up = ref[f"{prefix}.gate_up_proj"].transpose(1, 2)  # [E, 2I, H]
    assert torch.equal(dequantize_mxfp4(layer.w13_weight, layer.w13_weight_scale),
                       torch.cat([gate_up[:, ::2], gate_up[:, 1::2]], 1))


# ------------------------------------------------------------------ gpt-oss with MXFP4 experts

@pytest.fixture(scope="module")
def gpt_oss_mxfp4(tmp_path_factory) -> tuple[str, str]:
    """The tiny gpt-oss (H 64, I 32, 8 experts, top-3, expert biases, sliding layers) with its experts in MXFP4 as
    gpt-oss is published, and the same in float32 with the experts transformers' dequantization of them."""
    from tests.helpers.gpt_oss_checkpoints import build_gpt_oss_checkpoint
    from tests.helpers.mxfp4_checkpoints import write_gpt_oss_mxfp4

    root = tmp_path_factory.mktemp("gpt-oss-mxfp4")
    src = build_gpt_oss_checkpoint(root / "src", seed=3)
    return tuple(str(p) for p in write_gpt_oss_mxfp4(str(src), root))


def test_gpt_oss_mxfp4_matches_transformers(gpt_oss_mxfp4):
    """The issue's acceptance: 8 prompts x 32 greedy tokens of the MXFP4 checkpoint (experts packed, uint8; the
    biases float32) are transformers' on the same experts (its dequantization of the blocks), in float32."""
    from tests.test_engine_correctness import GREEDY as GREEDY32
    from tests.test_engine_correctness import PROMPTS as TEXT_PROMPTS
    from tests.test_engine_correctness import check_against_hf, token_prompts

    mxfp4, reference = gpt_oss_mxfp4
    with LLM(mxfp4, **KW) as llm:
        layers = _experts(llm)
        assert len(layers) == 3 and all(m.w13_weight.dtype == m.w2_weight_scale.dtype == torch.uint8
                                        and m.w13_bias.dtype == torch.float32 for m in layers)
        ids = token_prompts(llm, TEXT_PROMPTS[:8])
        outputs = llm.generate(TEXT_PROMPTS[:8], GREEDY32, use_tqdm=False)
    check_against_hf(reference, llm, ids, outputs)


@pytest.mark.slow
def test_gpt_oss_mxfp4_tp2_matches_tp1(tmp_path):
    """TP=2 over gloo (I = 64: 32 channels, one scale group of ``down``, a rank) gives TP=1's greedy tokens."""
    from tests.helpers.gpt_oss_checkpoints import build_gpt_oss_checkpoint
    from tests.helpers.mxfp4_checkpoints import write_gpt_oss_mxfp4

    src = build_gpt_oss_checkpoint(tmp_path / "src", seed=4, intermediate_size=64)
    mxfp4, _ = write_gpt_oss_mxfp4(str(src), tmp_path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with LLM(str(mxfp4), **KW) as llm:
            one = _tokens(llm, PROMPTS[:4])
        with LLM(str(mxfp4), tensor_parallel_size=2, **KW) as llm:
            two = _tokens(llm, PROMPTS[:4])
    finally:
        torch.set_num_threads(threads)
    assert two == one


@pytest.mark.slow
@pytest.mark.triton
def test_gpt_oss_mxfp4_triton_layer_equals_torch(gpt_oss_mxfp4, monkeypatch):
    """The Triton kernels on gpt-oss's packed experts with biases and the clamped SwiGLU (interpreter): one
    loaded layer's decode (1 row) and grouped (24 rows) paths equal its torch path."""
    gpu_rounding_in_interpreter(monkeypatch)
    with LLM(gpt_oss_mxfp4[0], attention_backend="triton", **KW) as llm:
        layer = _experts(llm)[0]
        assert layer.backend == "triton" and layer.activation == "swigluoai"
        g = torch.Generator().manual_seed(0)
        for n in (1, 24):
            x, logits = torch.randn(n, 64, generator=g), torch.randn(n, 8, generator=g)
            got = layer(x, logits)
            layer.backend = "torch"
            want = layer(x, logits)
            layer.backend = "triton"
            assert rel_err(got, want) < 1e-5, n
