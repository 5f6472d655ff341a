"""vLLM's API extensions over HTTP, against a real server process: prompt logprobs (= transformers), echo with
logprobs, logit_bias / allowed_token_ids / bad_words, token ids in and out, cached tokens (with
--enable-prompt-tokens-details), streaming usage, the chat extras, the routes, the metrics under vLLM's names,
--root-path and --enable-request-id-headers."""

from __future__ import annotations

import httpx
import openai
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from minivllm import __version__
from tests.helpers.hf_reference import hf_logits
from tests.helpers.server_utils import running_server, stream_events

pytestmark = pytest.mark.server
NAME = "tiny"
ARGS = ["--served-model-name", NAME, "--device", "cpu", "--max-model-len", "256", "--num-kvcache-blocks", "128",
        "--dtype", "float32", "--enable-request-id-headers", "--root-path", "/api", "--trust-request-chat-template",
        "--enable-prompt-tokens-details"]
PROMPT = [5 + (7 * i) % 200 for i in range(40)]
MSGS = [{"role": "user", "content": "def add(a, b):"}, {"role": "assistant", "content": "    return a"}]


@pytest.fixture(scope="module")
def server(tiny_tied_model, tmp_path_factory):
    with running_server(tiny_tied_model, ARGS, tmp_path_factory.mktemp("vllm-api")) as srv:
        yield srv


def post(server, path: str, body: dict, status: int = 200) -> dict:
    r = httpx.post(server.url + path, json={"model": NAME, **body}, timeout=60)
    assert r.status_code == status, r.text
    return r.json()


def error_param(server, path: str, body: dict) -> str | None:
    err = post(server, path, body, 400)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    return err["param"]


def sse_events(server, path: str, body: dict) -> list[dict]:
    return stream_events(server.url, path, {"model": NAME, **body})


# ------------------------------------------------------------------ prompt logprobs
def test_prompt_logprobs_equal_transformers(server, tiny_tied_model):
    choice = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 1, "prompt_logprobs": 2})["choices"][0]
    want = torch.log_softmax(hf_logits(tiny_tied_model, PROMPT), dim=-1)  # [len, vocab], float32
    got = choice["prompt_logprobs"]
    assert len(got) == len(PROMPT) and got[0] is None
    for j in range(1, len(PROMPT)):
        entry = got[j][str(PROMPT[j])]
        assert abs(entry["logprob"] - want[j - 1, PROMPT[j]].item()) < 1e-4
        assert isinstance(entry["rank"], int) and entry["rank"] >= 1 and isinstance(entry["decoded_token"], str)
        top = torch.topk(want[j - 1], 2).indices.tolist()
        assert set(got[j]) <= {str(PROMPT[j]), *map(str, top)} and {str(t) for t in top} <= set(got[j])


def test_echo_with_logprobs_scores_the_prompt_then_the_completion(server):
    text = "def add(a, b):\n    return"
    out = server.client.completions.create(model=NAME, prompt=text, echo=True, logprobs=2, max_tokens=3,
                                           temperature=0, extra_body={"ignore_eos": True, "return_token_ids": True})
    c = out.choices[0]
    prompt_ids = c.model_extra["prompt_token_ids"]
    lp = c.logprobs
    assert c.text.startswith(text) and len(lp.tokens) == len(prompt_ids) + 3
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(isinstance(v, float) for v in lp.token_logprobs[1:])
    assert "".join(lp.tokens[:len(prompt_ids)]) == text and lp.text_offset[len(prompt_ids)] == len(text)
    plain = post(server, "/v1/completions", {"prompt": prompt_ids, "max_tokens": 1, "prompt_logprobs": 2})
    ref = plain["choices"][0]["prompt_logprobs"]
    for j in range(1, len(prompt_ids)):
        assert lp.token_logprobs[j] == pytest.approx(ref[j][str(prompt_ids[j])]["logprob"], abs=1e-5)


def test_chat_prompt_logprobs_are_top_level(server):
    out = post(server, "/v1/chat/completions", {"messages": MSGS[:1], "max_tokens": 1, "prompt_logprobs": 0,
                                                "return_token_ids": True})
    assert len(out["prompt_logprobs"]) == len(out["prompt_token_ids"]) and out["prompt_logprobs"][0] is None


# ------------------------------------------------------------------ logit edits
def test_logit_bias_of_100_makes_greedy_pick_the_token(server):
    out = server.client.completions.create(model=NAME, prompt="x = ", max_tokens=4, temperature=0,
                                           logit_bias={"42": 100}, extra_body={"ignore_eos": True,
                                                                               "return_token_ids": True})
    assert out.choices[0].model_extra["token_ids"] == [42] * 4
    chat = server.client.chat.completions.create(model=NAME, messages=MSGS[:1], max_tokens=3, temperature=0,
                                                 logit_bias={"7": 100}, extra_body={"return_token_ids": True,
                                                                                    "ignore_eos": True})
    assert chat.choices[0].model_extra["token_ids"] == [7] * 3


def test_allowed_token_ids_and_bad_words(server):
    out = post(server, "/v1/completions", {"prompt": "x", "max_tokens": 12, "temperature": 1.0, "seed": 3,
                                           "allowed_token_ids": [20, 21, 22], "return_token_ids": True,
                                           "ignore_eos": True})
    assert set(out["choices"][0]["token_ids"]) <= {20, 21, 22}
    plain = post(server, "/v1/completions", {"prompt": "def f(x):", "max_tokens": 6, "temperature": 0,
                                             "return_token_ids": True, "ignore_eos": True})["choices"][0]
    word = post(server, "/detokenize", {"tokens": plain["token_ids"][:1]})["prompt"]
    banned = post(server, "/v1/completions", {"prompt": "def f(x):", "max_tokens": 6, "temperature": 0,
                                              "return_token_ids": True, "ignore_eos": True, "bad_words": [word]})
    assert plain["token_ids"][0] not in banned["choices"][0]["token_ids"]


@pytest.mark.parametrize("body, param", [
    ({"logit_bias": {"abc": 1}}, "logit_bias"), ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"logit_bias": {"99999": 1}}, "logit_bias"), ({"logit_bias": {"5": "hot"}}, "logit_bias.5"),
    ({"allowed_token_ids": []}, "allowed_token_ids"), ({"allowed_token_ids": [1, 99999]}, "allowed_token_ids"),
    ({"bad_words": [""]}, "bad_words"), ({"prompt_logprobs": 21}, "prompt_logprobs"),
    ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"), ({"stream_options": {"include_usage": True}},
                                                                "stream_options"),
])
def test_bad_extensions_get_400_naming_the_field(server, body, param):
    assert error_param(server, "/v1/completions", {"prompt": "x", **body}) == param


# ------------------------------------------------------------------ token ids in and out
def test_token_ids_out_and_tokens_as_ids(server):
    out = post(server, "/v1/completions", {"prompt": PROMPT[:10], "max_tokens": 4, "temperature": 0, "logprobs": 1,
                                           "return_token_ids": True, "return_tokens_as_token_ids": True,
                                           "ignore_eos": True})
    c = out["choices"][0]
    assert c["prompt_token_ids"] == PROMPT[:10] and len(c["token_ids"]) == 4
    assert c["logprobs"]["tokens"] == [f"token_id:{t}" for t in c["token_ids"]]
    chat = post(server, "/v1/chat/completions", {"messages": MSGS[:1], "max_tokens": 2, "logprobs": True,
                                                 "return_token_ids": True, "return_tokens_as_token_ids": True,
                                                 "ignore_eos": True})
    tokens = [e["token"] for e in chat["choices"][0]["logprobs"]["content"]]
    assert tokens == [f"token_id:{t}" for t in chat["choices"][0]["token_ids"]]
    ids = post(server, "/tokenize", {"messages": MSGS[:1]})["tokens"]
    assert chat["prompt_token_ids"] == ids and chat["usage"]["prompt_tokens"] == len(ids)


def test_truncate_prompt_tokens_keeps_the_last_ones(server):
    out = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 1, "truncate_prompt_tokens": 5,
                                           "return_token_ids": True})
    assert out["choices"][0]["prompt_token_ids"] == PROMPT[-5:] and out["usage"]["prompt_tokens"] == 5


def test_cached_tokens_come_from_the_prefix_cache(server):
    """With --enable-prompt-tokens-details, as vLLM: the prefix-cache hits, 0 when there are none (in the final
    usage only)."""
    prompt = [300 + i for i in range(70)]
    first = post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 1})["usage"]
    second = post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 1})["usage"]
    assert first["prompt_tokens_details"] == {"cached_tokens": 0}
    assert second["prompt_tokens_details"] == {"cached_tokens": 64}  # four full blocks of 16
    *chunks, last = sse_events(server, "/v1/completions", {"prompt": prompt, "max_tokens": 2,
                                                           "stream_options": {"include_usage": True,
                                                                              "continuous_usage_stats": True}})
    assert last["usage"]["prompt_tokens_details"] == {"cached_tokens": 64}  # in the last usage only
    assert all(e["usage"]["prompt_tokens_details"] is None for e in chunks)
    chat = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "def add(a, b): " * 12}],
                                                 "max_tokens": 1})
    again = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "def add(a, b): " * 12}],
                                                  "max_tokens": 1})
    assert chat["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


# ------------------------------------------------------------------ streaming usage
@pytest.mark.parametrize("path, body", [("/v1/completions", {"prompt": "def f(x):", "n": 2}),
                                        ("/v1/chat/completions", {"messages": MSGS[:1]})])
def test_streamed_usage_adds_up(server, path, body):
    body = {**body, "max_tokens": 7, "temperature": 0.8, "seed": 1, "ignore_eos": True, "return_token_ids": True}
    whole = post(server, path, body)
    events = sse_events(server, path, {**body, "stream_options": {"include_usage": True,
                                                                 "continuous_usage_stats": True}})
    *chunks, last = events
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"]
    assert last["usage"]["prompt_tokens"] == whole["usage"]["prompt_tokens"]
    streamed = 0
    for e in chunks:
        streamed += sum(len(c.get("token_ids") or []) for c in e["choices"])
        assert e["usage"]["completion_tokens"] == streamed
        assert e["usage"]["total_tokens"] == e["usage"]["prompt_tokens"] + streamed
    assert streamed == last["usage"]["completion_tokens"] == 7 * body.get("n", 1)
    plain = sse_events(server, path, {**body, "stream_options": {"include_usage": True}})
    assert all(e["usage"] is None for e in plain[:-1]) and plain[-1]["usage"]["completion_tokens"] == streamed


# ------------------------------------------------------------------ chat extras
def test_continue_final_message_and_echo(server):
    body = {"messages": MSGS, "max_tokens": 4, "temperature": 0, "ignore_eos": True, "return_token_ids": True,
            "add_generation_prompt": False, "continue_final_message": True, "echo": True}
    out = post(server, "/v1/chat/completions", body)
    rendered = post(server, "/detokenize", {"tokens": out["prompt_token_ids"]})["prompt"]
    assert rendered.endswith("<|im_start|>assistant\n    return a")  # continued: not closed by <|im_end|>
    ids = post(server, "/tokenize", {"messages": MSGS, "add_generation_prompt": False,
                                     "continue_final_message": True})["tokens"]
    assert ids == out["prompt_token_ids"]
    assert out["choices"][0]["message"]["content"].startswith("    return a")
    events = sse_events(server, "/v1/chat/completions", body)
    text = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
    assert text == out["choices"][0]["message"]["content"]
    assert error_param(server, "/v1/chat/completions", {**body, "add_generation_prompt": True}) == \
        "continue_final_message"
    assert error_param(server, "/v1/chat/completions", {**body, "messages": MSGS[:1]}) == "continue_final_message"
    assert error_param(server, "/v1/chat/completions", {**body, "chat_template_kwargs": {"tokenize": True}}) == \
        "chat_template_kwargs"


def test_chat_template_and_its_kwargs_per_request(server):
    template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                "{% if enable_thinking %}<think>{% endif %}")
    body = {"messages": MSGS[:1], "max_tokens": 1, "return_token_ids": True, "chat_template": template}
    off = post(server, "/v1/chat/completions", body)["prompt_token_ids"]
    on = post(server, "/v1/chat/completions", {**body, "chat_template_kwargs": {"enable_thinking": True}})
    assert post(server, "/detokenize", {"tokens": off})["prompt"] == "user: def add(a, b):\n"
    assert post(server, "/detokenize", {"tokens": on["prompt_token_ids"]})["prompt"] == "user: def add(a, b):\n<think>"
    assert error_param(server, "/v1/chat/completions", {**body, "chat_template": "{% if %}"}) == "chat_template"


# ------------------------------------------------------------------ routes, metrics, server options
def test_routes(server):
    assert httpx.get(server.url + "/version").json() == {"version": __version__}
    (card,) = httpx.get(server.url + "/v1/models").json()["data"]
    assert card["id"] == NAME and card["max_model_len"] == 256
    # it shows the chat template and the tokenizer's settings: only with --enable-tokenizer-info-endpoint (vLLM's)
    assert httpx.get(server.url + "/tokenizer_info").status_code == 404
    ids = post(server, "/tokenize", {"prompt": "def f(x):"})
    assert post(server, "/detokenize", {"tokens": ids["tokens"]}) == {"prompt": "def f(x):"}


VLLM_METRICS = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:time_to_first_token_seconds",
                "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds", "vllm:request_success",
                "vllm:prefix_cache_queries", "vllm:prefix_cache_hits"]


def test_metrics_under_vllms_names_move(server):
    def scrape():
        families = {f.name: f for f in text_string_to_metric_families(httpx.get(server.url + "/metrics").text)}
        return families, {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values()
                          for s in f.samples}

    families, before = scrape()
    assert set(VLLM_METRICS) <= set(families)
    for name in VLLM_METRICS:
        assert all(s.labels.get("model_name") == NAME for s in families[name].samples), name
    # the KV cache's settings for routers that score prefix hits themselves (llm-d's endpoint picker)
    (info,) = families["vllm:cache_config_info"].samples
    assert info.value == 1 and info.labels["block_size"] == "16" and int(info.labels["num_gpu_blocks"]) > 0
    post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 5, "ignore_eos": True})
    server.wait_idle()
    _, after = scrape()
    moved = {name for (name, _), v in after.items() if v != before.get((name, _))}
    for name in ["vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
                 "vllm:time_to_first_token_seconds_count", "vllm:inter_token_latency_seconds_count",
                 "vllm:e2e_request_latency_seconds_count", "vllm:prefix_cache_queries_total"]:
        assert name in moved, name


def test_request_id_headers_and_root_path(server):
    r = httpx.get(server.url + "/v1/models", headers={"X-Request-Id": "abc-123"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "abc-123"
    assert len(httpx.get(server.url + "/health").headers["x-request-id"]) == 32  # a new one
    doc = httpx.get(server.url + "/openapi.json").json()
    assert doc["servers"] == [{"url": "/api"}]
    # the routes answer under the root path too (a proxy that passes the prefix on), as vLLM's
    assert httpx.get(server.url + "/api/v1/models").json()["data"][0]["id"] == NAME
    r = server.client.with_options(base_url=server.url + "/api/v1").completions.create(model=NAME, prompt="x",
                                                                                        max_tokens=2)
    assert r.choices[0].text is not None
    assert httpx.get(server.url + "/apiv1/models").status_code == 404  # a prefix of a path segment is not it
    with pytest.raises(openai.BadRequestError):
        server.client.completions.create(model=NAME, prompt="x", extra_body={"logit_bias": {"x": 1}})


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_chat_top_logprobs_list_the_generated_token_first(server, stream):
    """vLLM 0.33's order: the generated token, then the most likely others, ``top_logprobs`` in all; a token
    sampled from outside the top k still comes first (and the k-th most likely is left out)."""
    body = {"messages": MSGS[:1], "max_tokens": 24, "temperature": 3.0, "seed": 1, "logprobs": True,
            "top_logprobs": 3, "return_tokens_as_token_ids": True}
    if stream:
        content = [e for ev in sse_events(server, "/v1/chat/completions", body) for c in ev["choices"]
                   for e in (c.get("logprobs") or {}).get("content") or []]
    else:
        content = post(server, "/v1/chat/completions", body)["choices"][0]["logprobs"]["content"]
    outside = 0
    for pos in content:
        tops = pos["top_logprobs"]
        assert len(tops) == 3 and tops[0]["token"] == pos["token"], pos
        rest = [t["logprob"] for t in tops[1:]]
        assert rest == sorted(rest, reverse=True), pos
        outside += pos["logprob"] < rest[-1]  # sampled from below two others: listed first all the same
    assert outside > 0, "temperature 3 should sample some unlikely token"
