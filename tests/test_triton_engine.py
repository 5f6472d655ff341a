"""The engine through the Triton backend (in the interpreter on the CPU) equals the torch backend; there the
q/k norm + RoPE kernel stores each step's K/V (the torch backend: ``store_kvcache_ref``)."""

import pytest

from minivllm import LLM, SamplingParams
from tests.helpers.kernel_checks import gpu_rounding_in_interpreter

pytestmark = [pytest.mark.triton, pytest.mark.slow]  # engines in the Triton interpreter: 9-15 s a test


def test_triton_backend_matches_torch_backend_with_chunks_and_decode(tiny_tied_model):
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    prompts = ["def hello(x):", "import os\nimport sys", "a" * 40, "x"]
    with LLM(tiny_tied_model, device="cpu") as llm:
        assert not llm.engine.executor.runner.sampler.fused  # the torch sampler where Triton does not run
        ref = llm.generate(prompts, params, use_tqdm=False)
    # a small budget forces chunked prefill mixed with decode rows in one launch
    with LLM(tiny_tied_model, device="cpu", attention_backend="triton", max_num_batched_tokens=16) as tri:
        assert tri.engine.executor.runner.sampler.fused  # the Triton backend samples with the fused Gumbel kernel
        got = tri.generate(prompts, params, use_tqdm=False)
    assert [o["token_ids"] for o in got] == [o["token_ids"] for o in ref]


def test_triton_backend_stores_kv_in_the_rope_kernel_with_prefix_hits(tiny_model):
    """The K/V store inside the q/k norm + RoPE kernel gives the torch backend's tokens, with a prefix-cache
    hit (the hit's blocks were written by that kernel in an earlier request)."""
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    prefix = list(range(3, 40))  # 37 tokens: two full 16-token blocks to share
    prompts = [prefix + [50, 51], prefix + [60], [7]]
    with LLM(tiny_model, device="cpu") as llm:
        ref = llm.generate(prompts, params, use_tqdm=False)
    with LLM(tiny_model, device="cpu", attention_backend="triton", max_num_batched_tokens=32) as tri:
        got = tri.generate(prompts[:1], params, use_tqdm=False)
        ids, hits = [tri.engine.add_request(p, params) for p in prompts[1:]], 0
        done = {}
        while len(done) < len(ids):
            outputs, stats = tri.engine.step()
            hits += stats.prefix_cache_hit_tokens
            done.update({o.request_id: o.to_dict() for o in outputs if o.finished})
    got += [done[i] for i in ids]
    assert hits >= 32
    assert [o["token_ids"] for o in got] == [o["token_ids"] for o in ref]


def test_fused_kv_store_with_an_fp8_cache_equals_the_reference_store(tiny_tied_model, monkeypatch):
    """An FP8 (e4m3) cache: the Triton backend's fused store saturates and rounds as ``store_kvcache_ref`` (the
    torch backend's store) does, so the greedy tokens match. NOTE: the interpreter's own float32 -> e4m3 cast
    drops rounding carries; patched to round as a GPU does."""
    gpu_rounding_in_interpreter(monkeypatch)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    prompts = [list(range(5, 45)), [9, 8, 7], list(range(100, 120))]
    runs = []
    for backend in ("triton", "torch"):
        with LLM(tiny_tied_model, device="cpu", attention_backend=backend, kv_cache_dtype="fp8",
                 max_num_batched_tokens=32) as llm:
            runs.append([o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)])
    assert runs[0] == runs[1]
