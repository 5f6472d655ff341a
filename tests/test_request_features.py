"""Request features of vLLM's that its users rely on, through the Python API: the engine's ``max_logprobs``
(-1: the whole vocabulary), with vLLM's error wording."""

from __future__ import annotations

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.sampling_params import ParameterError
from tests.helpers.hf_reference import hf_logits


@pytest.fixture(scope="module")
def llm(tiny_tied_model):
    return LLM(tiny_tied_model, device="cpu", max_model_len=128, max_logprobs=30)


# ------------------------------------------------------------------ max_logprobs
def test_logprobs_up_to_max_logprobs_equal_transformers(llm, tiny_tied_model):
    prompt = llm.get_tokenizer().encode("def fibonacci(n):")
    out = llm.generate([prompt], SamplingParams(temperature=0.8, seed=5, max_tokens=4, ignore_eos=True,
                                               logprobs=25, prompt_logprobs=25), use_tqdm=False)[0]
    ids = out["token_ids"]
    ref = torch.log_softmax(hf_logits(tiny_tied_model, prompt + ids), dim=-1)  # [len, vocab]
    for j, (tok, lp) in enumerate(zip(ids, out["logprobs"])):
        top = torch.topk(ref[len(prompt) - 1 + j], 25)
        assert set(top.indices.tolist()) | {tok} == set(lp)
        for tid, val in zip(top.indices.tolist(), top.values.tolist()):
            assert lp[tid] == pytest.approx(val, abs=1e-4)
    for j in range(1, len(prompt)):
        assert set(torch.topk(ref[j - 1], 25).indices.tolist()) <= set(out["prompt_logprobs"][j])


@pytest.mark.parametrize("kwargs, message, parameter", [
    ({"logprobs": 31}, "Requested sample logprobs of 31, which is greater than max allowed: 30", "logprobs"),
    ({"prompt_logprobs": 31}, "Requested prompt logprobs of 31, which is greater than max allowed: 30",
     "prompt_logprobs"),
    ({"logprobs": -1}, "Requested sample logprobs of 448, which is greater than max allowed: 30", "logprobs"),
])
def test_logprobs_over_max_logprobs_are_refused_in_vllms_words(llm, kwargs, message, parameter):
    with pytest.raises(ParameterError, match=message) as exc:
        llm.generate(["x"], SamplingParams(**kwargs), use_tqdm=False)
    assert exc.value.parameter == parameter
    assert llm.generate(["x"], SamplingParams(max_tokens=2), use_tqdm=False)[0]["token_ids"]  # still usable


def test_max_logprobs_minus_one_allows_the_whole_vocabulary(tiny_tied_model):
    with LLM(tiny_tied_model, device="cpu", max_model_len=64, max_logprobs=-1) as llm:
        vocab = llm.engine.config.model_config.arch.vocab_size
        out = llm.generate(["def f(x):"], SamplingParams(temperature=0, max_tokens=2, logprobs=-1,
                                                         prompt_logprobs=-1), use_tqdm=False)[0]
    assert [len(lp) for lp in out["logprobs"]] == [vocab, vocab]
    assert out["prompt_logprobs"][0] is None and all(len(e) == vocab for e in out["prompt_logprobs"][1:])
    assert all(abs(torch.tensor(list(lp.values())).exp().sum().item() - 1) < 1e-3 for lp in out["logprobs"])


def test_bad_max_logprobs_and_logprobs_name_the_parameter(tiny_tied_model):
    with pytest.raises(ValueError, match="max_logprobs must be >= -1"):
        LLM(tiny_tied_model, device="cpu", max_logprobs=-2)
    for name in ("logprobs", "prompt_logprobs"):
        with pytest.raises(ValueError, match=f"{name} must be non-negative or -1, got -2"):
            SamplingParams(**{name: -2})


# ------------------------------------------------------------------ logprob_token_ids
def test_logprob_token_ids_equal_transformers_next_to_top_k_rows(llm, tiny_tied_model):
    prompt = llm.get_tokenizer().encode("def fibonacci(n):")
    ids = [300, 5, 7]
    outs = llm.generate([prompt, prompt, prompt], [
        SamplingParams(temperature=0.7, seed=1, max_tokens=4, ignore_eos=True, logprob_token_ids=ids),
        SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)], use_tqdm=False)
    out = outs[0]
    ref = torch.log_softmax(hf_logits(tiny_tied_model, prompt + out["token_ids"]), dim=-1)
    for j, (tok, lp) in enumerate(zip(out["token_ids"], out["logprobs"])):
        assert list(lp) == [tok] + [t for t in ids if t != tok]  # the token, then the ids in their order
        for tid, value in lp.items():
            assert value == pytest.approx(ref[len(prompt) - 1 + j, tid].item(), abs=1e-4)
    assert all(len(lp) in (2, 3) for lp in outs[1]["logprobs"]) and "logprobs" not in outs[2]


@pytest.mark.parametrize("kwargs, message", [
    ({"logprob_token_ids": [3, 448, -1]},
     r"token_id\(s\) \[448, -1\] in logprob_token_ids contain out-of-vocab token ids. Vocabulary size: 448"),
    ({"logprob_token_ids": [1], "logprobs": 2}, "When both logprobs and logprob_token_ids are set, logprobs must "
                                                r"equal len\(logprob_token_ids\). Got logprobs=2"),
    ({"logprob_token_ids": list(range(129))}, "Requested logprob_token_ids of length 129, which is greater than "
                                              "max allowed: 128"),
])
def test_bad_logprob_token_ids_name_the_parameter(llm, kwargs, message):
    with pytest.raises(ParameterError, match=message) as exc:
        llm.generate(["x"], SamplingParams(**kwargs), use_tqdm=False)
    assert exc.value.parameter == "logprob_token_ids"
    for bad in ([], [1.5], "12"):
        with pytest.raises(ValueError, match="logprob_token_ids must be a non-empty list of token ids"):
            SamplingParams(logprob_token_ids=bad)


# ------------------------------------------------------------------ truncation_side
def test_truncation_side_keeps_the_first_or_the_last_tokens(llm):
    prompt = [5 + (7 * i) % 200 for i in range(30)]
    greedy = dict(temperature=0, max_tokens=6, ignore_eos=True)

    def tokens(p, **kw):
        return llm.generate([p], SamplingParams(**greedy, **kw), use_tqdm=False)[0]["token_ids"]

    assert tokens(prompt, truncate_prompt_tokens=8, truncation_side="right") == tokens(prompt[:8])
    assert tokens(prompt, truncate_prompt_tokens=8) == tokens(prompt[-8:])  # left, the default
    assert tokens(prompt, truncate_prompt_tokens=8, truncation_side="left") == tokens(prompt[-8:])
    assert tokens(prompt, truncate_prompt_tokens=8, truncation_side=None) == tokens(prompt[-8:])
    assert tokens(prompt, truncate_prompt_tokens=50, truncation_side="right") == tokens(prompt)
    with pytest.raises(ValueError, match="truncation_side must be 'left' or 'right', got 'middle'"):
        SamplingParams(truncate_prompt_tokens=8, truncation_side="middle")


# ------------------------------------------------------------------ the errors clients match on
def test_every_bad_token_id_is_named(llm):
    with pytest.raises(ValueError, match=r"logit_bias keys must be token ids \(integers >= 0\), got \['a', -1\]"):
        SamplingParams(logit_bias={"a": 1.0, 3: 1.0, -1: 2.0})
    with pytest.raises(ValueError, match=r"logit_bias values must be numbers in \[-100, 100\], got \{3: 101"):
        SamplingParams(logit_bias={3: 101, 4: 1.0, 5: float("nan")})
    for name, value, bad in (("logit_bias", {448: 1.0, 3: 1.0, 500: 2.0}, "[448, 500]"),
                             ("allowed_token_ids", [3, 448, 449], "[448, 449]"),
                             ("stop_token_ids", [448, 3], "[448]")):
        with pytest.raises(ParameterError, match=rf"token_id\(s\) \{bad} in {name} contain out-of-vocab token ids. "
                                                 r"Vocabulary size: 448") as exc:
            llm.generate(["x"], SamplingParams(**{name: value}), use_tqdm=False)
        assert exc.value.parameter == name
    with pytest.raises(ParameterError, match=r"^Token id 900 is out of vocabulary") as exc:
        llm.generate([[3, 900, 448]], SamplingParams(), use_tqdm=False)
    assert exc.value.parameter == "prompt"
