"""Mixture-of-experts models (Qwen3-MoE, Mixtral, OLMoE) through the whole engine against transformers: greedy
tokens identical in float32 on tiny random checkpoints, also with chunked prefill, a prefix-cache hit,
preemption, and at TP=2 over gloo; their config fields, loading, dummy weights and FP8."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.config.hf import arch_from_dict
from minivllm.config.model import ArchConfig, ModelConfig
from minivllm.entrypoints.bench.models import resolve_model
from minivllm.kernels.moe_torch import select_experts
from minivllm.layers.fused_moe import FusedMoE
from minivllm.models.moe import SparseMoeBlock
from minivllm.models.qwen3 import MLP
from tests.helpers.engine_checks import check_chunked_prefill, check_prefix_cache_hit
from tests.helpers.moe_checkpoints import MOE_SHAPES, build_moe_checkpoint
from tests.test_engine_correctness import GREEDY, PROMPTS, check_against_hf, token_prompts

ARCHS = list(MOE_SHAPES)
SLOW = pytest.mark.slow
# the first architecture in the fast tier, the others in the slow one
FAST_FIRST = [ARCHS[0], *(pytest.param(a, marks=SLOW) for a in ARCHS[1:])]


@pytest.fixture(scope="module")
def moe_models(tmp_path_factory, tiny_moe_model) -> dict[str, str]:
    """One tiny checkpoint per architecture (seeded; several expert counts and top-k, see ``MOE_SHAPES``);
    Qwen3-MoE's is the session's ``tiny_moe_model`` (seed 0)."""
    return {arch: tiny_moe_model if arch == "qwen3_moe" else str(build_moe_checkpoint(
        tmp_path_factory.mktemp(arch), arch, seed=i)) for i, arch in enumerate(ARCHS)}


def _routed_experts(llm: LLM) -> tuple[dict[str, set[int]], list]:
    """Record, per MoE layer, the experts its tokens are routed to (a forward hook on each ``FusedMoE``)."""
    seen: dict[str, set[int]] = {}
    handles = []
    for name, module in llm.engine.executor.runner.model.named_modules():
        if isinstance(module, FusedMoE):
            def hook(mod, args, out, name=name):
                _, ids = select_experts(args[1], mod.top_k, mod.renormalize)
                seen.setdefault(name, set()).update(ids.flatten().tolist())
            handles.append(module.register_forward_hook(hook))
    return seen, handles


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_matches_transformers(moe_models, arch):
    """13 prompts x 32 greedy tokens are transformers', and every expert of every MoE layer took tokens."""
    path = moe_models[arch]
    llm = LLM(path, device="cpu")
    model = llm.engine.executor.runner.model
    cfg = llm.engine.config.model_config.arch
    kinds = [type(layer.mlp) for layer in model.model.layers]
    assert kinds == [SparseMoeBlock if cfg.is_moe_layer(i) else MLP for i in range(cfg.num_hidden_layers)]
    assert SparseMoeBlock in kinds
    if arch == "qwen3_moe":
        assert kinds[1] is MLP  # mlp_only_layers=[1]: a dense layer of intermediate_size between sparse ones
    seen, handles = _routed_experts(llm)
    ids = token_prompts(llm, PROMPTS)
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    for h in handles:
        h.remove()
    check_against_hf(path, llm, ids, outputs)
    assert len(PROMPTS) >= 8 and len({tuple(o["token_ids"]) for o in outputs}) == len(PROMPTS)
    assert seen and all(experts == set(range(cfg.num_experts)) for experts in seen.values())


def test_olmoe_norms_whole_projections_and_clips(moe_models):
    """OLMoE's q_norm / k_norm span all heads (hidden_size, kv_heads * head_dim), and clip_qkv is reached by
    these weights (so the parity test checks the clamp)."""
    llm = LLM(moe_models["olmoe"], device="cpu")
    attn = llm.engine.executor.runner.model.model.layers[0].self_attn
    assert attn.qk_norm == "full" and attn.clip_qkv == 4.0
    assert attn.q_norm.weight.shape == (64,) and attn.k_norm.weight.shape == (2 * 16,)
    peaks = []
    handle = attn.qkv_proj.register_forward_hook(lambda mod, args, out: peaks.append(out.abs().max().item()))
    llm.generate(PROMPTS[:2], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    handle.remove()
    assert max(peaks) > 4.0


@pytest.mark.parametrize("arch", FAST_FIRST)
def test_prefix_cache_hit_matches_transformers(moe_models, arch):
    check_prefix_cache_hit(moe_models[arch])


@pytest.mark.parametrize("arch", FAST_FIRST)
def test_preemption_matches_transformers(moe_models, arch):
    # 16 blocks x 16 tokens = 256 tokens of cache for 13 prompts of up to ~70 tokens + 32 new
    path = moe_models[arch]
    llm = LLM(path, device="cpu", num_kvcache_blocks=16, max_model_len=256)
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert llm.engine.scheduler.num_preemptions > 0
    check_against_hf(path, llm, token_prompts(llm, PROMPTS), outputs)


@pytest.mark.parametrize("arch", FAST_FIRST)
def test_chunked_prefill_matches_transformers(moe_models, arch):
    """Prompts of up to ~600 tokens prefilled 32 tokens a step, beside decoding rows."""
    check_chunked_prefill(moe_models[arch], chunk=32, first_chars=480, step_chars=100, min_tokens=300)


def test_async_scheduling_gives_the_same_tokens(moe_models):
    """Asynchronous scheduling (the next step prepared before this one's tokens are on the host) on a MoE
    model: the synchronous tokens."""
    path = moe_models["mixtral"]
    ids = [[(5 * i + 2 * j + 3) % 380 for j in range(4 + 9 * i)] for i in range(6)]
    with LLM(path, device="cpu", async_scheduling=False) as llm:
        want = [o["token_ids"] for o in llm.generate(ids, GREEDY, use_tqdm=False)]
    with LLM(path, device="cpu", async_scheduling=True) as llm:
        got = [o["token_ids"] for o in llm.generate(ids, GREEDY, use_tqdm=False)]
    assert got == want


# ------------------------------------------------------------------ tensor parallel (gloo)

TP_PROMPTS = [[(7 * i + 3 * j + 1) % 380 for j in range(3 + 11 * i)] for i in range(10)]  # 3..102 tokens
TP_GREEDY = SamplingParams(temperature=0, ignore_eos=True, max_tokens=16)


def _tp_tokens(path: str, tp: int) -> list[list[int]]:
    with LLM(path, device="cpu", dtype="float32", tensor_parallel_size=tp) as llm:
        return [o["token_ids"] for o in llm.generate(TP_PROMPTS, TP_GREEDY, use_tqdm=False)]


@pytest.fixture(scope="module")
def olmoe_one_kv_head(tmp_path_factory) -> str:
    """OLMoE with one KV head: at TP=2 both ranks hold it, and k_norm's sum of squares counts it once."""
    return str(build_moe_checkpoint(tmp_path_factory.mktemp("olmoe-kv1"), "olmoe", seed=5, num_key_value_heads=1))


@pytest.fixture(scope="module")
def one_thread():
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


def test_tp2_matches_tp1_olmoe_replicated_kv_head(olmoe_one_kv_head, one_thread):
    """Experts split along their intermediate dimension, q_norm / k_norm summed over the ranks (k's one KV head
    replicated on both)."""
    assert _tp_tokens(olmoe_one_kv_head, 2) == _tp_tokens(olmoe_one_kv_head, 1)


@SLOW
@pytest.mark.parametrize("arch", ARCHS)
def test_tp2_matches_tp1(moe_models, arch, one_thread):
    assert _tp_tokens(moe_models[arch], 2) == _tp_tokens(moe_models[arch], 1)


# ------------------------------------------------------------------ config, loading, dummy weights, FP8

def test_arch_config_reads_moe_fields():
    """The shipped Qwen3-30B-A3B config, Mixtral's layout, and the parameter count of every expert."""
    path, _ = resolve_model("qwen3-30b-a3b")
    with open(f"{path}/config.json") as f:
        qwen = arch_from_dict(json.load(f))
    assert (qwen.architecture, qwen.num_experts, qwen.num_experts_per_tok) == ("Qwen3MoeForCausalLM", 128, 8)
    assert (qwen.moe_intermediate_size, qwen.norm_topk_prob, qwen.mlp_only_layers) == (768, True, [])
    assert all(qwen.is_moe_layer(i) for i in range(48))
    assert 30.0e9 < qwen.num_params() < 31.0e9  # 30.5 B published
    mixtral = arch_from_dict({"architectures": ["MixtralForCausalLM"], "vocab_size": 32000, "hidden_size": 4096,
                              "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                              "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2})
    assert (mixtral.num_experts, mixtral.moe_intermediate_size, mixtral.norm_topk_prob) == (8, 14336, False)
    assert 46.0e9 < mixtral.num_params() < 47.5e9  # 46.7 B published
    sparse = arch_from_dict({"architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 100, "hidden_size": 64,
                             "intermediate_size": 96, "moe_intermediate_size": 32, "num_hidden_layers": 6,
                             "num_attention_heads": 4, "num_local_experts": 4, "num_experts_per_tok": 2,
                             "decoder_sparse_step": 2, "mlp_only_layers": [3]})
    assert [sparse.is_moe_layer(i) for i in range(6)] == [False, True, False, False, False, True]
    dense = arch_from_dict({"model_type": "qwen3", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 96,
                            "num_hidden_layers": 2, "num_attention_heads": 4})
    assert not dense.is_moe and not dense.is_moe_layer(0)


@pytest.mark.parametrize("field,value,match", [("num_experts_per_tok", 9, "num_experts_per_tok"),
                                               ("num_experts_per_tok", 0, "num_experts_per_tok"),
                                               ("moe_intermediate_size", 0, "moe_intermediate_size"),
                                               ("decoder_sparse_step", 0, "decoder_sparse_step"),
                                               ("clip_qkv", -1.0, "clip_qkv")])
def test_bad_moe_config_is_a_clear_error(field, value, match):
    kw = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
    kw[field] = value
    with pytest.raises(ValueError, match=match):
        ArchConfig("Qwen3MoeForCausalLM", 100, 64, 128, 2, 4, 2, 16, **kw)


def test_checkpoint_missing_an_expert_is_a_clear_error(moe_models, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    src = Path(moe_models["mixtral"])
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, tmp_path / f.name)
    tensors = load_file(src / "model.safetensors")
    del tensors["model.layers.1.block_sparse_moe.experts.2.w3.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"layers\.1\.mlp\.experts\.w13_weight"):
        LLM(str(tmp_path), device="cpu")


def test_dummy_weights_and_online_fp8_quantize_the_experts():
    """The tiny MoE bench config runs on dummy weights; with quantization='fp8' attention, dense layers and
    experts are FP8 while routers keep the model's dtype."""
    path, hint = resolve_model("tiny-qwen3-moe")
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    prompts = [[1, 2, 3, 4], [5, 6, 7]]
    with LLM(path, load_format=hint, device="cpu") as llm:
        plain = [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]
    assert all(len(t) == 6 for t in plain)
    with LLM(path, load_format=hint, device="cpu", quantization="fp8") as llm:
        layer = llm.engine.executor.runner.model.model.layers[0]
        assert layer.self_attn.qkv_proj.weight.dtype == torch.float8_e4m3fn
        assert layer.mlp.gate.quant_method is None and layer.mlp.gate.weight.dtype == torch.float32
        assert layer.mlp.experts.w13_weight.dtype == layer.mlp.experts.w2_weight.dtype == torch.float8_e4m3fn
        fp8 = [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]
    assert all(len(t) == 6 for t in fp8)


def test_block_fp8_config_of_a_moe_model_is_accepted():
    """Qwen3-30B-A3B-FP8's ``quantization_config`` (128 x 128 blocks) on the shipped Qwen3-30B-A3B config: its
    experts load as FP8 blocks (tests/test_moe_fp8.py loads such checkpoints)."""
    path, _ = resolve_model("qwen3-30b-a3b")
    with open(f"{path}/config.json") as f:
        cfg = json.load(f)
    cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic",
                                  "weight_block_size": [128, 128]}
    assert ModelConfig(path, arch_from_dict(cfg)).fp8.weight_block == (128, 128)


@SLOW
@pytest.mark.triton
@pytest.mark.parametrize("arch", ["olmoe", "qwen3_moe"])
def test_triton_attention_path_matches_torch_backend(moe_models, arch):
    """attention_backend='triton' (the interpreter on the CPU): OLMoE's whole-projection norms and clamp before
    the fused RoPE + KV-store kernel, Qwen3-MoE's per-head norms inside it, and FusedMoE's Triton kernels
    (routing, alignment, grouped GEMMs for the prompts, the decode path for the decode steps) give the torch
    backend's tokens."""
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    with LLM(moe_models[arch], device="cpu") as ref:
        want = [o["token_ids"] for o in ref.generate(PROMPTS[:4], params, use_tqdm=False)]
    with LLM(moe_models[arch], device="cpu", attention_backend="triton") as llm:
        assert llm.engine.executor.runner.model.model.layers[0].mlp.experts.backend == "triton"
        got = [o["token_ids"] for o in llm.generate(PROMPTS[:4], params, use_tqdm=False)]
    assert got == want


def test_moe_engine_config_errors():
    """Experts that do not split evenly over the ranks, and the torch MoE path under CUDA graphs, are clear
    errors naming the setting (raised before any GPU is looked for)."""
    from minivllm.config import Config, DeviceConfig, ParallelConfig

    arch = ArchConfig("Qwen3MoeForCausalLM", 100, 64, 96, 2, 6, 6, 16, num_experts=4, num_experts_per_tok=2,
                      moe_intermediate_size=32)
    with pytest.raises(ValueError, match=r"moe_intermediate_size \(32\) must be divisible by tensor_parallel_size"):
        Config(ModelConfig("m", arch), parallel_config=ParallelConfig(tensor_parallel_size=3))
    with pytest.raises(ValueError, match="enforce_eager=True"):
        Config(ModelConfig("m", arch), device_config=DeviceConfig(device="cuda", attention_backend="torch"))
    Config(ModelConfig("m", arch), device_config=DeviceConfig(device="cuda", attention_backend="torch",
                                                              enforce_eager=True))
