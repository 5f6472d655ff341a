"""The engine through the Triton backend (in the interpreter on the CPU) equals the torch backend."""

import pytest

from minivllm import LLM, SamplingParams

pytestmark = pytest.mark.triton


def test_triton_backend_matches_torch_backend_with_chunks_and_decode(tiny_tied_model):
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    prompts = ["def hello(x):", "import os\nimport sys", "a" * 40, "x"]
    ref = LLM(tiny_tied_model, device="cpu").generate(prompts, params, use_tqdm=False)
    # a small budget forces chunked prefill mixed with decode rows in one launch
    tri = LLM(tiny_tied_model, device="cpu", attention_backend="triton", max_num_batched_tokens=16)
    got = tri.generate(prompts, params, use_tqdm=False)
    assert [o["token_ids"] for o in got] == [o["token_ids"] for o in ref]


@pytest.mark.parametrize("fused_kv_store", ["1", "0"])
def test_triton_backend_with_and_without_the_fused_kv_store(tiny_model, monkeypatch, fused_kv_store):
    """The K/V store inside the q/k norm + RoPE kernel (the default) and the separate store kernel
    (``MINIVLLM_FUSED_KV_STORE=0``) both give the torch backend's tokens, with a prefix-cache hit."""
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    prefix = list(range(3, 40))  # 37 tokens: two full 16-token blocks to share
    prompts = [prefix + [50, 51], prefix + [60], [7]]
    ref = LLM(tiny_model, device="cpu").generate(prompts, params, use_tqdm=False)
    monkeypatch.setenv("MINIVLLM_FUSED_KV_STORE", fused_kv_store)
    tri = LLM(tiny_model, device="cpu", attention_backend="triton", max_num_batched_tokens=32)
    got = tri.generate(prompts[:1], params, use_tqdm=False)
    ids, hits = [tri.add_request(p, params) for p in prompts[1:]], 0
    done = {}
    while len(done) < len(ids):
        outputs, stats = tri.step()
        hits += stats.prefix_cache_hit_tokens
        done.update({o.request_id: o.to_dict() for o in outputs if o.finished})
    got += [done[i] for i in ids]
    assert hits >= 32
    assert [o["token_ids"] for o in got] == [o["token_ids"] for o in ref]


def test_fused_kv_store_with_an_fp8_cache_equals_the_store_kernel(tiny_tied_model, monkeypatch):
    """An FP8 (e4m3) cache: the fused store saturates and rounds as the store kernel does, so the tokens match."""
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    prompts = [list(range(5, 45)), [9, 8, 7], list(range(100, 120))]
    runs = []
    for fused in ("1", "0"):
        monkeypatch.setenv("MINIVLLM_FUSED_KV_STORE", fused)
        llm = LLM(tiny_tied_model, device="cpu", attention_backend="triton", kv_cache_dtype="fp8",
                  max_num_batched_tokens=32)
        runs.append([o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)])
    assert runs[0] == runs[1]
