"""Prompt logprobs: each prompt token's logprob and top-k equal transformers' log_softmax (float32, 1e-4), with
chunked prefill, after the prompt is in the prefix cache, with n > 1 and next to other requests."""

from __future__ import annotations

import pytest
import torch

from minivllm import LLM, SamplingParams
from tests.helpers.hf_reference import hf_logits

K = 3


@pytest.fixture(scope="module")
def llm(tiny_tied_model):
    # NOTE: a 16-token budget splits the prompts below into chunks
    return LLM(tiny_tied_model, device="cpu", dtype="float32", max_model_len=128, max_num_batched_tokens=16,
               enable_prefix_caching=True)


def _check(path, ids: list[int], got: list[dict[int, float] | None], k: int = K) -> None:
    want = torch.log_softmax(hf_logits(path, ids), dim=-1)  # [len, vocab]
    assert len(got) == len(ids) and got[0] is None
    for j in range(1, len(ids)):
        entry = got[j]
        assert abs(entry[ids[j]].logprob - want[j - 1, ids[j]].item()) < 1e-4, j
        lp, row = want[j - 1, ids[j]], want[j - 1]  # NOTE: the rank counts the tokens more likely, within 1e-4
        assert int((row > lp + 1e-4).sum()) + 1 <= entry[ids[j]].rank <= int((row > lp - 1e-4).sum()) + 1, j
        top = torch.topk(want[j - 1], k)
        for rank, (tid, lp) in enumerate(zip(top.indices.tolist(), top.values.tolist()), start=1):
            assert abs(entry[tid].logprob - lp) < 1e-4 and entry[tid].rank in (rank, entry[ids[j]].rank), (j, tid)
        assert set(entry) <= {ids[j], *top.indices.tolist()}


def test_prompt_logprobs_equal_transformers_in_chunks_and_after_a_cache_hit(llm, tiny_tied_model):
    prompt = [5 + (7 * i) % 200 for i in range(45)]
    warm = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=2))[0]  # fills the prefix cache
    assert "prompt_logprobs" not in warm
    outs = llm.generate([prompt, prompt[:20]], [SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=K),
                                                SamplingParams(temperature=0.5, max_tokens=4, seed=1)])
    _check(tiny_tied_model, prompt, outs[0]["prompt_logprobs"])
    assert "prompt_logprobs" not in outs[1]
    assert outs[0]["token_ids"] == warm["token_ids"]


def test_prompt_logprobs_with_n_and_zero_alternatives(llm, tiny_tied_model):
    prompt = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 38, 32, 79, 50, 28, 84, 19]
    out = llm.generate([prompt], SamplingParams(temperature=1.0, n=2, max_tokens=3, prompt_logprobs=0, seed=0))[0]
    assert len(out["outputs"]) == 2
    _check(tiny_tied_model, prompt, out["prompt_logprobs"], k=0)
    assert all(len(e) == 1 for e in out["prompt_logprobs"][1:])
