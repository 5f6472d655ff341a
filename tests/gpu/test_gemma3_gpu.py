"""Gemma 3 on a real GPU: the tiny random ``Gemma3ForCausalLM`` (five sliding layers of a 12-token window, one
global layer with linearly scaled RoPE) through the engine with CUDA graphs gives eager's greedy tokens, and
both give the CPU torch backend's first tokens (float32)."""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def tiny_gemma3(tmp_path_factory) -> str:
    from tests.helpers.gemma3_checkpoints import build_gemma3_checkpoint

    return str(build_gemma3_checkpoint(tmp_path_factory.mktemp("gemma3-gpu"), seed=3))


def _tokens(path: str, prompts: list[str], **kw) -> list[list[int]]:
    from minivllm import LLM, SamplingParams

    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    with LLM(path, **kw) as llm:
        return [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]


PROMPTS = [f"def function_{i}(x):\n    return " + "x + " * i for i in range(24)]


def test_gemma3_graphs_equal_eager_and_cpu(tiny_gemma3):
    """float32: prompts and generations past the window; CUDA graphs (decode) and eager agree token for token,
    and their first tokens are the CPU's (then most whole sequences, allowing for GPU rounding)."""
    cpu = _tokens(tiny_gemma3, PROMPTS, device="cpu")
    gpu = {eager: _tokens(tiny_gemma3, PROMPTS, device="cuda", dtype="float32", enforce_eager=eager,
                          gpu_memory_utilization=0.3) for eager in (True, False)}
    assert gpu[False] == gpu[True]
    assert [g[:8] for g in gpu[True]] == [c[:8] for c in cpu]
    assert sum(g == c for g, c in zip(gpu[True], cpu)) >= 20



def test_gemma3_hybrid_cache_graphs_equal_full_layout(tiny_gemma3):
    """The hybrid KV cache (a pool of the global layer, one of the five sliding layers releasing the blocks their
    window left) under CUDA graphs gives the tokens of one full-attention pool, with a cache small enough that
    sliding blocks are released and reused while the graphs replay."""
    from minivllm import LLM, SamplingParams

    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    long_prompts = [p * 6 for p in PROMPTS[:12]]
    tokens = {}
    for hybrid in (True, False):
        with LLM(tiny_gemma3, device="cuda", dtype="float32", num_kvcache_blocks=64, max_model_len=512,
                 max_num_batched_tokens=256, disable_hybrid_kv_cache_manager=not hybrid) as llm:
            groups = llm.engine.executor.kv_cache_groups
            assert [w for w, _ in groups] == ([None, 12] if hybrid else [None])
            assert llm.engine.executor.runner.graph_runner is not None
            tokens[hybrid] = [o["token_ids"] for o in llm.generate(long_prompts, params, use_tqdm=False)]
    assert tokens[True] == tokens[False]
