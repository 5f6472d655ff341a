"""FP8 experts (issue 38, "FP8 MoE") on the CPU: the torch path on FP8 experts against the dequantized float
math, online ``quantization="fp8"`` (per-channel scales, TP-invariant), block-FP8 checkpoints in
Qwen3-30B-A3B-FP8's format loaded through the experts' weight loader (TP slices on block boundaries), TP=2 over
gloo against TP=1, the layer's Triton branch under the interpreter, and ``bench throughput``."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from minivllm import LLM, SamplingParams
from minivllm.kernels.moe_fp8_weights import quantize_moe_weights_fp8, quantize_weights_fp8
from minivllm.kernels.moe_torch import fused_moe
from minivllm.kernels.torch_backend import dequantize_weight_fp8_ref
from tests.helpers.fp8_checkpoints import write_fp8_checkpoint
from tests.helpers.hf_reference import near_tie_gaps
from tests.helpers.kernel_checks import gpu_rounding_in_interpreter
from tests.helpers.moe_checkpoints import build_moe_checkpoint
from tests.helpers.moe_reference import MOE_TOL, fused_moe_fp8_naive, moe_weights, uneven_routing

FP8 = torch.float8_e4m3fn
KW = dict(device="cpu", dtype="float32")
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
PROMPTS = [[(7 * i + 3 * j + 1) % 380 for j in range(3 + 9 * i)] for i in range(6)]
BLOCK = (16, 16)  # the tiny models' experts: I = 32, H = 64: two blocks of I, so TP=2 cuts on a block boundary


def _tokens(llm: LLM, prompts=PROMPTS, params=GREEDY) -> list[list[int]]:
    return [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]


def _experts(llm: LLM) -> list:
    return [m for m in llm.engine.executor.runner.model.modules() if type(m).__name__ == "FusedMoE"]


# ------------------------------------------------------------------ the torch path on FP8 experts

@pytest.mark.parametrize("block", [None, (16, 32), (32, 32)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n, num_experts, top_k, inter", [(1, 8, 2, 48), (37, 16, 4, 40)])
def test_torch_fused_moe_on_fp8_experts_equals_the_dequantized_reference(block, dtype, n, num_experts, top_k, inter):
    """``fused_moe`` on FP8 experts (per channel, and blocks that cut ``I = 40`` unevenly) = the float64 loop over
    the dequantized experts with unquantized activations, within the dtype's tolerance; experts without a token
    included (uneven routing)."""
    hidden = 64
    w13, w2 = moe_weights(num_experts, hidden, inter, torch.float32, seed=n)
    w13_8, w13_s, w2_8, w2_s = quantize_moe_weights_fp8(w13, w2, block)
    x = torch.randn(n, hidden, generator=torch.Generator().manual_seed(n)).to(dtype)
    weights, ids = uneven_routing(n, num_experts, top_k, seed=n)
    got = fused_moe(x, w13_8, w2_8, weights, ids, w13_scale=w13_s, w2_scale=w2_s, block_shape=block)
    want = fused_moe_fp8_naive(x, w13_8, w13_s, w2_8, w2_s, block, weights, ids, quantize_acts=False)
    assert got.dtype == dtype and got.shape == (n, hidden)
    rel = (got.double() - want).norm() / want.norm()
    assert rel < MOE_TOL[dtype], rel


def test_per_channel_quantizer_with_given_amax_is_the_whole_channels():
    """A K-slice of each channel quantized with the whole channel's amax holds exactly the whole channel's FP8
    values and scale (what online FP8 at TP > 1 relies on for ``w2``)."""
    w = torch.randn(3, 8, 64, generator=torch.Generator().manual_seed(0))
    w8, s = quantize_weights_fp8(w, None)
    for i in range(4):
        p8, ps = quantize_weights_fp8(w[..., 16 * i:16 * (i + 1)], None, w.abs().amax(2))
        assert torch.equal(ps, s)
        assert torch.equal(p8.float(), w8.float()[..., 16 * i:16 * (i + 1)])
    with pytest.raises(ValueError, match="amax goes with per-channel scales"):
        quantize_weights_fp8(w, (4, 16), w.abs().amax(2))


# ------------------------------------------------------------------ online FP8

@pytest.fixture(scope="module")
def moe_all_experts(tmp_path_factory) -> str:
    """Qwen3-MoE where each token runs all 4 experts: no expert choice can flip on a near tie."""
    return str(build_moe_checkpoint(tmp_path_factory.mktemp("moe-all"), "qwen3_moe", seed=0, num_experts=4,
                                    num_experts_per_tok=4))


def test_online_fp8_quantizes_the_experts_and_keeps_the_routers(tiny_moe_model):
    """``quantization="fp8"``: each MoE layer's experts hold e4m3 weights whose dequantized values are within one
    FP8 step of the checkpoint's, one scale per output channel; the routers keep the float32 checkpoint values."""
    with LLM(tiny_moe_model, **KW) as ref:
        want = [(m.w13_weight.clone(), m.w2_weight.clone()) for m in _experts(ref)]
    with LLM(tiny_moe_model, quantization="fp8", **KW) as llm:
        layers = llm.engine.executor.runner.model.model.layers
        assert all(layer.mlp.gate.weight.dtype == torch.float32 for layer in layers[::2])
        for m, (w13, w2) in zip(_experts(llm), want, strict=True):
            assert m.w13_weight.dtype == m.w2_weight.dtype == FP8 and m.block_shape is None
            assert m.w13_weight_scale.shape == (8, 64) and m.w2_weight_scale.shape == (8, 64)
            for w8, s, w in ((m.w13_weight, m.w13_weight_scale, w13), (m.w2_weight, m.w2_weight_scale, w2)):
                back = torch.stack([dequantize_weight_fp8_ref(w8[e], s[e], None) for e in range(8)])
                assert ((back - w).abs() <= w.abs() / 16 + s[..., None] * 2.0**-9).all()
        assert [len(t) for t in _tokens(llm)] == [12] * len(PROMPTS)


def test_fp8_experts_greedy_tokens_are_near_ties_of_the_exact_model(moe_all_experts, monkeypatch):
    """Online FP8 experts alone (the dense linear layers kept in float32 here, so that what is measured is the
    experts' rounding): each token the engine picks, teacher-forced through transformers in float32, is within
    half a standard deviation of the logits of that step's best token (tests/test_moe_features.py's FP8 KV
    criterion). NOTE: with top-k routing (k < experts) FP8 rounding can flip an expert choice, which moves a tiny
    random model's logits by far more: hence all experts here. The whole model in FP8 (per-token FP8 activations
    in attention and the dense layer too) moves this tiny random model's logits further, experts or not."""
    import minivllm.layers.quantization as quantization

    monkeypatch.setattr(quantization, "Fp8LinearMethod", lambda config: None)  # no dense layer in FP8
    with LLM(moe_all_experts, quantization="fp8", **KW) as llm:
        model = llm.engine.executor.runner.model
        assert model.model.layers[0].self_attn.qkv_proj.weight.dtype == torch.float32
        assert all(m.w13_weight.dtype == m.w2_weight.dtype == FP8 for m in _experts(llm))
        outs = _tokens(llm)
    gaps = near_tie_gaps(moe_all_experts, PROMPTS, outs)
    assert max(gaps) < 0.5, gaps


# ------------------------------------------------------------------ block-FP8 checkpoints

@pytest.fixture(scope="module")
def block_checkpoint(tiny_moe_model, tmp_path_factory) -> str:
    """The tiny Qwen3-MoE in Qwen3-30B-A3B-FP8's format: every expert projection (and attention, and the dense
    layer) float8_e4m3fn with ``weight_scale_inv`` per 16 x 16 block; the routers in float32."""
    return str(write_fp8_checkpoint(tiny_moe_model, tmp_path_factory.mktemp("moe-fp8") / "block", "fp8", BLOCK))


def test_block_checkpoint_loads_the_experts_blocks(block_checkpoint):
    """Each expert's FP8 gate, up and down weights and block scales land in the stacked tensors as stored (the
    gate's scale blocks, then the up's); the routers are the checkpoint's float32 ones."""
    src = load_file(Path(block_checkpoint) / "model.safetensors")
    assert src["model.layers.0.mlp.gate.weight"].dtype == torch.float32
    with LLM(block_checkpoint, **KW) as llm:
        layer = llm.engine.executor.runner.model.model.layers[2]
        m = layer.mlp.experts
        assert m.block_shape == BLOCK and m.w13_weight.dtype == FP8
        assert torch.equal(layer.mlp.gate.weight, src["model.layers.2.mlp.gate.weight"])
        for e in range(8):
            name = f"model.layers.2.mlp.experts.{e}.%s_proj.weight"
            assert torch.equal(m.w13_weight[e].float(), torch.cat([src[name % "gate"], src[name % "up"]]).float())
            assert torch.equal(m.w2_weight[e].float(), src[name % "down"].float())
            scale = torch.cat([src[name % "gate" + "_scale_inv"], src[name % "up" + "_scale_inv"]])
            assert torch.equal(m.w13_weight_scale[e], scale)
            assert torch.equal(m.w2_weight_scale[e], src[name % "down" + "_scale_inv"])


def test_block_checkpoint_gives_the_dequantized_experts_tokens(block_checkpoint):
    """The loaded FP8 experts give exactly the greedy tokens of the same model with its experts replaced by their
    dequantized float32 weights (the CPU path dequantizes the picked experts and runs them unquantized)."""
    with LLM(block_checkpoint, **KW) as llm:
        fp8 = _tokens(llm)
        for m in _experts(llm):
            w13 = torch.stack([torch.cat([dequantize_weight_fp8_ref(m.w13_weight[e, :32], m.w13_weight_scale[e, :2],
                                                                    BLOCK),
                                          dequantize_weight_fp8_ref(m.w13_weight[e, 32:], m.w13_weight_scale[e, 2:],
                                                                    BLOCK)]) for e in range(8)])
            w2 = torch.stack([dequantize_weight_fp8_ref(m.w2_weight[e], m.w2_weight_scale[e], BLOCK)
                              for e in range(8)])
            m.w13_weight, m.w2_weight = torch.nn.Parameter(w13, False), torch.nn.Parameter(w2, False)
            m.w13_weight_scale = m.w2_weight_scale = None
        dequantized = _tokens(llm)
    assert fp8 == dequantized


def test_block_checkpoint_equals_the_float_model_quantized_to_the_same_blocks(block_checkpoint, tiny_moe_model,
                                                                              monkeypatch):
    """Stored FP8 blocks and the float checkpoint quantized to the same blocks when loaded: the same greedy
    tokens (tests/test_fp8.py's criterion for dense FP8 checkpoints)."""
    with LLM(block_checkpoint, **KW) as llm:
        stored = _tokens(llm)
    import minivllm.config.model as model_config
    from minivllm.config.quantization import Fp8Config

    monkeypatch.setattr(model_config, "fp8_config", lambda ckpt, q: Fp8Config(BLOCK))
    with LLM(tiny_moe_model, **KW) as llm:
        assert _experts(llm)[0].block_shape == BLOCK
        online = _tokens(llm)
    assert stored == online


class _Rank:
    """A stand-in tensor-parallel group: only the rank and the size (the loaders read nothing else)."""

    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size


@pytest.mark.parametrize("block", [None, (16, 16)])
def test_each_rank_loads_its_slice_of_the_fp8_experts_and_scales(block):
    """At TP=2 each rank's FP8 experts and scales are exactly its slice of TP=1's: gate and up by rows (channels
    or row blocks), down by columns (K blocks; per channel every rank has every scale of down)."""
    from minivllm.config.quantization import Fp8Config
    from minivllm.layers.fused_moe import FusedMoE
    from minivllm.layers.quantization import Fp8MoEMethod

    num_experts, hidden, inter = 3, 48, 64
    w13, w2 = moe_weights(num_experts, hidden, inter, torch.float32)
    stored = {}
    for e in range(num_experts):
        for shard, w in (("gate", w13[e, :inter]), ("up", w13[e, inter:]), ("down", w2[e])):
            w8, s = quantize_weights_fp8(w[None], block)
            stored[e, shard] = (w8[0], s[0] if block else s[0].view(-1, 1))  # compressed-tensors' [N, 1]
    method = Fp8MoEMethod(Fp8Config(block, from_checkpoint=True))

    def build(rank, size):
        layer = FusedMoE(num_experts, 2, hidden, inter, True, tp_group=_Rank(rank, size))
        method.create_weights(layer)
        for (e, shard), (w8, s) in stored.items():
            w_param, s_param = ((layer.w2_weight, layer.w2_weight_scale) if shard == "down" else
                                (layer.w13_weight, layer.w13_weight_scale))
            w_param.weight_loader(w_param, w8, e, shard)
            s_param.weight_loader(s_param, s, e, shard)
        return layer

    full = build(0, 1)
    half, b = inter // 2, (block or (1, 1))
    for rank in range(2):
        part = build(rank, 2)
        rows = torch.cat([torch.arange(o + half * rank, o + half * (rank + 1)) for o in (0, inter)])
        assert torch.equal(part.w13_weight.float(), full.w13_weight.float()[:, rows])
        assert torch.equal(part.w2_weight.float(), full.w2_weight.float()[:, :, half * rank:half * (rank + 1)])
        assert torch.equal(part.w13_weight_scale, full.w13_weight_scale[:, rows[::b[0]] // b[0]])
        want2 = full.w2_weight_scale if block is None else full.w2_weight_scale[:, :, half // b[1] * rank:][
            :, :, :half // b[1]]
        assert torch.equal(part.w2_weight_scale, want2)


def test_a_tp_slice_off_the_block_boundary_is_a_clear_error():
    """Each rank's 24 intermediate channels are not a whole number of 16-row blocks."""
    from minivllm.config.quantization import Fp8Config
    from minivllm.layers.fused_moe import FusedMoE
    from minivllm.layers.quantization import Fp8MoEMethod

    layer = FusedMoE(4, 2, 64, 48, True, tp_group=_Rank(0, 2))
    with pytest.raises(ValueError, match=r"FP8 block of \(16, 16\) does not divide this rank's 24 intermediate"):
        Fp8MoEMethod(Fp8Config((16, 16), from_checkpoint=True)).create_weights(layer)


# ------------------------------------------------------------------ tensor parallel over gloo

@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["online", "block"])
def test_tp2_fp8_experts_give_tp1s_greedy_tokens(fmt, tiny_moe_model, block_checkpoint):
    """FP8 experts at TP=2 over gloo: TP=1's greedy tokens, per channel online (``w2``'s scales over the whole
    channel, all-reduced) and from the 16 x 16 block checkpoint (each rank holds whole blocks)."""
    model, extra = (tiny_moe_model, {"quantization": "fp8"}) if fmt == "online" else (block_checkpoint, {})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with LLM(model, **KW, **extra) as llm:
            one = _tokens(llm)
        with LLM(model, tensor_parallel_size=2, **KW, **extra) as llm:
            two = _tokens(llm)
    finally:
        torch.set_num_threads(threads)
    assert two == one


# ------------------------------------------------------------------ the layer's Triton branch

@pytest.mark.slow
@pytest.mark.triton
def test_triton_branch_on_fp8_experts(moe_all_experts, monkeypatch):
    """attention_backend='triton' under the interpreter, FusedMoE's Triton kernels on per-channel FP8 experts
    (dense layers in float32, as in the near-tie test above):
    - one loaded layer's Triton branch (the interpreter's casts rounding as a GPU's: tests/test_fused_moe.py) equals its torch path at one row (the decode path: FP8 weights,
      unquantized activations, as the torch path runs them), and at 24 rows the grouped W8A8 GEMMs equal
      ``fused_moe_fp8_naive`` with per-token FP8 activations;
    - its greedy tokens are near ties of the exact model (the criterion above). NOTE: not token for token the
      torch path's: the prompts' grouped GEMMs quantize their activations, the torch path does not, and this
      tiny random model turns that rounding into a different pick within a few steps."""
    import minivllm.layers.quantization as quantization
    from minivllm.kernels.moe_torch import select_experts

    monkeypatch.setattr(quantization, "Fp8LinearMethod", lambda config: None)  # no dense layer in FP8
    gpu_rounding_in_interpreter(monkeypatch)  # the interpreter's e4m3 casts round as a GPU's
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    with LLM(moe_all_experts, quantization="fp8", attention_backend="triton", **KW) as llm:
        layer = _experts(llm)[0]
        assert {m.backend for m in _experts(llm)} == {"triton"} and layer.w13_weight.dtype == FP8
        g = torch.Generator().manual_seed(0)
        for n in (1, 24):
            x = torch.randn(n, 64, generator=g)
            logits = torch.randn(n, 4, generator=g)
            got = layer(x, logits)
            weights, ids = select_experts(logits, layer.top_k, layer.renormalize)
            if n == 1:
                layer.backend = "torch"
                want = layer(x, logits).double()
                layer.backend = "triton"
            else:
                want = fused_moe_fp8_naive(x, layer.w13_weight, layer.w13_weight_scale, layer.w2_weight,
                                           layer.w2_weight_scale, None, weights, ids, quantize_acts=True)
            rel = (got.double() - want).norm() / want.norm()
            assert rel < 1e-4, (n, rel)
        outs = _tokens(llm, PROMPTS[:3], params)
    gaps = near_tie_gaps(moe_all_experts, PROMPTS[:3], outs)
    assert max(gaps) < 0.5, gaps


# ------------------------------------------------------------------ bench throughput

def test_bench_throughput_runs_with_fp8_experts(capsys):
    """``minivllm bench throughput --model tiny-qwen3-moe --quantization fp8 --device cpu`` (dummy weights,
    quantized when loaded)."""
    from minivllm.entrypoints.bench.commands import add_bench_parser

    parser = argparse.ArgumentParser(prog="minivllm")
    add_bench_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "throughput", "--model", "tiny-qwen3-moe", "--device", "cpu",
                              "--quantization", "fp8", "--workload", "fixed-batch", "--num-requests", "3",
                              "--input-len", "8", "--output-len", "4", "--max-model-len", "256",
                              "--num-kvcache-blocks", "32"])
    assert args.func(args) == 0
    text = capsys.readouterr().out
    assert "== throughput results ==" in text and "output tok/s" in text
