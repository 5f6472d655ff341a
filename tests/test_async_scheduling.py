"""Asynchronous scheduling through the whole engine (CPU): exactly the synchronous outputs.

Synchronous outputs are themselves checked against transformers elsewhere; here every
feature that reads or ends a sequence (stop ids, stop strings, EOS-like stops, max_model_len,
seeds, penalties, logprobs, n, min_tokens) runs with step N+1 launched before step N's tokens
reach the host, with preemption and chunked prefill, and must give identical results.
"""

import pytest

from minivllm import LLM, SamplingParams

PROMPTS = ["def fibonacci(n):", "import os", "x", "class Stack:\n    def __init__(self):",
           "for i in range(10):\n    print(i)", "# " + "comment " * 25, "while True:\n    pass",
           "a = [1, 2, 3]\nb = {k: v for k, v in zip(a, a)}"]


def both(model, **kw):
    return (LLM(model, device="cpu", async_scheduling=False, **kw),
            LLM(model, device="cpu", async_scheduling=True, **kw))


def params_for(sync: LLM) -> list[SamplingParams]:
    """One SamplingParams per prompt, exercising every way a sequence is read or ends."""
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    base = sync.generate(PROMPTS, greedy, use_tqdm=False)
    stop_id = base[1]["token_ids"][5]  # a token the greedy run emits: the request stops there
    text = base[4]["text"]
    stop_str = text[len(text) // 2:len(text) // 2 + 2]
    return [
        greedy,
        SamplingParams(temperature=0, max_tokens=24, stop_token_ids=[stop_id]),
        SamplingParams(temperature=0.8, top_p=0.9, seed=11, max_tokens=20, ignore_eos=True, logprobs=3),
        SamplingParams(temperature=0.7, repetition_penalty=1.3, frequency_penalty=0.5, seed=5, max_tokens=16,
                       ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=30, stop=[stop_str], ignore_eos=True),
        SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=18, min_tokens=10, stop_token_ids=[stop_id]),
        SamplingParams(temperature=0, max_tokens=500, ignore_eos=True, logprobs=0),  # ends at max_model_len
    ]


def assert_same_outputs(got: list[dict], expected: list[dict]) -> None:
    """Identical tokens, text and finish reasons; logprobs of the same ids within 1e-4.

    NOTE: rows meet in other batches when scheduling is asynchronous (a sequence that stopped
    still has its next row computed once; preemption happens at other steps): float32 logits
    then differ in the last bits (the tokens may not).
    """
    strip = [{k: v for k, v in o.items() if k != "logprobs"} for o in got]
    assert strip == [{k: v for k, v in o.items() if k != "logprobs"} for o in expected]
    for g, e in zip(got, expected):
        assert ("logprobs" in g) == ("logprobs" in e)
        for a, b in zip(g.get("logprobs", []), e.get("logprobs", []), strict=True):
            assert a.keys() == b.keys() and all(abs(a[t] - b[t]) < 1e-4 for t in a)


@pytest.mark.parametrize("kw", [dict(max_model_len=160),
                                dict(max_model_len=160, num_kvcache_blocks=10),  # preemption
                                dict(max_model_len=160, max_num_batched_tokens=16, num_kvcache_blocks=12)],
                         ids=["plain", "preempt", "chunked"])
def test_async_outputs_equal_sync(tiny_tied_model, kw):
    sync, asyn = both(tiny_tied_model, **kw)
    params = params_for(sync)
    expected = sync.generate(PROMPTS, params, use_tqdm=False)
    got = asyn.generate(PROMPTS, params, use_tqdm=False)
    assert_same_outputs(got, expected)
    assert [o["finish_reason"] for o in expected[:2]] == ["length", "stop"]
    assert expected[7]["finish_reason"] == "length" and len(expected[7]["token_ids"]) < 500
    if "num_kvcache_blocks" in kw:
        assert asyn.engine.scheduler.num_preemptions > 0  # (params_for runs only on the other engine)
    assert asyn.engine.block_manager.num_used_blocks == 0
    asyn.engine.scheduler.check_integrity()


def test_tokens_arrive_one_step_later_and_abort_in_flight(tiny_tied_model):
    sync, asyn = both(tiny_tied_model)
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    expected = sync.generate(PROMPTS[:3], greedy, use_tqdm=False)
    ids = [asyn.engine.add_request(p, greedy, stream=True) for p in PROMPTS[:3]]
    outputs, stats = asyn.engine.step()
    assert outputs == [] and stats.num_prefill_tokens > 0  # launched; its tokens report next step
    outputs, stats = asyn.engine.step()
    assert {o.request_id for o in outputs} == set(ids) and stats.num_decode_tokens == 3
    asyn.engine.abort_request(ids[1])  # its next token is being computed right now
    tokens = {rid: [] for rid in ids}
    finished = {}
    for o in outputs:
        tokens[o.request_id] += o.outputs[0].delta_token_ids
    while asyn.engine.has_unfinished_requests():
        outputs, _ = asyn.engine.step()
        asyn.engine.scheduler.check_integrity()
        for o in outputs:
            tokens[o.request_id] += o.outputs[0].delta_token_ids
            if o.finished:
                finished[o.request_id] = o.outputs[0].finish_reason
    assert ids[1] not in finished and tokens[ids[1]] == expected[1]["token_ids"][:1]
    assert [tokens[ids[0]], tokens[ids[2]]] == [expected[0]["token_ids"], expected[2]["token_ids"]]
    assert asyn.engine.block_manager.num_used_blocks == 0


@pytest.mark.slow
def test_tensor_parallel_async_matches(tiny_tied_model):
    import torch

    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("needs torch.distributed with gloo")
    prompts = [[(7 * i + 3 * j + 1) % 380 for j in range(3 + 11 * i)] for i in range(6)]
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        expected = LLM(tiny_tied_model, device="cpu").generate(prompts, greedy, use_tqdm=False)
        with LLM(tiny_tied_model, device="cpu", tensor_parallel_size=2, async_scheduling=True,
                 max_num_batched_tokens=32, num_kvcache_blocks=20, max_model_len=256) as llm:
            assert llm.engine.executor.runner.share_sampled
            got = llm.generate(prompts, greedy, use_tqdm=False)
    finally:
        torch.set_num_threads(prev)
    assert [o["token_ids"] for o in got] == [o["token_ids"] for o in expected]
