"""Gemma 3 through the whole engine against transformers: greedy tokens identical in float32 on a tiny random
``Gemma3ForCausalLM`` (five sliding layers of a 12-token window, then a global one with linear RoPE scaling;
random (1 + w) norms), also with chunked prefill across the window's edge, a prefix-cache hit, preemption and
TP=2 over gloo; the text stack of a tiny ``Gemma3ForConditionalGeneration``; images refused; the config's
layouts (transformers 4.x and 5.x, nested or not) and the shipped bench configs."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.config.hf import arch_from_dict
from minivllm.config.model import ArchConfig
from minivllm.entrypoints.bench.models import resolve_model
from minivllm.models.gemma3 import Gemma3ForCausalLM, Gemma3ForConditionalGeneration
from tests.helpers.engine_checks import (
    check_chunked_prefill,
    check_preemption,
    check_prefix_cache_hit,
    check_tp2_equals_tp1,
)
from tests.helpers.gemma3_checkpoints import (
    TINY_IMAGE_TOKEN,
    TINY_WINDOW,
    build_gemma3_checkpoint,
    build_gemma3_vlm_checkpoint,
)
from tests.test_engine_correctness import GREEDY, PROMPTS, check_against_hf, token_prompts

WINDOWS = [TINY_WINDOW] * 5 + [None]


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory) -> str:
    return str(build_gemma3_checkpoint(tmp_path_factory.mktemp("gemma3"), seed=3))


@pytest.fixture(scope="module")
def gemma3_vlm(tmp_path_factory) -> str:
    return str(build_gemma3_vlm_checkpoint(tmp_path_factory.mktemp("gemma3-vlm"), seed=5))


def test_greedy_matches_transformers(gemma3):
    """13 prompts x 32 greedy tokens are transformers'; layers 0-4 slide over 12 tokens with RoPE base 1e4,
    layer 5 sees everything with base 1e6 scaled linearly by 8; attention scaled by query_pre_attn_scalar."""
    llm = LLM(gemma3, device="cpu")
    model = llm.engine.executor.runner.model
    assert type(model) is Gemma3ForCausalLM
    layers = model.model.layers
    assert [layer.self_attn.attn.sliding_window for layer in layers] == WINDOWS
    assert layers[0].self_attn.attn.scale == pytest.approx(20 ** -0.5)
    local, full = layers[0].self_attn.rotary_emb.cos_sin_cache, layers[5].self_attn.rotary_emb.cos_sin_cache
    # position 1's angle of the first frequency pair is 1 (any base); the global layer divides it by 8
    assert local[1, 0].item() == pytest.approx(torch.cos(torch.tensor(1.0)).item())
    assert full[1, 0].item() == pytest.approx(torch.cos(torch.tensor(1 / 8)).item())
    ids = token_prompts(llm, PROMPTS)
    assert len(PROMPTS) >= 8 and sum(len(i) > TINY_WINDOW for i in ids) >= 8
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    check_against_hf(gemma3, llm, ids, outputs)
    assert len({tuple(o["token_ids"]) for o in outputs}) == len(PROMPTS)


def _with_config(src: str, dst: Path, **changes) -> str:
    """A copy of checkpoint ``src`` in ``dst`` with ``changes`` over its config.json."""
    shutil.copytree(src, dst, dirs_exist_ok=True)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return str(dst)


def test_window_changes_the_tokens(gemma3, tmp_path):
    """The window matters for these prompts: the same weights with a window past every prompt generate other
    tokens (so the parity test above checks the window, not only the decoder)."""
    wide = _with_config(gemma3, tmp_path, sliding_window=1000)
    prompts = PROMPTS[3:6]
    with LLM(gemma3, device="cpu") as llm:
        windowed = [o["token_ids"] for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    with LLM(wide, device="cpu") as llm:
        whole = [o["token_ids"] for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    assert windowed != whole


def test_chunked_prefill_across_the_window_edge(gemma3):
    """Prompts of ~150 to ~300 tokens prefilled at most 16 tokens a step, beside decoding rows: chunks start and
    end inside, on and past the 12-token window of their first queries."""
    check_chunked_prefill(gemma3, chunk=16, first_chars=240, step_chars=90, min_tokens=150)


def test_prefix_cache_hit_matches_transformers(gemma3):
    """The reused blocks hold keys past the window of the second prompt's queries, and some inside it."""
    check_prefix_cache_hit(gemma3)


def test_preemption_matches_transformers(gemma3):
    check_preemption(gemma3)



def test_tp2_matches_tp1(gemma3):
    """Each rank holds one of the two KV heads, its two query heads with their q/k norms, half of the MLP and
    of the vocabulary; o_proj and down_proj sum over the ranks before Gemma's post-norms."""
    check_tp2_equals_tp1(gemma3)


def test_final_logit_softcapping_is_transformers(gemma3, tmp_path):
    """With ``final_logit_softcapping`` set, ``compute_logits`` caps as transformers' Gemma3ForCausalLM does on
    the same final hidden states (greedy tokens cannot show it: tanh keeps the order)."""
    from transformers import AutoModelForCausalLM

    path = _with_config(gemma3, tmp_path, final_logit_softcapping=2.0)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor([[5, 17, 99, 230, 41]])
    with torch.no_grad():
        hidden = hf.model(ids).last_hidden_state[0]  # [5, hidden]
        want = hf(ids).logits[0]  # [5, vocab]
    with LLM(path, device="cpu") as llm:
        model = llm.engine.executor.runner.model
        assert model.softcap == 2.0
        got = model.compute_logits(hidden)
    assert want.abs().max() < 2.0 and (want.abs().max() > 1.0)  # capped, and the cap bites
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ Gemma's layers against transformers'

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,d", [(1, 24), (7, 64), (33, 256)])
def test_gemma_rms_norm_is_transformers(rows, d, dtype):
    """GemmaRMSNorm (torch path) is transformers' Gemma3RMSNorm bit for bit, alone and after the residual add
    (transformers adds the residual in the dtype, then normalises); GeluAndMul is its tanh-GELU gated product."""
    from transformers.activations import ACT2FN
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    from minivllm.layers.activation import GeluAndMul
    from minivllm.layers.layernorm import GemmaRMSNorm

    gen = torch.Generator().manual_seed(rows * d)
    x, res = (torch.randn(rows, d, generator=gen).mul(3).to(dtype) for _ in range(2))
    w = torch.randn(d, generator=gen) * 0.5
    ours, theirs = GemmaRMSNorm(d, 1e-6), Gemma3RMSNorm(d, 1e-6)
    with torch.no_grad():
        ours.weight.copy_(w)
        theirs.weight.copy_(w)
        assert torch.equal(ours(x), theirs(x))
        normed, summed = ours(x, res)
        assert torch.equal(summed, res + x) and torch.equal(normed, theirs(res + x))
        h = torch.randn(rows, 2 * d, generator=gen).to(dtype)
        gate, up = h.chunk(2, dim=-1)
        assert torch.equal(GeluAndMul("tanh")(h), ACT2FN["gelu_pytorch_tanh"](gate) * up)


@pytest.mark.triton
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,d", [(1, 24), (7, 64), (5, 384)])
def test_fused_gemma_rms_norm_matches_torch(rows, d, dtype, monkeypatch):
    """The fused path (the Triton RMSNorm given 1 + w in float32, under the interpreter): float32 equal to the
    torch path, half precision as accurate against float32 as the torch path and within an ulp of it."""
    from minivllm.layers.layernorm import GemmaRMSNorm
    from tests.helpers.kernel_checks import check, gpu_rounding_in_interpreter

    gpu_rounding_in_interpreter(monkeypatch)
    gen = torch.Generator().manual_seed(rows + d)
    x32, res32 = (torch.randn(rows, d, generator=gen) * 3 for _ in range(2))
    w = torch.randn(d, generator=gen) * 0.5
    torch_norm, fused_norm = GemmaRMSNorm(d, 1e-6), GemmaRMSNorm(d, 1e-6, fused=True)
    with torch.no_grad():
        torch_norm.weight.copy_(w)
        fused_norm.weight.copy_(w)
    x, res = x32.to(dtype), res32.to(dtype)
    ref32 = torch_norm(x.float())
    # the kernel rounds the normalised row before the (1 + w) multiply, the torch path once after it: up to
    # half the elements may differ by an ulp
    check(fused_norm(x.clone()), torch_norm(x), ref32, dtype, max_frac=0.5)
    out, new_res = fused_norm(x.clone(), res.clone())
    assert torch.equal(new_res, x + res)
    check(out, torch_norm(x + res), torch_norm((x + res).float()), dtype, max_frac=0.5)


# ------------------------------------------------------------------ the multimodal checkpoint's text stack

def test_conditional_generation_text_stack_matches_transformers(gemma3_vlm):
    """A tiny Gemma3ForConditionalGeneration (``text_config`` nested, a SigLIP tower beside it): its language
    model answers 8 text prompts with transformers' tokens; the vision weights are skipped, not loaded."""
    from tests.helpers.hf_reference import _hf_model

    assert type(_hf_model(gemma3_vlm)).__name__ == "Gemma3ForConditionalGeneration"
    llm = LLM(gemma3_vlm, device="cpu")
    model = llm.engine.executor.runner.model
    assert type(model) is Gemma3ForConditionalGeneration
    assert [layer.self_attn.attn.sliding_window for layer in model.model.layers] == WINDOWS
    assert not any("vision" in n or "multi_modal" in n for n, _ in model.named_parameters())
    ids = token_prompts(llm, PROMPTS[:8])
    outputs = llm.generate(ids, GREEDY, use_tqdm=False)
    check_against_hf(gemma3_vlm, llm, ids, outputs)


def test_images_are_refused(gemma3_vlm):
    """The image placeholder in a prompt, vLLM's ``multi_modal_data``, and an image part in a chat message are
    ValueErrors naming the field; text next to them would otherwise be answered without the image."""
    with LLM(gemma3_vlm, device="cpu") as llm:
        with pytest.raises(ValueError, match="prompt: token id .* image placeholder"):
            llm.generate([[5, 6, TINY_IMAGE_TOKEN, 7]], GREEDY, use_tqdm=False)
        with pytest.raises(ValueError, match="multi_modal_data: images"):
            llm.generate([{"prompt": "what is this?", "multi_modal_data": {"image": object()}}], GREEDY,
                         use_tqdm=False)
        image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
        with pytest.raises(ValueError, match="messages: content parts of type 'image_url' are not supported"):
            llm.chat([{"role": "user", "content": [{"type": "text", "text": "what is this?"}, image]}],
                     GREEDY, use_tqdm=False)
        # the same text alone is served
        assert llm.chat([{"role": "user", "content": [{"type": "text", "text": "hi"}]}], GREEDY,
                        use_tqdm=False)[0]["token_ids"]


def test_images_over_http_are_a_400(gemma3_vlm):
    """Chat completions with an ``image_url`` part: an OpenAI-style 400 that names ``messages``; the server keeps
    serving text."""
    from fastapi.testclient import TestClient

    from minivllm.engine.async_engine import AsyncLLM
    from minivllm.entrypoints.openai.api_server import build_app

    app = build_app(AsyncLLM(lambda: LLM(gemma3_vlm, device="cpu").engine), "tiny")
    image = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    with TestClient(app) as client:
        for _ in range(6000):  # the engine loads on its own thread
            if client.get("/health").status_code == 200:
                break
            time.sleep(0.01)
        r = client.post("/v1/chat/completions", json={
            "model": "tiny", "max_tokens": 3,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, image]}]})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert "messages" in err["message"] and "image_url" in err["message"]
        ok = client.post("/v1/chat/completions", json={
            "model": "tiny", "max_tokens": 3, "messages": [{"role": "user", "content": "what is this?"}]})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3


# ------------------------------------------------------------------ config layouts and bench configs

# google/gemma-3-4b-it's text_config as published (transformers 4.50): only what differs from the defaults
PUBLISHED_4B = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
                "eos_token_id": [1, 106], "image_token_index": 262144, "torch_dtype": "bfloat16",
                "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                                "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                                "sliding_window": 1024},
                "vision_config": {"model_type": "siglip_vision_model"}}


def test_published_nested_config_gets_transformers_defaults():
    """The 4B's six text fields and transformers' Gemma3TextConfig defaults for the rest, as transformers reads
    them (checked against ``Gemma3Config`` itself)."""
    from transformers import Gemma3Config

    arch = arch_from_dict(PUBLISHED_4B)
    hf = Gemma3Config(**{k: v for k, v in PUBLISHED_4B.items() if k not in ("architectures", "model_type")})
    text = hf.text_config
    assert arch.architecture == "Gemma3ForConditionalGeneration"
    assert (arch.vocab_size, arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim) == \
        (text.vocab_size, text.num_attention_heads, text.num_key_value_heads, text.head_dim) == (262208, 8, 4, 256)
    assert arch.layer_types == text.layer_types and arch.layer_types.count("full_attention") == 5
    assert [arch.sliding_window_of(i) for i in range(6)] == [1024] * 5 + [None]
    assert arch.rope_theta == text.rope_parameters["full_attention"]["rope_theta"] == 1e6
    assert arch.rope_local_theta == text.rope_parameters["sliding_attention"]["rope_theta"] == 1e4
    assert arch.rope_scaling["rope_type"] == "linear" and arch.rope_scaling["factor"] == 8.0
    assert (arch.query_pre_attn_scalar, arch.hidden_act, arch.tie_word_embeddings) == (256, "gelu_pytorch_tanh", True)
    assert (arch.max_position_embeddings, arch.eos_token_ids, arch.dtype) == (131072, [1, 106], "bfloat16")
    assert arch.image_token_id == 262144 and arch.final_logit_softcapping is None


def test_both_rope_layouts_read_the_same(gemma3):
    """transformers 5.x's ``rope_parameters`` keyed by layer type and 4.x's ``rope_theta`` /
    ``rope_local_base_freq`` / ``rope_scaling`` give the same ArchConfig."""
    five = json.loads((Path(gemma3) / "config.json").read_text())
    four = {k: v for k, v in five.items() if k != "rope_parameters"}
    four.update(rope_theta=1e6, rope_local_base_freq=1e4, rope_scaling={"factor": 8.0, "rope_type": "linear"})
    a, b = arch_from_dict(five), arch_from_dict(four)
    assert a == b and a.rope_local_theta == 1e4 and a.rope_scaling == {"rope_type": "linear", "factor": 8.0}


@pytest.mark.parametrize("changes,match", [({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
                                           ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
                                           ({"hidden_activation": "silu"}, "hidden_activation"),
                                           ({"sliding_window": None}, "sliding_window")])
def test_unsupported_gemma3_variants_are_clear_errors(changes, match):
    with pytest.raises(ValueError, match=match):
        arch_from_dict({"model_type": "gemma3_text", "num_hidden_layers": 6, **changes})


def _shipped(name: str) -> ArchConfig:
    path, hint = resolve_model(name)
    assert hint == "dummy"
    with open(f"{path}/config.json") as f:
        return arch_from_dict(json.load(f))


@pytest.mark.parametrize("name,arch,layers,window,scalar,heads,kv,params", [
    ("gemma-3-1b", "Gemma3ForCausalLM", 26, 512, 256, 4, 1, (0.99e9, 1.01e9)),
    ("google/gemma-3-4b-it", "Gemma3ForConditionalGeneration", 34, 1024, 256, 8, 4, (3.87e9, 3.89e9)),
    ("gemma-3-12b", "Gemma3ForConditionalGeneration", 48, 1024, 256, 16, 8, (11.7e9, 11.8e9)),
    ("gemma-3-27b-it", "Gemma3ForConditionalGeneration", 62, 1024, 168, 32, 16, (27.0e9, 27.1e9))])
def test_shipped_gemma3_configs(name, arch, layers, window, scalar, heads, kv, params):
    """The published configs: every sixth layer global, the others over the window; 4B-27B scale the global
    layers' RoPE linearly by 8; the text models' parameter counts (embedding tied)."""
    cfg = _shipped(name)
    assert (cfg.architecture, cfg.num_hidden_layers, cfg.sliding_window) == (arch, layers, window)
    assert (cfg.query_pre_attn_scalar, cfg.num_attention_heads, cfg.num_key_value_heads) == (scalar, heads, kv)
    assert [cfg.sliding_window_of(i) for i in range(6)] == [window] * 5 + [None]
    assert cfg.tie_word_embeddings and cfg.rope_local_theta == 1e4 and cfg.rope_theta == 1e6
    assert (cfg.rope_scaling is None) == (layers == 26)
    assert params[0] < cfg.num_params() < params[1]
    with torch.device("meta"):  # the model's shapes, without its memory
        model = Gemma3ForCausalLM(cfg, max_position=4096)
    attn = model.model.layers[0].self_attn
    assert attn.qkv_proj.weight.shape == ((heads + 2 * kv) * cfg.head_dim, cfg.hidden_size)
    assert attn.attn.scale == pytest.approx(scalar ** -0.5)


@pytest.mark.slow
@pytest.mark.triton
def test_triton_path_matches_torch_backend(gemma3):
    """attention_backend='triton' (the interpreter on the CPU): the fused (1 + w) norms, the q/k norm + RoPE
    kernel with each layer type's cos/sin cache, and the windowed paged kernels give the torch backend's tokens."""
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompts = PROMPTS[3:6]
    with LLM(gemma3, device="cpu") as ref:
        want = [o["token_ids"] for o in ref.generate(prompts, params, use_tqdm=False)]
    with LLM(gemma3, device="cpu", attention_backend="triton") as llm:
        got = [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == want
