"""The engine's features on a mixture-of-experts model (issue 38, "everything else works with MoE models"): an
FP8 KV cache, online FP8 weights, structured outputs, the OpenAI server, ``bench throughput`` and data
parallelism on Ray, each on a tiny Qwen3-MoE checkpoint on the CPU; and the tensor-parallel check of the dense
MLPs' split, which a MoE model without one skips.

``minivllm serve --data-parallel-size N`` is not repeated here: its replica (``scale_out/serve/replica.py``) runs
the same engine whatever the model, as ``DataParallelEngine`` does, which the Ray test below covers."""

from __future__ import annotations

import argparse
import json

import jsonschema
import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.layers.fused_moe import FusedMoE
from minivllm.sampling_params import StructuredOutputsParams
from tests.helpers.hf_reference import near_tie_gaps
from tests.helpers.json_schemas import SCHEMAS
from tests.helpers.moe_checkpoints import build_moe_checkpoint
from tests.helpers.ray_utils import ray_processes
from tests.helpers.server_utils import running_server
from tests.test_engine_correctness import PROMPTS

FP8 = torch.float8_e4m3fn
# the dense FP8 KV test's engine: a CPU budget small enough to bind, not max_num_seqs full sequences
KV_KW = dict(device="cpu", dtype="float32", max_model_len=256, max_num_seqs=32, cpu_kvcache_space_gib=0.0005)
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
SCHEMA_NAMES = ["person", "color_enum", "nested_address", "array_of_objects", "one_of_shapes"]


def _tokens(llm: LLM, prompts, params=GREEDY) -> list[list[int]]:
    return [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]


# ------------------------------------------------------------------ FP8 KV cache

@pytest.mark.parametrize("arch", ["qwen3_moe", *(pytest.param(a, marks=pytest.mark.slow) for a in ("mixtral", "olmoe"))])
def test_fp8_kv_cache_runs_with_a_moe_model(arch, tiny_moe_model, tmp_path):
    """The dense models' criterion (tests/test_fp8_kv_cache.py): an e4m3 cache of a quarter of float32's bytes
    per block, so four times the blocks in one budget, full-length outputs, the same tokens twice. Mixtral and
    OLMoE (whole-projection q/k norms, clip_qkv before the store) in the slow tier."""
    path = tiny_moe_model if arch == "qwen3_moe" else str(build_moe_checkpoint(tmp_path, arch, seed=1))
    with LLM(path, **KV_KW) as full:
        blocks_f32 = full.engine.num_kvcache_blocks
    with LLM(path, kv_cache_dtype="fp8", **KV_KW) as llm:
        assert llm.engine.executor.runner.kv_cache.dtype == FP8
        assert 4 * blocks_f32 <= llm.engine.num_kvcache_blocks < 4 * (blocks_f32 + 1) <= 32 * 16
        first = _tokens(llm, PROMPTS[:4])
        again = _tokens(llm, PROMPTS[:4])
    assert [len(t) for t in first] == [12] * 4 and first == again


def test_checkpoint_kv_scales_load_into_a_moe_models_layers(tiny_moe_model, tmp_path):
    """vLLM's ``self_attn.k_scale`` / ``v_scale`` in a MoE checkpoint set its attention layers' FP8 cache
    scales (sparse and dense layers alike), and it generates with them."""
    from tests.test_fp8_kv_cache import _with_kv_scales

    scales = {"model.layers.0.self_attn.k_scale": 0.25, "model.layers.1.self_attn.v_scale": 2.0}
    path = _with_kv_scales(tiny_moe_model, tmp_path / "scaled", scales)
    with LLM(path, kv_cache_dtype="fp8", **KV_KW) as llm:
        layers = [m.self_attn.attn for m in llm.engine.executor.runner.model.model.layers]
        assert [a.kv_scales() for a in layers] == [(0.25, 1.0), (1.0, 2.0), (1.0, 1.0)]
        assert [len(t) for t in _tokens(llm, PROMPTS[:2])] == [12, 12]


@pytest.fixture(scope="module")
def moe_all_experts(tmp_path_factory) -> str:
    """Qwen3-MoE where each token runs all 4 experts: routing weights move smoothly with the input, no expert
    choice flips."""
    return str(build_moe_checkpoint(tmp_path_factory.mktemp("moe-all"), "qwen3_moe", seed=0, num_experts=4,
                                    num_experts_per_tok=4))


@pytest.mark.parametrize("model", ["tiny_tied_model", "moe_all_experts"])
def test_fp8_kv_greedy_tokens_are_near_ties_of_the_exact_model(model, request):
    """Each token the FP8-KV engine picks, teacher-forced through transformers in float32, is within half a
    standard deviation of the logits of that step's best token: the cache's rounding moves logits by a fraction
    of their spread on a MoE model as on the dense one. NOTE: with top-k routing (k < experts) the rounding can
    flip an expert choice, which moves a tiny random model's logits by far more: hence all experts here."""
    path = request.getfixturevalue(model)
    with LLM(path, kv_cache_dtype="fp8", **KV_KW) as llm:
        ids = [llm.get_tokenizer().encode(p) for p in PROMPTS]
        outs = _tokens(llm, ids)
        mlp = llm.engine.executor.runner.model.model.layers[0].mlp
        assert isinstance(getattr(mlp, "experts", None), FusedMoE) == (model == "moe_all_experts")
    gaps = near_tie_gaps(path, ids, outs)
    assert max(gaps) < 0.5, gaps


# ------------------------------------------------------------------ online FP8 weights

def test_online_fp8_quantizes_dense_parts_and_experts(tiny_moe_model):
    """``quantization="fp8"`` on a real checkpoint: attention, the dense layer (``mlp_only_layers``) and the experts
    hold e4m3 weights, the routers keep the float32 checkpoint values, and it generates (the experts' numbers:
    tests/test_moe_fp8.py)."""
    with LLM(tiny_moe_model, device="cpu") as ref:
        routers = [layer.mlp.gate.weight.clone() for layer in ref.engine.executor.runner.model.model.layers[::2]]
    with LLM(tiny_moe_model, device="cpu", quantization="fp8") as llm:
        layers = llm.engine.executor.runner.model.model.layers
        assert all(layer.self_attn.qkv_proj.weight.dtype == FP8 for layer in layers)
        assert layers[1].mlp.gate_up_proj.weight.dtype == FP8  # the dense layer between the sparse ones
        for layer, want in zip(layers[::2], routers, strict=True):
            assert torch.equal(layer.mlp.gate.weight, want)
            assert layer.mlp.experts.w13_weight.dtype == layer.mlp.experts.w2_weight.dtype == FP8
        outs = _tokens(llm, PROMPTS[:3])
    assert [len(t) for t in outs] == [12] * 3


# ------------------------------------------------------------------ structured outputs

@pytest.fixture(scope="module")
def moe_llm(tiny_moe_model):
    with LLM(tiny_moe_model, device="cpu", max_model_len=512) as llm:
        yield llm


def test_json_schemas_give_valid_json(moe_llm):
    """The random model knows no JSON: the grammar alone makes each output valid, greedy and sampled."""
    params = [SamplingParams(temperature=t, seed=3, max_tokens=200,
                             structured_outputs=StructuredOutputsParams(json=SCHEMAS[name]))
              for t in (0.0, 1.0) for name in SCHEMA_NAMES]
    outs = moe_llm.generate(["Return JSON:\n"] * len(params), params, use_tqdm=False)
    for name, out in zip(SCHEMA_NAMES * 2, outs):
        assert out["finish_reason"] == "stop", (name, out["text"])
        jsonschema.validate(json.loads(out["text"]), SCHEMAS[name])


# ------------------------------------------------------------------ the OpenAI server

@pytest.fixture(scope="module")
def moe_server(tiny_moe_model, tmp_path_factory):
    args = ["--served-model-name", "tiny-moe", "--device", "cpu", "--max-model-len", "512"]
    with running_server(tiny_moe_model, args, tmp_path_factory.mktemp("moe-server")) as srv:
        yield srv


@pytest.mark.server
def test_server_completion_is_the_offline_engines(moe_server, moe_llm):
    out = moe_server.client.completions.create(model="tiny-moe", prompt="def f(x):", max_tokens=12, temperature=0)
    (want,) = moe_llm.generate("def f(x):", SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)
    assert out.choices[0].text == want["text"] and out.usage.completion_tokens == len(want["token_ids"])


@pytest.mark.server
def test_server_streamed_chat_equals_the_whole_one(moe_server):
    kw = dict(model="tiny-moe", messages=[{"role": "user", "content": "hello"}], max_tokens=10, temperature=0)
    full = moe_server.client.chat.completions.create(**kw)
    chunks = list(moe_server.client.chat.completions.create(**kw, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content and full.usage.completion_tokens == 10
    assert chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason == "length"


@pytest.mark.server
def test_server_json_schema_response_format(moe_server):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMAS["person"], "strict": True}}
    out = moe_server.client.chat.completions.create(
        model="tiny-moe", messages=[{"role": "user", "content": "a person as JSON"}], max_tokens=200,
        temperature=0, response_format=fmt)
    assert out.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(out.choices[0].message.content), SCHEMAS["person"])


# ------------------------------------------------------------------ bench throughput

@pytest.mark.parametrize("extra", [[], ["--quantization", "fp8", "--kv-cache-dtype", "fp8"]],
                         ids=["model-dtype", "fp8"])
def test_bench_throughput_on_the_shipped_tiny_moe_config(extra, capsys):
    """``minivllm bench throughput --model tiny-qwen3-moe --device cpu`` through the CLI's parser (dummy weights)."""
    from minivllm.entrypoints.bench.commands import add_bench_parser

    parser = argparse.ArgumentParser(prog="minivllm")
    add_bench_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "throughput", "--model", "tiny-qwen3-moe", "--device", "cpu",
                              "--workload", "fixed-batch", "--num-requests", "3", "--input-len", "8",
                              "--output-len", "4", "--max-model-len", "256", "--num-kvcache-blocks", "32", *extra])
    assert args.func(args) == 0
    text = capsys.readouterr().out
    assert "== throughput results ==" in text and "output tok/s" in text


# ------------------------------------------------------------------ data parallelism on Ray

@pytest.mark.slow
def test_two_ray_replicas_give_one_engines_outputs(tiny_moe_model):
    pytest.importorskip("ray")
    kw = dict(device="cpu", dtype="float32", max_model_len=256)
    with LLM(tiny_moe_model, **kw) as one:
        want = one.generate(PROMPTS[:5], GREEDY, use_tqdm=False)
    with LLM(tiny_moe_model, data_parallel_size=2, **kw) as llm:
        assert type(llm.engine).__name__ == "DataParallelEngine"
        got = llm.generate(PROMPTS[:5], GREEDY)
    assert [(g["token_ids"], g["text"]) for g in got] == [(w["token_ids"], w["text"]) for w in want]
    assert ray_processes() == 0


# ------------------------------------------------------------------ engine checks that assumed a dense MLP

def test_tensor_parallel_split_of_dense_mlps_is_checked_only_where_there_are_some():
    """``intermediate_size`` must split over the ranks where some layer is a dense MLP (a clear error naming
    it); a MoE model without a dense layer does not use it (Qwen3-30B-A3B)."""
    from minivllm.config import Config, ParallelConfig
    from minivllm.config.model import ArchConfig, ModelConfig

    moe = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
    tp4 = ParallelConfig(tensor_parallel_size=4)
    Config(ModelConfig("m", ArchConfig("Qwen3MoeForCausalLM", 100, 64, 90, 2, 4, 4, 16, **moe)), parallel_config=tp4)
    for arch in (ArchConfig("Qwen3MoeForCausalLM", 100, 64, 90, 2, 4, 4, 16, mlp_only_layers=[1], **moe),
                 ArchConfig("Qwen3ForCausalLM", 100, 64, 90, 2, 4, 4, 16)):
        with pytest.raises(ValueError, match=r"intermediate_size \(90\) must be divisible by tensor_parallel_size"):
            Config(ModelConfig("m", arch), parallel_config=tp4)
