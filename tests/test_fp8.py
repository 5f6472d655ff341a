"""FP8 weights on the CPU: the quantizers and the FP8 linear against plain float math, the Triton activation
quantizer against its reference, checkpoints in both published FP8 formats, online quantization, and tensor
parallelism over gloo."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.kernels.torch_backend import (
    dequantize_weight_fp8_ref,
    fp8_linear_ref,
    quantize_fp8_ref,
    quantize_weight_fp8_ref,
)
from tests.helpers.fp8_checkpoints import write_fp8_checkpoint

KW = dict(device="cpu", dtype="float32")
GREEDY = SamplingParams(temperature=0, ignore_eos=True, max_tokens=12)
PROMPTS = [[(7 * i + 3 * j + 1) % 380 for j in range(3 + 9 * i)] for i in range(6)]


@pytest.mark.parametrize("shape", [(1, 16), (7, 100), (33, 256)])
@pytest.mark.parametrize("group", [None, 32])
def test_activation_quantization_is_within_one_fp8_step(shape, group):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(shape[0])) * 3
    q, s = quantize_fp8_ref(x, group)
    g = shape[1] if group is None else group
    back = q.float() * s.repeat_interleave(g, 1)[:, :shape[1]]
    # e4m3 keeps 3 mantissa bits: rounding moves a value by at most 1/16 of it (or of the smallest normal)
    bound = torch.maximum(x.abs() / 16, s.repeat_interleave(g, 1)[:, :shape[1]] * 2.0**-9)
    assert (back - x).abs().le(bound + 1e-7).all()
    assert q.float().abs().max() <= 448 and (q.float().abs().amax(1) > 400).all()  # the range is used


@pytest.mark.parametrize("N, K", [(16, 32), (96, 160), (200, 72)])
@pytest.mark.parametrize("block", [None, (32, 32), (128, 128)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_linear_equals_its_dequantized_reference(N, K, block, dtype):
    g = torch.Generator().manual_seed(N + K)
    w = torch.randn(N, K, generator=g) * 0.05
    x = (torch.randn(5, 3, K, generator=g)).to(dtype)
    bias = torch.randn(N, generator=g)
    w8, scale = quantize_weight_fp8_ref(w, block)
    assert scale.shape == ((N,) if block is None else (-(-N // block[0]), -(-K // block[1])))
    wd = dequantize_weight_fp8_ref(w8, scale, block)
    assert ((wd - w).abs() <= w.abs() / 16 + scale.max() * 2.0**-9).all()  # within one FP8 step of the weight
    y = fp8_linear_ref(x, w8, scale, block, bias)
    assert y.shape == (5, 3, N) and y.dtype == dtype
    exact = x.float() @ wd.t() + bias  # the dequantized weight, unquantized activations
    rel = (y.float() - exact).norm() / exact.norm()
    tol = 0.05 if dtype == torch.float32 else 0.06  # per-token FP8 activations: ~2-3% of the output
    assert rel < tol, rel


@pytest.mark.triton
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the Triton interpreter on CPU tensors")
@pytest.mark.parametrize("M, K", [(1, 64), (5, 1000), (3, 4096)])
def test_triton_activation_quantizer_equals_the_reference(M, K):
    from minivllm.kernels.fp8_quant import quantize_fp8_per_token

    x = torch.randn(M, K, generator=torch.Generator().manual_seed(K)) * 5
    q, s = quantize_fp8_per_token(x, block=256)
    q_ref, s_ref = quantize_fp8_ref(x)
    assert torch.equal(s, s_ref)
    # NOTE: the interpreter's float -> e4m3 conversion drops the carry when a value rounds up to the next
    # power of two (124.4 gives 64, not 128); elsewhere the kernel's values are the reference's, and on a GPU
    # (hardware conversion) all of them: tests/gpu/test_fp8_gpu.py
    differ = q.float() != q_ref.float()
    carries = q_ref.float().abs().log2().frac() == 0
    assert not (differ & ~carries).any()


def _tokens(model, prompts=PROMPTS, **kw):
    with LLM(model, **KW, **kw) as llm:
        return [o["token_ids"] for o in llm.generate(prompts, GREEDY, use_tqdm=False)], llm


@pytest.fixture(scope="module")
def fp8_checkpoints(tiny_tied_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("fp8")
    return {"block": str(write_fp8_checkpoint(tiny_tied_model, root / "block", "fp8", (16, 16))),
            "channel": str(write_fp8_checkpoint(tiny_tied_model, root / "ct", "compressed-tensors"))}


def test_compressed_tensors_checkpoint_equals_online_quantization(fp8_checkpoints, tiny_tied_model):
    """The same per-channel FP8 weights, stored or quantized when loaded: the same greedy tokens."""
    online, llm = _tokens(tiny_tied_model, quantization="fp8")
    stored, _ = _tokens(fp8_checkpoints["channel"])
    assert stored == online


def test_block_checkpoint_loads_the_blocks_of_the_fused_layers(fp8_checkpoints, tiny_tied_model, monkeypatch):
    """Each fused layer (q/k/v, gate/up) holds exactly the FP8 blocks of its checkpoint tensors, side by side, and
    the model generates what the float checkpoint quantized to the same blocks when loaded generates."""
    from safetensors.torch import load_file

    with LLM(fp8_checkpoints["block"], **KW) as llm:
        layer = llm.engine.executor.runner.model.model.layers[1]
        src = load_file(Path(fp8_checkpoints["block"]) / "model.safetensors")
        qkv = layer.self_attn.qkv_proj
        names = [f"model.layers.1.self_attn.{p}_proj.weight" for p in "qkv"]
        assert torch.equal(qkv.weight.float(), torch.cat([src[n].float() for n in names]))
        assert torch.equal(qkv.weight_scale, torch.cat([src[n + "_scale_inv"] for n in names]))
        down = layer.mlp.down_proj
        assert torch.equal(down.weight_scale, src["model.layers.1.mlp.down_proj.weight_scale_inv"])
        stored = [o["token_ids"] for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    # the reference path: the float checkpoint quantized to the same blocks when loaded
    import minivllm.config.model as model_config
    from minivllm.config.quantization import Fp8Config

    monkeypatch.setattr(model_config, "fp8_config", lambda ckpt, q: Fp8Config((16, 16)))
    online, _ = _tokens(tiny_tied_model)
    assert stored == online


DEMO = str(Path(__file__).resolve().parents[1] / "models" / "minivllm-demo-py")
CODE = ["def fibonacci(n):", "import os\n", "class Stack:", "for i in range(", "# parse the header\n",
        "def read_config(path):"]


def _heldout_windows(n: int, width: int = 512) -> list[list[int]]:
    """``n`` windows of the demo model's held-out code (the standard library's email, json and xml packages)."""
    import glob
    import sysconfig

    from transformers import AutoTokenizer

    root = sysconfig.get_paths()["stdlib"]
    files = sorted(f for p in ("email", "json", "xml") for f in glob.glob(f"{root}/{p}/**/*.py", recursive=True))
    tok, ids = AutoTokenizer.from_pretrained(DEMO), []
    for f in files:
        ids += tok.encode(Path(f).read_text(encoding="utf-8"))
    return [ids[i:i + width] for i in range(0, len(ids) - width, width)][:n]


def _mean_nll(llm, windows) -> float:
    outs = llm.generate(windows, SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0), use_tqdm=False)
    nll = [-o["prompt_logprobs"][j][w[j]].logprob for o, w in zip(outs, windows) for j in range(1, len(w))]
    return sum(nll) / len(nll)


def test_online_fp8_keeps_the_demo_models_heldout_loss():
    """The trained demo model quantized when loaded: its held-out loss within 2% of bf16's (the model card has
    both figures, over 40 windows)."""
    windows = _heldout_windows(8)
    with LLM(DEMO, device="cpu", dtype="bfloat16") as llm:
        bf16 = _mean_nll(llm, windows)
    with LLM(DEMO, device="cpu", dtype="bfloat16", quantization="fp8") as llm:
        assert llm.engine.executor.runner.model.model.layers[0].mlp.down_proj.weight.dtype == torch.float8_e4m3fn
        fp8 = _mean_nll(llm, windows)
    assert abs(fp8 - bf16) / bf16 < 0.02, (bf16, fp8)


class _Rank:
    """A stand-in tensor-parallel group: only the rank and the size (the layers' loaders read nothing else)."""

    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size


@pytest.mark.parametrize("block", [None, (16, 16)])
def test_each_rank_loads_its_slice_of_the_weights_and_scales(block):
    """Every parallel layer at TP=2 holds, on each rank, exactly its slice of the TP=1 layer's FP8 weight and of
    its scales: q/k/v (query heads split, one KV head per rank), gate/up, and the row-parallel down projection."""
    from minivllm.config.quantization import Fp8Config
    from minivllm.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
    from minivllm.layers.quantization import Fp8LinearMethod

    g = torch.Generator().manual_seed(0)
    parts = {"q": torch.randn(64, 64, generator=g), "k": torch.randn(32, 64, generator=g),
             "v": torch.randn(32, 64, generator=g), 0: torch.randn(96, 64, generator=g),
             1: torch.randn(96, 64, generator=g), "down": torch.randn(64, 96, generator=g)}
    stored = {k: quantize_weight_fp8_ref(w, block) for k, w in parts.items()}
    method = Fp8LinearMethod(Fp8Config(block, from_checkpoint=True))

    def build(rank, size):
        layers = {"qkv": QKVParallelLinear(64, 16, 4, 2, tp_group=_Rank(rank, size)),
                  "gate_up": MergedColumnParallelLinear(64, [96, 96], tp_group=_Rank(rank, size)),
                  "down": RowParallelLinear(96, 64, tp_group=_Rank(rank, size))}
        for layer in layers.values():
            method.create_weights(layer)
        for key, (w8, scale) in stored.items():
            layer = layers["qkv" if key in ("q", "k", "v") else "gate_up" if key in (0, 1) else "down"]
            shard = () if key == "down" else (key,)
            layer.weight.weight_loader(layer.weight, w8, *shard)
            layer.weight_scale.weight_loader(layer.weight_scale, scale, *shard)
        return layers

    full = build(0, 1)
    for rank in range(2):
        part = build(rank, 2)
        for name, layer in part.items():
            w, s = full[name].weight.float(), full[name].weight_scale
            if name == "down":  # columns split; per-channel scales whole on every rank
                want_w = w[:, 48 * rank:48 * (rank + 1)]
                want_s = s if block is None else s[:, 3 * rank:3 * (rank + 1)]
            else:  # rows split: each sub-matrix (q | k | v, gate | up) is cut in two
                sizes = [64, 32, 32] if name == "qkv" else [96, 96]
                rows = torch.cat([torch.arange(o + n // 2 * rank, o + n // 2 * (rank + 1))
                                  for o, n in zip([0, *torch.tensor(sizes).cumsum(0)[:-1].tolist()], sizes)])
                want_w = w[rows]
                want_s = s[rows] if block is None else s[rows[::block[0]] // block[0]]
            assert torch.equal(layer.weight.float(), want_w), (name, rank)
            assert torch.equal(layer.weight_scale, want_s), (name, rank)


@pytest.mark.parametrize("fmt", ["online", "block"])
def test_tp2_fp8_gives_tp1s_greedy_tokens(fmt, tmp_path):
    """FP8 at TP=2 over gloo gives TP=1's greedy tokens on the trained demo model, per-channel (online) and
    128x128 blocks. Two things make it so: a row-parallel layer quantizes its input slice with the whole row's
    scale (the ranks' amax all-reduced), and the CPU sums the FP8 products in float64, so the ranks' partial
    sums add up to what one rank computes."""
    model, extra = (DEMO, {"quantization": "fp8"}) if fmt == "online" else (
        str(write_fp8_checkpoint(DEMO, tmp_path / "block", "fp8", (128, 128))), {})
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    with LLM(model, **KW, **extra) as llm:
        one = [o["token_ids"] for o in llm.generate(CODE, params, use_tqdm=False)]
    with LLM(model, tensor_parallel_size=2, **KW, **extra) as llm:
        two = [o["token_ids"] for o in llm.generate(CODE, params, use_tqdm=False)]
    assert two == one


@pytest.mark.parametrize("bad, match", [
    ({"quant_method": "awq"}, "quant_method 'awq' is not supported"),
    ({"quant_method": "fp8", "activation_scheme": "static"}, "static activation scales"),
])
def test_unsupported_quantization_is_a_clear_error(tiny_tied_model, tmp_path, bad, match):
    import json
    import shutil

    shutil.copytree(tiny_tied_model, tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**cfg, "quantization_config": bad}))
    with pytest.raises(ValueError, match=match):
        LLM(str(tmp_path / "m"), **KW)
    with pytest.raises(ValueError, match="quantization must be one of"):
        LLM(tiny_tied_model, quantization="int4", **KW)
