"""vLLM's request features that its users' code relies on, over HTTP through the official openai client on the
demo model: logprobs up to the engine's --max-logprobs, logprob_token_ids, truncation_side, int64 seeds, the error
messages clients match on, and the token strings and ids of logprobs and echo."""

from __future__ import annotations

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from tests.helpers.server_utils import ROOT, running_server

pytestmark = [pytest.mark.server,
              pytest.mark.skipif(not (ROOT / "models" / "minivllm-demo-py").is_dir(), reason="no demo model")]
DEMO = str(ROOT / "models" / "minivllm-demo-py")
NAME = "demo"
# NOTE: --return-tokens-as-token-ids makes "token_id:N" the default of the requests that do not say
ARGS = ["--served-model-name", NAME, "--device", "cpu", "--max-model-len", "512", "--max-logprobs", "30",
        "--return-tokens-as-token-ids"]
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


# ------------------------------------------------------------------ logprob_token_ids
def test_logprob_token_ids_in_completions_and_chat_streamed_and_not(server):
    body = {"max_tokens": 4, "temperature": 0, "ignore_eos": True}
    top = post(server, "/v1/completions", {**body, "prompt": "def f(x):", "logprobs": 5,
                                           "return_tokens_as_token_ids": True})["choices"][0]["logprobs"]
    # the first generated token's {"token_id:N": logprob}: the token (greedy: the most likely), then the others
    by_id = {int(t.removeprefix("token_id:")): v for t, v in top["top_logprobs"][0].items()}
    want = list(by_id)
    ids = [want[-1], 7, want[1]]  # two of the most likely, in another order, and an unlikely one
    assert len(want) == 5 and 7 not in want
    out = server.client.completions.create(model=NAME, prompt="def f(x):", logprobs=1,
                                           extra_body={**body, "logprob_token_ids": ids,
                                                       "return_tokens_as_token_ids": True})
    lp = out.choices[0].logprobs
    assert lp.tokens[0] == f"token_id:{want[0]}"
    for step in lp.top_logprobs:  # the token first, then the ids in their order
        assert list(step)[1:] == [f"token_id:{t}" for t in ids] and len(step) == 4
    step0 = lp.top_logprobs[0]
    assert step0[f"token_id:{ids[0]}"] == pytest.approx(by_id[ids[0]], abs=1e-5)
    assert step0[f"token_id:{ids[2]}"] == pytest.approx(by_id[ids[2]], abs=1e-5)
    assert step0["token_id:7"] < min(by_id.values())

    chat_kw = dict(model=NAME, messages=USER, logprobs=True, max_tokens=4, temperature=0,
                   extra_body={"ignore_eos": True, "logprob_token_ids": ids, "return_tokens_as_token_ids": True})
    whole = server.client.chat.completions.create(**chat_kw).choices[0].logprobs.content
    assert len(whole) == 4
    for c in whole:
        assert [t.token for t in c.top_logprobs] == [c.token] + [f"token_id:{t}" for t in ids
                                                                  if f"token_id:{t}" != c.token]
    streamed = [c for chunk in server.client.chat.completions.create(**chat_kw, stream=True)
                for choice in chunk.choices if choice.logprobs for c in choice.logprobs.content]
    assert [[(t.token, t.logprob) for t in c.top_logprobs] for c in streamed] == \
        [[(t.token, t.logprob) for t in c.top_logprobs] for c in whole]
    events = [e for e in server.client.completions.create(model=NAME, prompt="def f(x):", logprobs=1, stream=True,
                                                          extra_body={**body, "logprob_token_ids": ids})]
    tops = [t for e in events for c in e.choices if c.logprobs for t in c.logprobs.top_logprobs]
    assert len(tops) == 4 and all(len(t) == 4 for t in tops)


def test_bad_logprob_token_ids_get_a_400_naming_them(server):
    completions, chat = server.client.completions.create, server.client.chat.completions.create
    err = bad_request(completions, prompt="x", logprobs=1, extra_body={"logprob_token_ids": [3, 4032, -1]})
    assert err["param"] == "logprob_token_ids"
    assert err["message"] == ("token_id(s) [4032, -1] in logprob_token_ids contain out-of-vocab token ids. "
                              "Vocabulary size: 4032")
    err = bad_request(chat, messages=USER, logprobs=True, extra_body={"logprob_token_ids": []})
    assert err["param"] == "logprob_token_ids" and err["message"] == "`logprob_token_ids` must not be an empty list."
    err = bad_request(chat, messages=USER, extra_body={"logprob_token_ids": [3]})
    assert err["message"] == "when using `logprob_token_ids`, `logprobs` must be set to true."
    err = bad_request(completions, prompt="x", extra_body={"logprob_token_ids": [3]})
    assert err["message"] == "when using `logprob_token_ids`, `logprobs` must be set."
    err = bad_request(completions, prompt="x", logprobs=1, extra_body={"logprob_token_ids": list(range(129))})
    assert err["param"] == "logprob_token_ids" and "greater than max allowed: 128" in err["message"]


# ------------------------------------------------------------------ truncation_side
def test_truncation_side(server):
    prompt = [100 + 3 * i for i in range(20)]
    body = {"max_tokens": 1, "truncate_prompt_tokens": 6, "return_token_ids": True}
    for side, want in (("right", prompt[:6]), ("left", prompt[-6:]), (None, prompt[-6:])):
        out = server.client.completions.create(model=NAME, prompt=prompt, extra_body={**body, "truncation_side": side})
        assert out.choices[0].model_extra["prompt_token_ids"] == want and out.usage.prompt_tokens == 6
    text = "def add(a, b):\n    return a + b\n"
    ids = post(server, "/tokenize", {"prompt": text})["tokens"]
    out = post(server, "/v1/completions", {**body, "prompt": text, "truncation_side": "right", "echo": True})
    assert out["choices"][0]["prompt_token_ids"] == ids[:6]
    assert out["choices"][0]["text"].startswith(post(server, "/detokenize", {"tokens": ids[:6]})["prompt"])
    rendered = post(server, "/tokenize", {"messages": USER})["tokens"]
    chat = server.client.chat.completions.create(model=NAME, messages=USER, max_tokens=1,
                                                 extra_body={**body, "truncation_side": "right"})
    assert chat.model_extra["prompt_token_ids"] == rendered[:6]
    err = bad_request(server.client.completions.create, prompt="x", extra_body={"truncation_side": "middle"})
    assert err["param"] == "truncation_side"


# ------------------------------------------------------------------ seed
def test_a_seed_outside_int64_gets_a_400(server):
    for seed in (2**63, -(2**63) - 1, 2**70):
        err = bad_request(server.client.completions.create, prompt="x", max_tokens=2, seed=seed)
        assert err["param"] == "seed"
        err = bad_request(server.client.chat.completions.create, messages=USER, max_tokens=2, seed=seed, stream=True)
        assert err["param"] == "seed"
    for seed in (2**63 - 1, -(2**63)):  # the ends of int64 are seeds
        twice = [server.client.completions.create(model=NAME, prompt="x", max_tokens=4, seed=seed, temperature=1,
                                                  extra_body={"ignore_eos": True}).choices[0].text for _ in range(2)]
        assert twice[0] == twice[1]


# ------------------------------------------------------------------ the errors clients match on
def test_every_bad_logit_bias_key_is_named(server):
    completions, chat = server.client.completions.create, server.client.chat.completions.create
    err = bad_request(chat, messages=USER, max_tokens=2, logit_bias={"bad1": 50.0, "bad2": 20.0, "7": 1.0})
    assert err["param"] == "logit_bias"
    assert err["message"] == ("logit_bias contains key(s) that cannot be converted to integer token IDs: "
                              "['bad1', 'bad2']")
    err = bad_request(completions, prompt="x", max_tokens=2, logit_bias={"4033": 1, "5": 1, "99999": -1})
    assert err["param"] == "logit_bias"
    assert err["message"] == ("token_id(s) [4033, 99999] in logit_bias contain out-of-vocab token ids. "
                              "Vocabulary size: 4032")
    err = bad_request(completions, prompt="x", max_tokens=2, logit_bias={"-1": 1, "-2": 1})
    assert err["param"] == "logit_bias" and "[-1, -2]" in err["message"]
    err = bad_request(chat, messages=USER, max_tokens=2, logit_bias={"1": 101, "2": -300})
    assert err["param"] == "logit_bias" and "1: 101" in err["message"] and "2: -300" in err["message"]
    assert err["message"].startswith("logit_bias values must be numbers in [-100, 100]")
    ok = chat(model=NAME, messages=USER, max_tokens=2, logit_bias={"4031": 1.0})
    assert ok.choices[0].finish_reason in ("length", "stop")


def test_an_empty_prompt_gets_vllms_error(server):
    completions = server.client.completions.create
    for prompt in ("", [], None):
        err = bad_request(completions, prompt=prompt, max_tokens=2)
        assert err["message"] == "Either prompt or prompt_embeds must be provided and non-empty."
        assert err["param"] == "prompt"
    for prompt in ([""], ["x", ""], [[1], []]):
        err = bad_request(completions, prompt=prompt, max_tokens=2)
        assert err["message"] == "The decoder prompt cannot be empty" and err["param"] == "prompt"
    err = bad_request(completions, prompt="x", max_tokens=2, extra_body={"truncation_side": "right",
                                                                         "truncate_prompt_tokens": 0})
    assert err["param"] == "truncate_prompt_tokens"


def test_token_ids_out_of_the_vocabulary_get_vllms_error(server):
    completions, chat = server.client.completions.create, server.client.chat.completions.create
    for prompt, bad in (([999999], 999999), ([5, 4032, 4100], 4100), ([[1, 2], [3, -7]], -7)):
        err = bad_request(completions, prompt=prompt, max_tokens=2)
        assert err["param"] == "prompt" and err["message"].startswith(f"Token id {bad} is out of vocabulary")
    for field, value in (("stop_token_ids", [4032, 3]), ("allowed_token_ids", [3, 4032, 5000])):
        err = bad_request(chat, messages=USER, max_tokens=2, extra_body={field: value})
        assert err["param"] == field and "4032" in err["message"] and "Vocabulary size: 4032" in err["message"]
    err = bad_request(chat, messages=USER, max_tokens=2, extra_body={"stop_token_ids": [-1]})
    assert err["param"] == "stop_token_ids"


# ------------------------------------------------------------------ token strings and ids
def test_completion_tokens_as_token_ids_with_echo(server):
    """vLLM's test_return_tokens_as_ids: the server's flag, or the request's field, names every token of the echoed
    prompt and of the completion ``token_id:N``, the first key of each top_logprobs; they decode to the text."""
    tokenizer = AutoTokenizer.from_pretrained(DEMO)
    prompt = "<|im_start|>Say 'Hello, world! \U0001f389'"  # a special token, and an emoji over several tokens
    for extra in ({}, {"return_tokens_as_token_ids": True}):
        out = server.client.completions.create(model=NAME, prompt=prompt, echo=True, temperature=0, max_tokens=10,
                                               logprobs=1, extra_body={"ignore_eos": True, **extra})
        c = out.choices[0]
        assert c.text.startswith(prompt)  # a text prompt is echoed as sent
        tokens = c.logprobs.tokens
        assert all(t.startswith("token_id:") for t in tokens) and c.logprobs.top_logprobs[0] is None
        assert tokens[1:] == [next(iter(top)) for top in c.logprobs.top_logprobs[1:]]
        ids = [int(t.removeprefix("token_id:")) for t in tokens]
        assert ids[:len(tokenizer.encode(prompt))] == tokenizer.encode(prompt)
        assert c.text == tokenizer.decode(ids[:1], skip_special_tokens=False) + tokenizer.decode(ids[1:])


def test_completion_token_strings_with_echo_keep_special_tokens(server):
    tokenizer = AutoTokenizer.from_pretrained(DEMO)
    prompt = tokenizer.encode("<|im_start|>user\ndef f(x):<|im_end|>")
    out = server.client.completions.create(model=NAME, prompt=prompt, echo=True, temperature=0, max_tokens=4,
                                           logprobs=2, extra_body={"ignore_eos": True,
                                                                   "return_tokens_as_token_ids": False})
    c = out.choices[0]
    echoed = tokenizer.decode(prompt, skip_special_tokens=False)
    assert echoed.startswith("<|im_start|>user") and echoed.endswith("<|im_end|>") and c.text.startswith(echoed)
    lp = c.logprobs
    assert lp.tokens[:len(prompt)] == [tokenizer.decode([t]) for t in prompt]
    assert "".join(lp.tokens[:len(prompt)]) == echoed and lp.text_offset[len(prompt)] == len(echoed)
    for token, top in zip(lp.tokens[1:], lp.top_logprobs[1:]):
        assert next(iter(top)) == token and 2 <= len(top) <= 3  # the token first, then its 2 alternatives
    streamed = list(server.client.completions.create(
        model=NAME, prompt=prompt, echo=True, temperature=0, max_tokens=4, logprobs=2, stream=True,
        extra_body={"ignore_eos": True, "return_tokens_as_token_ids": False}))
    assert "".join(e.choices[0].text for e in streamed) == c.text
    assert [t for e in streamed if e.choices[0].logprobs for t in e.choices[0].logprobs.tokens] == lp.tokens


def test_chat_tokens_as_token_ids(server):
    tokenizer = AutoTokenizer.from_pretrained(DEMO)
    messages = [{"role": "system", "content": "You like to respond in only emojis, like \U0001f389"},
                {"role": "user", "content": "Please write some emojis: \U0001f431\U0001f436\U0001f389"}]
    for extra in ({}, {"return_tokens_as_token_ids": True}):
        out = server.client.chat.completions.create(model=NAME, messages=messages, temperature=0, max_tokens=8,
                                                    logprobs=True, top_logprobs=2, extra_body=extra)
        content = out.choices[0].logprobs.content
        ids = [int(c.token.removeprefix("token_id:")) for c in content]
        assert tokenizer.decode(ids, skip_special_tokens=True) == out.choices[0].message.content
        for c, tid in zip(content, ids):  # the token's bytes are its text's; its alternatives' their names'
            assert c.bytes == list(tokenizer.decode([tid]).encode("utf-8"))
            assert all(t.token.startswith("token_id:") and t.bytes == list(t.token.encode()) for t in c.top_logprobs)
    plain = server.client.chat.completions.create(model=NAME, messages=messages, temperature=0, max_tokens=8,
                                                  logprobs=True, extra_body={"return_tokens_as_token_ids": False})
    assert [c.token for c in plain.choices[0].logprobs.content] == [tokenizer.decode([t]) for t in ids]


def test_chat_echo_with_logprobs_scores_the_prompt(server):
    messages = [USER[0], {"role": "assistant", "content": "Insert x in a"}]
    body = {"echo": True, "continue_final_message": True, "add_generation_prompt": False, "return_token_ids": True}
    out = server.client.chat.completions.create(model=NAME, messages=messages, max_tokens=3, logprobs=True,
                                                top_logprobs=2, extra_body=body)
    assert out.choices[0].message.content.startswith("Insert x in a")
    prompt_ids, prompt_lps = out.model_extra["prompt_token_ids"], out.model_extra["prompt_logprobs"]
    assert len(prompt_lps) == len(prompt_ids) and prompt_lps[0] is None
    assert all(str(t) in e and len(e) <= 3 for t, e in zip(prompt_ids[1:], prompt_lps[1:]))
    plain = server.client.chat.completions.create(model=NAME, messages=messages, max_tokens=3, extra_body=body)
    assert plain.model_extra.get("prompt_logprobs") is None
