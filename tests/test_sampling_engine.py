"""Sampling through the whole engine: seeds, n, stop strings, logprobs (against transformers)."""

import pytest
import torch

from minivllm import LLM, SamplingParams
from tests.helpers.hf_reference import hf_logits


@pytest.fixture(scope="module")
def llm(tiny_tied_model):
    return LLM(tiny_tied_model, device="cpu")


def test_top_k_1_equals_greedy(llm):
    prompts = ["def f(x):", "import sys", "class A:"]
    greedy = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)
    topk1 = llm.generate(prompts, SamplingParams(temperature=0.8, top_k=1, max_tokens=16, ignore_eos=True),
                         use_tqdm=False)
    assert [o["token_ids"] for o in topk1] == [o["token_ids"] for o in greedy]


def test_seeded_request_is_independent_of_its_batch(llm):
    seeded = SamplingParams(temperature=1.0, seed=1234, max_tokens=24, ignore_eos=True)
    alone = llm.generate(["def f(x):"], seeded, use_tqdm=False)[0]["token_ids"]
    others = [SamplingParams(temperature=1.0, max_tokens=30, ignore_eos=True),
              SamplingParams(temperature=0.7, seed=99, top_p=0.9, max_tokens=10, ignore_eos=True),
              seeded, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)]
    batch = llm.generate(["import os", "while x:", "def f(x):", "class B:"], others, use_tqdm=False)
    assert batch[2]["token_ids"] == alone
    other_seeds = {tuple(llm.generate(["def f(x):"], SamplingParams(temperature=1.0, seed=s, max_tokens=24,
                                                                       ignore_eos=True), use_tqdm=False)[0]["token_ids"])
                   for s in (1, 2, 3)}
    assert len(other_seeds | {tuple(alone)}) == 4


def test_n_completions_share_the_prompt_blocks(llm):
    prompt = llm.get_tokenizer().encode("# shared prompt for n completions " * 4)[:40]
    params = SamplingParams(n=4, temperature=1.0, seed=7, max_tokens=8, ignore_eos=True)
    rid = llm.engine.add_request(prompt, params)
    seqs = llm.engine._requests[rid].seqs
    llm.engine.step()
    assert [s.num_cached_tokens for s in seqs] == [0, 32, 32, 32]  # two full blocks reused by 3 siblings
    bm = llm.engine.block_manager
    assert len({tuple(bm.block_table(s.seq_id)[:2]) for s in seqs}) == 1
    assert bm.managers[0].blocks[bm.block_table(seqs[0].seq_id)[0]].ref_count == 4  # one KV cache group
    bm.check_integrity()
    final = None
    while llm.engine.has_unfinished_requests():
        for o in llm.engine.step()[0]:
            final = o
    assert len(final.outputs) == 4 and all(len(c.token_ids) == 8 for c in final.outputs)
    assert len({tuple(c.token_ids) for c in final.outputs}) > 1  # siblings get their own seeds
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    assert len(out["outputs"]) == 4


def test_stop_string_across_two_tokens_stops_and_is_cut(llm):
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    full = llm.generate(["def compute(values):"], greedy, use_tqdm=False)[0]
    pieces = [llm.engine.decode([t]) for t in full["token_ids"]]
    # a boundary after token i where both sides have at least one character
    i = next(i for i in range(2, len(pieces) - 1) if pieces[i] and pieces[i + 1].strip())
    stop = pieces[i][-1] + pieces[i + 1][:2]
    prefix = "".join(pieces[: i + 1])[:-1]
    assert stop not in prefix  # the first occurrence is the one across the boundary
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop=[stop])
    cut = llm.generate(["def compute(values):"], params, use_tqdm=False)[0]
    assert cut["finish_reason"] == "stop" and cut["text"] == prefix
    assert len(cut["token_ids"]) == i + 2
    kept = llm.generate(["def compute(values):"], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True,
                                                                  stop=[stop], include_stop_str_in_output=True),
                        use_tqdm=False)[0]
    assert kept["text"] == prefix + stop


def test_logprobs_match_transformers_log_softmax(llm, tiny_tied_model):
    prompt = llm.get_tokenizer().encode("def fibonacci(n):")
    out = llm.generate([prompt], SamplingParams(temperature=0.9, seed=3, max_tokens=12, ignore_eos=True,
                                               logprobs=3), use_tqdm=False)[0]
    ids = out["token_ids"]
    ref = torch.log_softmax(hf_logits(tiny_tied_model, prompt + ids), dim=-1)  # [len, vocab]
    for j, (tok, lp) in enumerate(zip(ids, out["logprobs"])):
        row = ref[len(prompt) - 1 + j]
        assert lp[tok] == pytest.approx(row[tok].item(), abs=1e-4)
        top = torch.topk(row, 3)
        for tid, val in zip(top.indices.tolist(), top.values.tolist()):
            assert lp[tid] == pytest.approx(val, abs=1e-4)


def test_min_tokens_and_stop_token_ids(llm):
    out = llm.generate(["x"], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True), use_tqdm=False)[0]
    first = out["token_ids"][0]
    stopped = llm.generate(["x"], SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[first]),
                           use_tqdm=False)[0]
    assert stopped["token_ids"] == [first] and stopped["finish_reason"] == "stop"
    delayed = llm.generate(["x"], SamplingParams(temperature=0, max_tokens=20, min_tokens=5,
                                                 stop_token_ids=[first]), use_tqdm=False)[0]
    assert len(delayed["token_ids"]) >= 5 and first not in delayed["token_ids"][:4]
