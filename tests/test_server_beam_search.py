"""Beam search over HTTP (``use_beam_search``), through the ``openai`` client against a real server: completions and
chat give the n best beams of ``LLM.beam_search``, best first; ``best_of`` widens the search; a streamed chat sends
them whole; width 1 is greedy; fields beam search cannot honour are 400s naming them; a client that leaves aborts
the search."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from minivllm import LLM, BeamSearchParams
from tests.helpers.server_utils import running_server

pytestmark = pytest.mark.server
NAME = "tiny"
ARGS = ["--served-model-name", NAME, "--device", "cpu", "--max-model-len", "256", "--num-kvcache-blocks", "128",
        "--dtype", "float32"]
PROMPT = [5 + (7 * i) % 200 for i in range(12)]
MSGS = [{"role": "user", "content": "def add(a, b):"}]


@pytest.fixture(scope="module")
def server(tiny_tied_model, tmp_path_factory):
    with running_server(tiny_tied_model, ARGS, tmp_path_factory.mktemp("beam")) as srv:
        yield srv


@pytest.fixture(scope="module")
def offline(tiny_tied_model):
    with LLM(tiny_tied_model, device="cpu", max_model_len=256) as llm:
        yield llm


def generated(offline, prompt, width, max_tokens, **kw) -> list[tuple[list[int], float]]:
    """``LLM.beam_search``'s sequences as (generated tokens, cumulative logprob), best first."""
    (out,) = offline.beam_search([prompt], BeamSearchParams(beam_width=width, max_tokens=max_tokens, **kw))
    return [(s.tokens[len(prompt):], s.cum_logprob) for s in out.sequences]


def test_completions_return_the_n_best_beams_best_first(server, offline):
    out = server.client.completions.create(
        model=NAME, prompt=PROMPT, max_tokens=5, n=3, logprobs=0,
        extra_body={"use_beam_search": True, "ignore_eos": True, "return_token_ids": True, "length_penalty": 0.0})
    want = generated(offline, PROMPT, 3, 5, ignore_eos=True)
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert [c.model_extra["token_ids"] for c in out.choices] == [w[0] for w in want]
    sums = [sum(c.logprobs.token_logprobs) for c in out.choices]
    assert sums == pytest.approx([w[1] for w in want], abs=1e-4)
    assert sums == sorted(sums, reverse=True)  # length_penalty 0 ranks by cumulative logprob
    assert all(c.finish_reason == "length" for c in out.choices)
    assert out.usage.prompt_tokens == len(PROMPT) and out.usage.completion_tokens == 15


def test_best_of_is_the_width_and_n_the_beams_returned(server, offline):
    ids = offline.get_tokenizer().encode("def f(x):")
    body = {"model": NAME, "prompt": [ids, PROMPT], "max_tokens": 4, "n": 2, "best_of": 4, "use_beam_search": True,
            "ignore_eos": True, "return_token_ids": True, "temperature": 0}
    out = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
    assert [c["index"] for c in out["choices"]] == [0, 1, 2, 3]
    assert [c["token_ids"] for c in out["choices"][:2]] == [w[0] for w in generated(offline, ids, 4, 4,
                                                                                   ignore_eos=True)[:2]]
    assert [c["token_ids"] for c in out["choices"][2:]] == [w[0] for w in generated(offline, PROMPT, 4, 4,
                                                                                   ignore_eos=True)[:2]]
    assert out["choices"][0]["text"] == offline.get_tokenizer().decode(out["choices"][0]["token_ids"])


def test_width_1_equals_greedy(server):
    kw = dict(model=NAME, prompt="import os", max_tokens=6, temperature=0)
    greedy = server.client.completions.create(**kw, extra_body={"ignore_eos": True, "return_token_ids": True})
    beam = server.client.completions.create(**kw, extra_body={"ignore_eos": True, "return_token_ids": True,
                                                               "use_beam_search": True})
    assert beam.choices[0].model_extra["token_ids"] == greedy.choices[0].model_extra["token_ids"]
    assert beam.choices[0].text == greedy.choices[0].text


def test_echo_with_logprobs_scores_the_prompt_too(server):
    out = server.client.completions.create(model=NAME, prompt="def f(x):", max_tokens=3, n=2, echo=True,
                                           logprobs=1, extra_body={"use_beam_search": True, "ignore_eos": True,
                                                                   "return_token_ids": True})
    for c in out.choices:
        prompt_ids = c.model_extra["prompt_token_ids"]
        assert c.text.startswith("def f(x):") and len(c.logprobs.tokens) == len(prompt_ids) + 3
        assert c.logprobs.token_logprobs[0] is None and all(isinstance(v, float) for v in c.logprobs.token_logprobs[1:])


def test_chat_returns_the_n_best_beams_streamed_or_not(server, offline):
    kw = dict(model=NAME, messages=MSGS, max_tokens=4, n=2)
    extra = {"use_beam_search": True, "ignore_eos": True, "return_token_ids": True}
    out = server.client.chat.completions.create(**kw, logprobs=True, top_logprobs=2, extra_body=extra)
    prompt_ids = out.model_extra["prompt_token_ids"]
    want = generated(offline, prompt_ids, 2, 4, ignore_eos=True)
    assert [c.model_extra["token_ids"] for c in out.choices] == [w[0] for w in want]
    assert [sum(t.logprob for t in c.logprobs.content) for c in out.choices] == \
        pytest.approx([w[1] for w in want], abs=1e-4)
    assert all(len(t.top_logprobs) == 2 for c in out.choices for t in c.logprobs.content)
    content: dict[int, str] = {}
    finish = {}
    for chunk in server.client.chat.completions.create(**kw, stream=True, extra_body=extra):
        for c in chunk.choices:
            content[c.index] = content.get(c.index, "") + (c.delta.content or "")
            finish[c.index] = c.finish_reason or finish.get(c.index)
    assert content == {c.index: c.message.content for c in out.choices}
    assert finish == {0: "length", 1: "length"}


def _post(server, path, body):
    base = {"model": NAME, "max_tokens": 3, "use_beam_search": True}
    base.update({"prompt": "x"} if path == "/v1/completions" else {"messages": MSGS})
    return httpx.post(server.url + path, content=json.dumps({**base, **body}, allow_nan=True),
                      headers={"content-type": "application/json"}, timeout=60)


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {"stream": True}, "stream"),
    ("/v1/completions", {"top_p": 0.5}, "top_p"), ("/v1/chat/completions", {"top_k": 5}, "top_k"),
    ("/v1/completions", {"min_p": 0.1}, "min_p"), ("/v1/completions", {"repetition_penalty": 1.2}, "repetition_penalty"),
    ("/v1/completions", {"presence_penalty": 1}, "presence_penalty"),
    ("/v1/chat/completions", {"frequency_penalty": 1}, "frequency_penalty"),
    ("/v1/completions", {"stop": ["\n"]}, "stop"), ("/v1/chat/completions", {"stop": "x"}, "stop"),
    ("/v1/completions", {"stop_token_ids": [3]}, "stop_token_ids"), ("/v1/completions", {"min_tokens": 2}, "min_tokens"),
    ("/v1/completions", {"logit_bias": {"5": 10}}, "logit_bias"),
    ("/v1/completions", {"allowed_token_ids": [5, 6]}, "allowed_token_ids"),
    ("/v1/completions", {"bad_words": ["x"]}, "bad_words"),
    ("/v1/completions", {"response_format": {"type": "json_object"}}, "response_format"),
    ("/v1/chat/completions", {"structured_outputs": {"regex": "a+"}}, "structured_outputs"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"},
     "tool_choice"),
    ("/v1/completions", {"n": 11}, "n"), ("/v1/chat/completions", {"n": 2, "best_of": 11}, "best_of"),
    ("/v1/completions", {"n": 3, "best_of": 2}, "best_of"), ("/v1/completions", {"n": 0}, "n"),
    ("/v1/completions", {"length_penalty": float("nan")}, "length_penalty"),
    ("/v1/completions", {"length_penalty": "long"}, "length_penalty"),
    ("/v1/chat/completions", {"temperature": -1}, "temperature"), ("/v1/completions", {"max_tokens": 0}, "max_tokens"),
])
def test_fields_beam_search_cannot_honour_are_400s_naming_them(server, path, body, param):
    r = _post(server, path, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error", err


def test_a_prompt_without_room_for_max_tokens_is_a_400(server):
    r = _post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 250})
    assert r.status_code == 400 and "maximum context length is 256" in r.json()["error"]["message"]


def test_a_client_that_leaves_aborts_the_search(server):
    def finished() -> float:  # the engine requests that ended (one per beam and step)
        return sum(v for k, v in server.metrics().items() if k.startswith("vllm:request_success_total"))

    steps, width = 244, 4
    body = json.dumps({"model": NAME, "prompt": PROMPT, "max_tokens": steps, "n": width, "use_beam_search": True,
                       "ignore_eos": True}).encode()
    before = finished()
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        while finished() < before + 2 * width:  # the search is under way: leave
            time.sleep(0.05)
    server.wait_idle(60)
    assert finished() < before + steps * width  # it stopped long before its last step
    ok = _post(server, "/v1/completions", {"n": 2})
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 2
