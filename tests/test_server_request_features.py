"""vLLM's request features that its users' code relies on, over HTTP through the official openai client on the
demo model: logprobs up to the engine's --max-logprobs, in vLLM's words beyond it."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.helpers.server_utils import ROOT, running_server

pytestmark = [pytest.mark.server,
              pytest.mark.skipif(not (ROOT / "models" / "minivllm-demo-py").is_dir(), reason="no demo model")]
DEMO = str(ROOT / "models" / "minivllm-demo-py")
NAME = "demo"
ARGS = ["--served-model-name", NAME, "--device", "cpu", "--max-model-len", "512", "--max-logprobs", "30"]
USER = [{"role": "user", "content": "What does `bisect.insort` do?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(DEMO, ARGS, tmp_path_factory.mktemp("request-features")) as srv:
        yield srv


def post(server, path: str, body: dict, status: int = 200) -> dict:
    r = httpx.post(server.url + path, json={"model": NAME, **body}, timeout=60)
    assert r.status_code == status, r.text
    return r.json()


def bad_request(create, **kw) -> dict:
    """The OpenAI-shaped error body of ``create(model=NAME, **kw)``, which must get a 400."""
    with pytest.raises(openai.BadRequestError) as exc:
        create(model=NAME, **kw)
    err = exc.value.body
    assert exc.value.status_code == 400 and err["type"] == "invalid_request_error", err
    return err


# ------------------------------------------------------------------ --max-logprobs
def test_logprobs_up_to_max_logprobs(server):
    out = server.client.completions.create(model=NAME, prompt="def f(x):", max_tokens=3, temperature=0, logprobs=25,
                                           extra_body={"ignore_eos": True})
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == 3 and all(len(top) == 25 for top in lp.top_logprobs)  # greedy: the token is in them
    chat = server.client.chat.completions.create(model=NAME, messages=USER, max_tokens=3, temperature=0,
                                                 logprobs=True, top_logprobs=25, extra_body={"ignore_eos": True})
    content = chat.choices[0].logprobs.content
    assert len(content) == 3 and all(len(c.top_logprobs) == 25 for c in content)
    assert all(c.top_logprobs[0].token == c.token for c in content)
    streamed = [c for chunk in server.client.chat.completions.create(
        model=NAME, messages=USER, max_tokens=3, temperature=0, logprobs=True, top_logprobs=25, stream=True,
        extra_body={"ignore_eos": True}) for choice in chunk.choices if choice.logprobs for c in choice.logprobs.content]
    assert [c.token for c in streamed] == [c.token for c in content]
    assert all(len(c.top_logprobs) == 25 for c in streamed)


def test_logprobs_over_max_logprobs_get_a_400_naming_the_limit(server):
    completions, chat = server.client.completions.create, server.client.chat.completions.create
    err = bad_request(completions, prompt="x", max_tokens=2, logprobs=31)
    assert err["message"] == "Requested sample logprobs of 31, which is greater than max allowed: 30"
    assert err["param"] == "logprobs"
    for stream in (False, True):
        err = bad_request(chat, messages=USER, max_tokens=2, logprobs=True, top_logprobs=31, stream=stream)
        assert err["param"] == "top_logprobs" and "max allowed: 30" in err["message"]
    err = bad_request(completions, prompt="x", max_tokens=2, extra_body={"prompt_logprobs": 40})
    assert err["param"] == "prompt_logprobs" and err["message"].startswith("Requested prompt logprobs of 40")
    err = bad_request(chat, messages=USER, max_tokens=2, logprobs=True, top_logprobs=-1)
    assert err["param"] == "top_logprobs" and "Requested sample logprobs of 4032" in err["message"]
    assert bad_request(completions, prompt="x", max_tokens=2, logprobs=-3)["param"] == "logprobs"
