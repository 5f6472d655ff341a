"""Mistral (sliding-window attention) through the whole engine against transformers: greedy tokens identical in
float32 on a tiny random checkpoint whose window (12 tokens) is shorter than most prompts, also with chunked
prefill across the window's edge, a prefix-cache hit, preemption and TP=2 over gloo; with ``sliding_window:
null`` it is the Llama path; its config fields and the shipped bench configs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.config.hf import arch_from_dict
from minivllm.config.model import ArchConfig
from minivllm.entrypoints.bench.models import resolve_model
from minivllm.models.mistral import MistralForCausalLM
from minivllm.models.qwen3 import LlamaForCausalLM
from tests.helpers.engine_checks import (
    check_chunked_prefill,
    check_preemption,
    check_prefix_cache_hit,
    check_tp2_equals_tp1,
)
from tests.helpers.mistral_checkpoints import TINY_WINDOW, build_mistral_checkpoint
from tests.test_engine_correctness import GREEDY, PROMPTS, check_against_hf, token_prompts


@pytest.fixture(scope="module")
def mistral(tmp_path_factory) -> str:
    return str(build_mistral_checkpoint(tmp_path_factory.mktemp("mistral"), seed=3))


def test_greedy_matches_transformers(mistral):
    """13 prompts x 32 greedy tokens are transformers'; every layer slides over 12 tokens with head_dim 24."""
    llm = LLM(mistral, device="cpu")
    model = llm.engine.executor.runner.model
    assert isinstance(model, MistralForCausalLM)
    assert all(layer.self_attn.attn.sliding_window == TINY_WINDOW for layer in model.model.layers)
    assert model.model.layers[0].self_attn.head_dim == 24  # not hidden_size / heads (16)
    ids = token_prompts(llm, PROMPTS)
    assert len(PROMPTS) >= 8 and sum(len(i) > TINY_WINDOW for i in ids) >= 8
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    check_against_hf(mistral, llm, ids, outputs)
    assert len({tuple(o["token_ids"]) for o in outputs}) == len(PROMPTS)


def test_window_changes_the_tokens(mistral, tmp_path):
    """The window matters for these prompts: the same weights with full attention generate other tokens (so the
    parity test above checks the window, not only the decoder)."""
    full = _with_config(mistral, tmp_path, sliding_window=None)
    prompts = PROMPTS[3:6]
    with LLM(mistral, device="cpu") as llm:
        windowed = [o["token_ids"] for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    with LLM(full, device="cpu") as llm:
        assert llm.engine.executor.runner.model.model.layers[0].self_attn.attn.sliding_window is None
        whole = [o["token_ids"] for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    assert windowed != whole


def test_chunked_prefill_across_the_window_edge(mistral):
    """Prompts of ~150 to ~300 tokens prefilled at most 16 tokens a step, beside decoding rows: chunks start and
    end inside, on and past the 12-token window of their first queries."""
    check_chunked_prefill(mistral, chunk=16, first_chars=240, step_chars=90, min_tokens=150)


def test_prefix_cache_hit_matches_transformers(mistral):
    """The reused blocks hold keys past the window of the second prompt's queries, and some inside it."""
    check_prefix_cache_hit(mistral)


def test_preemption_matches_transformers(mistral):
    check_preemption(mistral)



def test_tp2_matches_tp1(mistral):
    """Each rank holds one of the two KV heads and its two query heads, each sliding over the same window."""
    check_tp2_equals_tp1(mistral)


def _with_config(src: str, dst: Path, **changes) -> str:
    """A copy of checkpoint ``src`` in ``dst`` with ``changes`` over its config.json."""
    shutil.copytree(src, dst, dirs_exist_ok=True)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return str(dst)


def test_full_attention_mistral_is_the_llama_path(tmp_path):
    """``sliding_window: null``: the Mistral checkpoint gives transformers' tokens, and the same weights read as a
    Llama checkpoint give the same tokens."""
    path = str(build_mistral_checkpoint(tmp_path / "mistral", seed=4, sliding_window=None))
    llama = _with_config(path, tmp_path / "llama", architectures=["LlamaForCausalLM"], model_type="llama")
    with LLM(path, device="cpu") as llm:
        assert all(layer.self_attn.attn.sliding_window is None
                   for layer in llm.engine.executor.runner.model.model.layers)
        ids = token_prompts(llm, PROMPTS[:8])
        outputs = llm.generate(ids, GREEDY, use_tqdm=False)
    check_against_hf(path, llm, ids, outputs)
    with LLM(llama, device="cpu") as llm:
        model = llm.engine.executor.runner.model
        assert type(model) is LlamaForCausalLM
        assert [o["token_ids"] for o in llm.generate(ids, GREEDY, use_tqdm=False)] == \
            [o["token_ids"] for o in outputs]


@pytest.mark.slow
@pytest.mark.triton
def test_triton_attention_path_matches_torch_backend(mistral):
    """attention_backend='triton' (the interpreter on the CPU): the windowed paged kernels for prefill chunks and
    decode give the torch backend's tokens."""
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompts = PROMPTS[3:7]
    with LLM(mistral, device="cpu") as ref:
        want = [o["token_ids"] for o in ref.generate(prompts, params, use_tqdm=False)]
    with LLM(mistral, device="cpu", attention_backend="triton") as llm:
        got = [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == want


# ------------------------------------------------------------------ config fields and bench configs

def _shipped(name: str) -> ArchConfig:
    path, hint = resolve_model(name)
    assert hint == "dummy"
    with open(f"{path}/config.json") as f:
        return arch_from_dict(json.load(f))


def test_shipped_mistral_configs():
    """Mistral-7B-v0.1: a 4096-token window on all 32 layers; Mistral-Small-24B: full attention, head_dim 128 of
    a 5120-wide model with 32 heads; parameter counts as published (7.24 B, 23.6 B)."""
    m7 = _shipped("mistral-7b-v0.1")
    assert (m7.architecture, m7.sliding_window, m7.head_dim) == ("MistralForCausalLM", 4096, 128)
    assert [m7.sliding_window_of(i) for i in range(32)] == [4096] * 32
    assert 7.1e9 < m7.num_params() < 7.3e9
    small = _shipped("mistralai/Mistral-Small-24B-Instruct-2501")
    assert (small.sliding_window, small.head_dim, small.hidden_size // small.num_attention_heads) == (None, 128, 160)
    assert small.sliding_window_of(0) is None
    assert 23.0e9 < small.num_params() < 24.0e9
    with torch.device("meta"):  # the model's shapes, without its memory
        model = MistralForCausalLM(small, max_position=4096)
    attn = model.model.layers[0].self_attn
    assert attn.qkv_proj.weight.shape == ((32 + 2 * 8) * 128, 5120) and attn.o_proj.weight.shape == (5120, 4096)


BASE = {"vocab_size": 100, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
        "num_attention_heads": 4}


def test_which_layers_slide():
    """transformers' rules: Qwen2 / Qwen3 slide only with ``use_sliding_window``, on ``layer_types``' sliding
    layers or from ``max_window_layers`` on; Mistral slides every layer whatever ``layer_types`` says; Llama
    never."""
    qwen_off = arch_from_dict({**BASE, "architectures": ["Qwen2ForCausalLM"], "sliding_window": 32,
                               "use_sliding_window": False})
    assert qwen_off.sliding_window is None
    qwen_on = arch_from_dict({**BASE, "architectures": ["Qwen2ForCausalLM"], "sliding_window": 32,
                              "use_sliding_window": True, "max_window_layers": 2})
    assert [qwen_on.sliding_window_of(i) for i in range(4)] == [None, None, 32, 32]
    types = ["sliding_attention", "full_attention"] * 2
    qwen3 = arch_from_dict({**BASE, "architectures": ["Qwen3ForCausalLM"], "sliding_window": 8,
                            "use_sliding_window": True, "layer_types": types})
    assert [qwen3.sliding_window_of(i) for i in range(4)] == [8, None, 8, None]
    mistral = arch_from_dict({**BASE, "model_type": "mistral", "sliding_window": 8, "layer_types": types})
    assert mistral.architecture == "MistralForCausalLM"
    assert [mistral.sliding_window_of(i) for i in range(4)] == [8] * 4
    llama = arch_from_dict({**BASE, "architectures": ["LlamaForCausalLM"], "sliding_window": 8})
    assert llama.sliding_window is None  # transformers' Llama has no sliding window


@pytest.mark.parametrize("changes,match", [({"sliding_window": 0}, "sliding_window"),
                                           ({"sliding_window": 8, "layer_types": ["full_attention"]},
                                            "layer_types has 1 entries"),
                                           ({"sliding_window": 8, "layer_types": ["chunked_attention"] * 4},
                                            "layer_types must be among")])
def test_bad_sliding_window_config_is_a_clear_error(changes, match):
    with pytest.raises(ValueError, match=match):
        arch_from_dict({**BASE, "architectures": ["Qwen3ForCausalLM"], "use_sliding_window": True, **changes})
