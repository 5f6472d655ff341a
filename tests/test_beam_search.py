"""Beam search (``minivllm/beam_search.py``, ``LLM.beam_search``): the search against an exhaustive ranking on a toy
model, the engine's against a reference beam search on transformers' logits, width 1 against greedy, the length
penalty's ranking, and the parameters' errors."""

from __future__ import annotations

import itertools
import json
import math
import random
import shutil

import pytest
import torch

from minivllm import LLM, BeamSearchParams, SamplingParams
from minivllm.beam_search import BeamSearch, get_beam_search_score
from tests.helpers.hf_reference import hf_logits

PROMPT = [5, 17, 42, 99]


# ------------------------------------------------------------------ the search, on a toy model
def toy_logprobs(tokens: tuple[int, ...], vocab: int) -> dict[int, float]:
    """A fixed random next-token distribution per prefix (its logprobs over ``vocab`` tokens)."""
    rng = random.Random(hash(tokens))
    logits = [rng.gauss(0, 2) for _ in range(vocab)]
    norm = math.log(sum(math.exp(x) for x in logits))
    return {t: x - norm for t, x in enumerate(logits)}


def toy_search(prompt, params, eos, max_model_len=None, vocab=3):
    search = BeamSearch(prompt, params, eos, max_model_len)
    while not search.done:
        search.advance([toy_logprobs(tuple(b.tokens), vocab) for b in search.live])
    return search.best()


def exhaustive(prompt, width, max_tokens, eos, length_penalty, vocab=3):
    """Every sequence the model can end (an EOS ends it; else ``max_tokens`` does), best ``width`` by score."""
    finals = []
    for n in range(1, max_tokens + 1):
        for gen in itertools.product(range(vocab), repeat=n):
            if any(t in eos for t in gen[:-1]) or (n < max_tokens and gen[-1] not in eos):
                continue
            tokens = list(prompt) + list(gen)
            cum = sum(toy_logprobs(tuple(tokens[:i]), vocab)[tokens[i]] for i in range(len(prompt), len(tokens)))
            length = len(tokens) - (tokens[-1] in eos)
            finals.append((cum / length ** length_penalty, tokens, cum))
    finals.sort(key=lambda f: f[0], reverse=True)
    return finals[:width]


@pytest.mark.parametrize("length_penalty", [0.0, 1.0, 2.5, -1.0])
def test_a_width_that_keeps_every_prefix_ranks_like_the_exhaustive_search(length_penalty):
    # 3 tokens, EOS one of them, 3 steps: at most 2 * 2 = 4 prefixes live, so width 4 keeps them all
    params = BeamSearchParams(beam_width=4, max_tokens=3, length_penalty=length_penalty)
    got = toy_search([7, 8], params, eos={2})
    want = exhaustive([7, 8], 4, 3, {2}, length_penalty)
    assert [s.tokens for s in got] == [w[1] for w in want]
    assert [s.cum_logprob for s in got] == pytest.approx([w[2] for w in want])
    assert [s.finish_reason for s in got] == ["stop" if s.tokens[-1] == 2 else "length" for s in got]
    assert all(len(s.logprobs) == len(s.tokens) - 2 for s in got)


def test_the_length_penalty_ranks_by_its_formula():
    # a short sequence ended by EOS, and a longer one with a lower cumulative logprob
    search = BeamSearch([1, 2], BeamSearchParams(beam_width=2, max_tokens=3, length_penalty=0.0), eos_token_ids={0})
    search.advance([{0: -1.0, 5: -0.5, 6: -3.0, 7: -4.0}])   # [1, 2, 0] ends: cum -1
    search.advance([{8: -0.6, 9: -5.0, 10: -6.0, 11: -7.0}, {12: -0.1, 13: -8.0, 14: -9.0, 15: -9.5}])
    search.advance([{16: -0.5, 17: -9.0, 18: -9.0, 19: -9.0}, {20: -0.1, 21: -9.0, 22: -9.0, 23: -9.0}])
    pool = search.completed + search.live
    by_cum = [s.tokens for s in search.best()]
    assert by_cum == [[1, 2, 0], [1, 2, 5, 8, 16]]  # cum -1.0 beats -1.6
    for lp in (1.0, 2.0, -0.5):
        search.params = BeamSearchParams(beam_width=2, max_tokens=3, length_penalty=lp)
        best = search.best()
        want = sorted(pool, key=lambda s: s.cum_logprob / (len(s.tokens) - (s.tokens[-1] == 0)) ** lp, reverse=True)
        assert [s.tokens for s in best] == [s.tokens for s in want[:2]]
    # length 2 (the EOS is not counted) against 5: -1 / 2**2 = -0.25 loses to -1.6 / 5**2 = -0.064
    search.params = BeamSearchParams(beam_width=2, max_tokens=3, length_penalty=2.0)
    assert search.best()[0].tokens == [1, 2, 5, 8, 16]
    assert get_beam_search_score([1, 2, 0], -1.0, 0, 2.0) == pytest.approx(-0.25)
    assert get_beam_search_score([1, 2, 0], -1.0, None, 2.0) == pytest.approx(-1 / 9)


def test_ignore_eos_and_the_model_length():
    params = BeamSearchParams(beam_width=2, max_tokens=5, ignore_eos=True)
    got = toy_search([7], params, eos={0, 1, 2})
    assert all(len(s.tokens) == 6 and s.finish_reason == "length" for s in got)
    # a sequence that reaches max_model_len cannot grow: it ends there with "length"
    got = toy_search([7], BeamSearchParams(beam_width=2, max_tokens=5, ignore_eos=True), eos=(), max_model_len=3)
    assert all(len(s.tokens) == 3 and s.finish_reason == "length" for s in got)


@pytest.mark.parametrize("kwargs, name", [
    ({"beam_width": 0}, "beam_width"), ({"beam_width": "2"}, "beam_width"), ({"beam_width": True}, "beam_width"),
    ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": 2.5}, "max_tokens"),
    ({"temperature": -1.0}, "temperature"), ({"temperature": math.nan}, "temperature"),
    ({"length_penalty": math.inf}, "length_penalty"), ({"ignore_eos": "yes"}, "ignore_eos"),
    ({"include_stop_str_in_output": 1}, "include_stop_str_in_output"),
])
def test_bad_parameters_name_themselves(kwargs, name):
    with pytest.raises(ValueError, match=f"^{name}"):
        BeamSearchParams(**{"beam_width": 2, "max_tokens": 4, **kwargs})


def test_the_width_fits_the_engines_max_logprobs():
    """Each step asks for 2 x beam_width logprobs: a width the engine cannot serve is an error naming it."""
    params = BeamSearchParams(beam_width=11, max_tokens=4)
    with pytest.raises(ValueError, match="^beam_width 11 is too large.*max_logprobs = 20"):
        params.check_width(20)
    params.check_width(22)
    params.check_width(-1)  # the whole vocabulary


# ------------------------------------------------------------------ the engine, against transformers
def reference_beam_search(path, prompt, width, max_tokens, eos, length_penalty=1.0):
    """vLLM's beam search written plainly, on transformers' logits: (tokens, cumulative logprob), best first."""
    live, done = [(list(prompt), 0.0)], []
    for _ in range(max_tokens):
        grown = []
        for tokens, cum in live:
            top = torch.topk(torch.log_softmax(hf_logits(path, tokens)[-1], dim=-1), 2 * width)
            for logprob, t in zip(top.values.tolist(), top.indices.tolist()):
                (done if t in eos else grown).append((tokens + [t], cum + logprob))
        live = sorted(grown, key=lambda s: s[1], reverse=True)[:width]

    def score(s):
        return s[1] / (len(s[0]) - (s[0][-1] in eos)) ** length_penalty

    return sorted(done + live, key=score, reverse=True)[:width]


@pytest.fixture(scope="module")
def llm(tiny_tied_model):
    with LLM(tiny_tied_model, device="cpu") as llm:
        yield llm


@pytest.fixture(scope="module")
def eos_model(tiny_tied_model, tmp_path_factory):
    """The tiny model with an EOS the model often picks: the second most likely token after ``PROMPT``."""
    eos = torch.topk(hf_logits(tiny_tied_model, PROMPT)[-1], 2).indices[1].item()
    path = tmp_path_factory.mktemp("eos-model") / "m"
    shutil.copytree(tiny_tied_model, path)
    for name in ("config.json", "generation_config.json"):
        if (path / name).exists():
            cfg = json.loads((path / name).read_text())
            cfg["eos_token_id"] = eos
            (path / name).write_text(json.dumps(cfg))
    return str(path), eos


@pytest.mark.parametrize("width, max_tokens", [(2, 4), (3, 3)])
def test_engine_beam_search_equals_a_reference_on_transformers_logits(llm, tiny_tied_model, width, max_tokens):
    params = BeamSearchParams(beam_width=width, max_tokens=max_tokens, ignore_eos=True)
    (out,) = llm.beam_search([PROMPT], params)
    want = reference_beam_search(tiny_tied_model, PROMPT, width, max_tokens, eos=())
    assert [s.tokens for s in out.sequences] == [w[0] for w in want]
    assert [s.cum_logprob for s in out.sequences] == pytest.approx([w[1] for w in want], abs=1e-4)
    for s in out.sequences:
        assert s.finish_reason == "length" and len(s.logprobs) == max_tokens
        assert s.cum_logprob == pytest.approx(sum(lp[t] for lp, t in zip(s.logprobs, s.tokens[len(PROMPT):])))
        assert s.text == llm.get_tokenizer().decode([t for t in s.tokens if t < len(llm.get_tokenizer())])


@pytest.mark.parametrize("length_penalty", [0.0, 1.0, 3.0])
def test_eos_ends_sequences_and_the_length_penalty_ranks_them(eos_model, length_penalty):
    path, eos = eos_model
    with LLM(path, device="cpu") as llm:
        (out,) = llm.beam_search([{"prompt_token_ids": PROMPT}],
                                 BeamSearchParams(beam_width=3, max_tokens=4, length_penalty=length_penalty))
    want = reference_beam_search(path, PROMPT, 3, 4, eos={eos}, length_penalty=length_penalty)
    assert [s.tokens for s in out.sequences] == [w[0] for w in want]
    assert {s.finish_reason for s in out.sequences} <= {"stop", "length"}
    stopped = [s for s in out.sequences if s.finish_reason == "stop"]
    assert all(s.tokens[-1] == eos for s in stopped)
    if length_penalty == 0.0:  # the EOS right after the prompt is the best cumulative logprob of all
        assert out.sequences[0].tokens == PROMPT + [eos]
    if length_penalty == 3.0:  # the penalty's exponent favours the long sequences: the short one falls behind
        assert out.sequences[0].finish_reason == "length"


def test_width_1_equals_greedy(llm):
    prompts = ["def f(x):", [3, 1, 4, 1, 5, 9, 2, 6]]
    greedy = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), use_tqdm=False)
    beams = llm.beam_search(prompts, BeamSearchParams(beam_width=1, max_tokens=6, ignore_eos=True))
    ids = [llm.get_tokenizer().encode(prompts[0]), prompts[1]]
    for g, b, p in zip(greedy, beams, ids):
        (seq,) = b.sequences
        assert seq.tokens == p + g["token_ids"]


def test_prompts_in_every_shape_and_a_concurrency_limit(llm):
    text = "import os"
    ids = llm.get_tokenizer().encode(text)
    params = BeamSearchParams(beam_width=2, max_tokens=3, ignore_eos=True)
    together = llm.beam_search([text, ids, {"prompt": text}, {"prompt_token_ids": PROMPT}], params)
    one_at_a_time = llm.beam_search([text, ids, {"prompt": text}, {"prompt_token_ids": PROMPT}], params,
                                    concurrency_limit=1)
    assert [[s.tokens for s in o.sequences] for o in together] == \
        [[s.tokens for s in o.sequences] for o in one_at_a_time]
    assert [s.tokens for s in together[0].sequences] == [s.tokens for s in together[1].sequences]
    assert together[0].sequences[0].text.startswith(text)
    assert [s.tokens for s in llm.beam_search(text, params)[0].sequences] == \
        [s.tokens for s in together[0].sequences]


def test_sequences_stop_at_the_model_length(tiny_tied_model):
    with LLM(tiny_tied_model, device="cpu", max_model_len=8) as small:
        (out,) = small.beam_search([PROMPT], BeamSearchParams(beam_width=2, max_tokens=10, ignore_eos=True))
    assert [len(s.tokens) for s in out.sequences] == [8, 8]
    assert {s.finish_reason for s in out.sequences} == {"length"}


@pytest.mark.parametrize("prompts, params, match", [
    ([PROMPT], SamplingParams(), "^params"),
    ([PROMPT], None, "^params"),
    ([[]], BeamSearchParams(beam_width=2, max_tokens=2), "^the prompt is empty"),
    ([PROMPT, [1] * 4096], BeamSearchParams(beam_width=2, max_tokens=2), "^the prompt has 4096 tokens"),
    ([[1, 99999]], BeamSearchParams(beam_width=2, max_tokens=2), "^prompt token id 99999"),
    ([[1, "a"]], BeamSearchParams(beam_width=2, max_tokens=2), "^a prompt must be"),
    ([{"text": "x"}], BeamSearchParams(beam_width=2, max_tokens=2), "^a prompt dict needs"),
    (7, BeamSearchParams(beam_width=2, max_tokens=2), "^prompts must be"),
])
def test_bad_input_raises_before_anything_runs(llm, prompts, params, match):
    with pytest.raises(ValueError, match=match):
        llm.beam_search(prompts, params)
    with pytest.raises(ValueError, match="^concurrency_limit"):
        llm.beam_search([PROMPT], BeamSearchParams(beam_width=2, max_tokens=2), concurrency_limit=0)
    assert not llm.engine.has_unfinished_requests()
    assert len(llm.beam_search([PROMPT], BeamSearchParams(beam_width=2, max_tokens=2))[0].sequences) == 2
