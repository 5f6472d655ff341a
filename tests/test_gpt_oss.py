"""gpt-oss through the whole engine against transformers: greedy tokens identical in float32 on a tiny random
checkpoint (attention sinks, biased q/k/v/o, YaRN RoPE, sliding layers of a 12-token window between full ones,
8 experts of which each token runs 3, with random biases and the clamped SwiGLU), also with chunked prefill
across the window's edge, a prefix-cache hit, preemption and TP=2 over gloo; the pieces against transformers'
own modules (YaRN's cos/sin, the router and experts from the checkpoint's interleaved layout); the shipped bench
configs."""

from __future__ import annotations

import json

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.config.hf import arch_from_dict
from minivllm.entrypoints.bench.models import resolve_model
from minivllm.layers.rotary import RotaryEmbedding
from minivllm.models.gpt_oss import GptOssForCausalLM, GptOssMoE
from tests.helpers.engine_checks import (
    check_chunked_prefill,
    check_preemption,
    check_prefix_cache_hit,
    check_tp2_equals_tp1,
)
from tests.helpers.gpt_oss_checkpoints import TINY_WINDOW, build_gpt_oss_checkpoint
from tests.test_engine_correctness import GREEDY, PROMPTS, check_against_hf, token_prompts


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory) -> str:
    return str(build_gpt_oss_checkpoint(tmp_path_factory.mktemp("gpt_oss"), seed=3))


def test_greedy_matches_transformers(gpt_oss):
    """13 prompts x 32 greedy tokens are transformers'; layers 0 and 2 slide over 12 tokens, layer 1 sees all."""
    llm = LLM(gpt_oss, device="cpu")
    model = llm.engine.executor.runner.model
    assert isinstance(model, GptOssForCausalLM)
    assert [layer.self_attn.attn.sliding_window for layer in model.model.layers] == [TINY_WINDOW, None, TINY_WINDOW]
    assert all(layer.self_attn.attn.sinks.shape == (4,) for layer in model.model.layers)
    ids = token_prompts(llm, PROMPTS)
    assert len(PROMPTS) >= 8 and sum(len(i) > TINY_WINDOW for i in ids) >= 8
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    check_against_hf(gpt_oss, llm, ids, outputs)
    assert len({tuple(o["token_ids"]) for o in outputs}) == len(PROMPTS)


def test_chunked_prefill_across_the_window_edge(gpt_oss):
    """Prompts of ~150 to ~300 tokens prefilled at most 16 tokens a step, beside decoding rows: chunks start and
    end inside, on and past the 12-token window of their first queries."""
    check_chunked_prefill(gpt_oss, chunk=16, first_chars=240, step_chars=90, min_tokens=150)


def test_prefix_cache_hit_matches_transformers(gpt_oss):
    check_prefix_cache_hit(gpt_oss)


def test_preemption_matches_transformers(gpt_oss):
    check_preemption(gpt_oss)



def test_tp2_matches_tp1(gpt_oss):
    """Each rank holds one KV head, its two query heads and their sinks, half of every expert (its slices of the
    interleaved gate/up and their biases; the down bias on rank 0 only)."""
    check_tp2_equals_tp1(gpt_oss)


# ------------------------------------------------------------------ the pieces against transformers' modules

@pytest.mark.parametrize("truncate", [False, True])
def test_yarn_cos_sin_match_transformers(truncate):
    """cos/sin of gpt-oss's YaRN (theta 150,000, factor 32 over 4,096 positions; transformers' attention factor
    on both) equal transformers' ``GptOssRotaryEmbedding``, with and without ``truncate``."""
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRotaryEmbedding

    yarn = dict(rope_type="yarn", rope_theta=150000.0, factor=32.0, beta_fast=32.0, beta_slow=1.0, truncate=truncate,
                original_max_position_embeddings=4096)
    hf = GptOssRotaryEmbedding(GptOssConfig(head_dim=64, max_position_embeddings=131072, rope_parameters=yarn))
    positions = torch.tensor([0, 1, 17, 128, 4095, 4096, 100000])
    cos, sin = hf(torch.zeros(1, dtype=torch.float32), positions[None])  # [1, n, 32] each
    ours = RotaryEmbedding(64, 100001, 150000.0, yarn).cos_sin_cache[positions]  # [n, 64]
    torch.testing.assert_close(ours, torch.cat([cos[0], sin[0]], -1), atol=0, rtol=0)


def test_experts_match_transformers_mlp():
    """``GptOssMoE`` loaded from transformers' ``GptOssMLP`` tensors (interleaved gate/up ``[E, H, 2I]``,
    biases, router bias) gives its output: top-k then softmax routing, the clamped SwiGLU (inputs scaled so
    that the clamps bite on both sides)."""
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

    hf_cfg = GptOssConfig(hidden_size=32, intermediate_size=24, num_local_experts=6, num_experts_per_tok=2)
    torch.manual_seed(0)
    hf = GptOssMLP(hf_cfg)
    for p in hf.parameters():
        torch.nn.init.normal_(p, std=0.5)
    arch = arch_from_dict({**hf_cfg.to_dict(), "architectures": ["GptOssForCausalLM"], "dtype": "float32"})
    ours = GptOssMoE(arch, "torch")
    for name, tensor in hf.state_dict().items():  # renamed as the loader renames checkpoint tensors
        name = "." + name
        for hf_part, our_part in GptOssForCausalLM.checkpoint_substr_mapping.items():
            name = name.replace(hf_part, our_part)
        param = ours.get_parameter(name[1:])
        getattr(param, "weight_loader", lambda p, t: p.data.copy_(t))(param, tensor)
    x = torch.randn(40, 32) * 3.0
    with torch.no_grad():
        want, _ = hf(x[None])
        gate_up = torch.einsum("nh,ehk->enk", x, hf.experts.gate_up_proj) + hf.experts.gate_up_proj_bias[:, None]
    assert (gate_up[..., ::2] > 7.0).any() and (gate_up[..., 1::2].abs() > 7.0).any()  # both clamps bite
    torch.testing.assert_close(ours(x), want[0], atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------ config fields and bench configs

def _shipped(name: str):
    path, hint = resolve_model(name)
    assert hint == "dummy"
    with open(f"{path}/config.json") as f:
        return arch_from_dict(json.load(f))


def test_shipped_gpt_oss_configs():
    """gpt-oss-20b and 120b: every other layer slides over 128 tokens, YaRN (factor 32 over 4,096 positions,
    untruncated), clamped SwiGLU of limit 7, parameter counts as published (20.9 B, 116.8 B)."""
    small, big = _shipped("openai/gpt-oss-20b"), _shipped("gpt-oss-120b")
    for arch, layers, experts in ((small, 24, 32), (big, 36, 128)):
        assert (arch.architecture, arch.num_hidden_layers, arch.num_experts) == ("GptOssForCausalLM", layers, experts)
        assert [arch.sliding_window_of(i) for i in range(4)] == [128, None, 128, None]
        assert arch.rope_scaling["rope_type"] == "yarn" and arch.rope_scaling["truncate"] is False
        assert (arch.rope_theta, arch.swiglu_limit, arch.swiglu_alpha, arch.attention_bias) == (150000.0, 7.0, 1.702,
                                                                                                True)
        assert arch.quantization_config["quant_method"] == "mxfp4"  # packed experts, as published
    assert 20.8e9 < small.num_params() < 21.0e9 and 116.7e9 < big.num_params() < 116.9e9
    with torch.device("meta"):  # the model's shapes, without its memory
        model = GptOssForCausalLM(small, max_position=4096)
    layer = model.model.layers[0]
    assert layer.self_attn.qkv_proj.bias.shape == ((64 + 2 * 8) * 64,) and layer.self_attn.o_proj.bias.shape == (2880,)
    assert layer.self_attn.attn.sinks.shape == (64,)
    experts = layer.mlp.experts  # MXFP4: two e2m1 values a byte, a scale a 32 (tests/test_mxfp4.py)
    assert experts.w13_weight.shape == (32, 2 * 2880, 2880 // 2) and experts.w13_bias.shape == (32, 2 * 2880)
    assert experts.w2_weight.shape == (32, 2880, 2880 // 2) and experts.w2_bias.shape == (32, 2880)
    assert experts.w13_weight.dtype == experts.w2_weight_scale.dtype == torch.uint8
    assert experts.w13_weight_scale.shape == (32, 2 * 2880, 2880 // 32)


def test_default_layer_types_and_rope():
    """Without ``layer_types``, ``rope_theta`` or any RoPE type, transformers' gpt-oss defaults: even layers
    slide, theta 150,000, YaRN factor 32 over 4,096 positions."""
    arch = arch_from_dict({"model_type": "gpt_oss", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 32,
                           "num_hidden_layers": 4, "num_attention_heads": 4, "num_local_experts": 4,
                           "num_experts_per_tok": 2, "sliding_window": 8})
    assert [arch.sliding_window_of(i) for i in range(4)] == [8, None, 8, None]
    assert arch.rope_theta == 150000.0 and arch.rope_scaling["factor"] == 32.0
    assert (arch.swiglu_alpha, arch.swiglu_limit) == (1.702, 7.0)


def test_bad_gpt_oss_config_is_a_clear_error():
    base = {"architectures": ["GptOssForCausalLM"], "vocab_size": 100, "hidden_size": 64, "intermediate_size": 32,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_local_experts": 4, "num_experts_per_tok": 2}
    with pytest.raises(ValueError, match="swiglu_limit"):
        arch_from_dict({**base, "swiglu_limit": 0.0})
    with pytest.raises(ValueError, match="num_local_experts"):
        GptOssForCausalLM(arch_from_dict({**base, "num_local_experts": 0}))


@pytest.mark.slow
@pytest.mark.triton
def test_triton_backend_matches_torch_backend(gpt_oss):
    """attention_backend='triton' (the interpreter on the CPU): the paged kernels with sinks and a window, the
    fused RoPE over YaRN's scaled cos/sin, the fused MoE kernels with biases and the clamped SwiGLU (routing:
    softmax over all experts renormalised over the top k, equal to gpt-oss's top-k softmax) give the torch
    backend's tokens."""
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompts = PROMPTS[3:7]
    with LLM(gpt_oss, device="cpu") as ref:
        want = [o["token_ids"] for o in ref.generate(prompts, params, use_tqdm=False)]
    with LLM(gpt_oss, device="cpu", attention_backend="triton") as llm:
        got = [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == want
